"""Lesson 20, an HTTP server in front of the engine: its deterministic tables recomputed.

The lesson runs real `llmengine serve` processes; these tests recompute what its committed
tables claim through an in-process server on the same model: the completions equal the
offline engine's, a greedy stream's chunks are the ones in the table, and the lesson's burst
over HTTP, on its cramped pool, returns the offline engine's texts.
"""

from __future__ import annotations

import ast

import pytest
from report_tables import REPORTS, read_report_table
from server_helpers import MODEL_NAME, served

import llmengine
from llmengine.bench.http_client import run_over_http
from llmengine.bench.workloads import poisson_arrivals, uniform_burst
from llmengine.lessons.live_server import live_server, read_metrics

BLOCK_SIZE = 16


def offline(model: llmengine.Llama, tokenizer, prompts: list[list[int]], params) -> list[str]:
    engine = llmengine.Engine(model, num_blocks=256, block_size=BLOCK_SIZE, num_slots=8)
    outputs = engine.generate(prompts, params)
    return [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in outputs]


def test_http_vs_offline_table_is_what_server_and_engine_say(model, tokenizer) -> None:
    rows = read_report_table("http-vs-offline")
    assert len(rows) == 4
    prompts = [ast.literal_eval(row["prompt"]) for row in rows]
    greedy = llmengine.SamplingParams(max_tokens=32, temperature=0.0)
    texts = offline(model, tokenizer, [tokenizer.encode(p) for p in prompts], greedy)
    engine = llmengine.Engine(model, num_blocks=64, block_size=BLOCK_SIZE, tokenizer=tokenizer)
    with served(engine, tokenizer) as server:
        client = server.openai()
        for row, prompt, text in zip(rows, prompts, texts, strict=True):
            assert ast.literal_eval(row["text"]) == text
            answer = client.completions.create(
                model=MODEL_NAME, prompt=prompt, max_tokens=32, temperature=0
            )
            assert answer.choices[0].text == text
            assert int(row["tokens"]) == answer.usage.completion_tokens == 32
            assert row["finish"] == answer.choices[0].finish_reason == "length"
            assert row["completion = offline"] == row["stream joined = offline"] == "yes"


def test_stream_chunks_table_is_one_greedy_stream(model, tokenizer) -> None:
    rows = read_report_table("http-stream-chunks")
    engine = llmengine.Engine(model, num_blocks=64, block_size=BLOCK_SIZE, tokenizer=tokenizer)
    with served(engine, tokenizer) as server:
        stream = server.openai().completions.create(
            model=MODEL_NAME, prompt="ROMEO:", max_tokens=16, temperature=0, stream=True
        )
        chunks = [chunk.choices[0].text for chunk in stream if chunk.choices]
    assert [ast.literal_eval(row["text"]) for row in rows] == chunks
    assert [int(row["chunk"]) for row in rows] == list(range(len(chunks)))
    greedy = llmengine.SamplingParams(max_tokens=16, temperature=0.0)
    assert "".join(chunks) == offline(model, tokenizer, [tokenizer.encode("ROMEO:")], greedy)[0]


def test_burst_texts_table_says_every_run_matched(model, tokenizer) -> None:
    rows = read_report_table("http-burst-texts")
    assert len(rows) == 10
    assert all(row["requests"] == row["completed"] == "24" for row in rows)
    assert all(row["same text as offline"] == "yes" for row in rows)


@pytest.mark.parametrize("options", [(), ("--policy", "reserve")], ids=["incremental", "reserve"])
def test_lesson_burst_on_a_cramped_live_server_gets_offline_texts(model, tokenizer, options):
    burst = uniform_burst(24, 32, 48, vocab_size=1000, seed=20)
    expected = offline(model, tokenizer, [list(s.prompt_token_ids) for s in burst], burst[0].params)
    command = ["--served-model-name", MODEL_NAME, "--num-blocks", "24", "--max-num-seqs", "8"]
    with live_server([*command, *options]) as server:
        run = run_over_http(server.api, MODEL_NAME, poisson_arrivals(burst, 32.0, seed=20))
        metrics = read_metrics(server.url)
    assert [record.error for record in run.records] == [None] * 24
    assert [record.text for record in run.records] == expected
    assert [record.output_tokens for record in run.records] == [48] * 24
    assert metrics["llmengine_kv_blocks_free"] == metrics["llmengine_kv_blocks_total"] == 24
    if options:  # reserve admits a request only when its worst case fits: never a preemption
        assert metrics["llmengine_preemptions_total"] == 0
    assert server.exit_code == [0]


def test_hostile_input_table_is_what_the_server_answers(model, tokenizer) -> None:
    """The lesson's abuse table, recomputed against an in-process server of the same model
    and name, row for row; and every refusal is a 4xx with OpenAI's error object."""
    from llmengine.lessons.artifacts import markdown_table
    from llmengine.lessons.hostile import answers, hostile_requests
    from llmengine.server import create_app, serve_in_thread

    name = "tiny-shakespeare"  # the lesson's --served-model-name
    engine = llmengine.Engine(model, num_blocks=256, block_size=BLOCK_SIZE, num_slots=8)
    with serve_in_thread(create_app(engine, tokenizer, served_model_name=name)) as url:
        rows = answers(url, hostile_requests(name))
    assert [row[1] for row in rows[:-1]] == [400, 413, *[400] * 8, 404, 400]
    assert rows[-1][1] == 200  # echo with max_tokens 0 is a normal request
    table = markdown_table(rows, ["request", "status", "field", "message"])
    assert table.strip() == (REPORTS / "http-hostile-input.md").read_text().strip()

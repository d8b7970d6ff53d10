"""`llmengine bench --url` against our own server on the embedded model.

The texts the benchmark collects for a greedy burst of token-id prompts must be the offline
engine's, whether the pool is roomy or so cramped that requests are preempted; every request
runs its whole budget (the usage says so); and a server whose queue is full answers 429s
that are counted as failures, not raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server_helpers import MODEL_NAME, SlowEngine, holds_no_records, served, wait_until

import llmengine
from llmengine.bench.http_client import HttpRun, run_over_http
from llmengine.bench.serving_report import run_summary
from llmengine.bench.workloads import RequestSpec, uniform_burst

REQUESTS, PROMPT_LEN, MAX_TOKENS, BLOCK_SIZE = 4, 6, 8, 4
TIMEOUT = 30.0


def workload(n: int = REQUESTS) -> list[RequestSpec]:
    return uniform_burst(n, PROMPT_LEN, MAX_TOKENS, vocab_size=1000)


def offline_texts(
    model: llmengine.Llama, tokenizer: Any, specs: Sequence[RequestSpec]
) -> list[str]:
    """What a roomy offline engine generates for `specs`, decoded as the server decodes."""
    engine = llmengine.Engine(model, num_blocks=256, block_size=16)
    prompts = [spec.prompt_token_ids for spec in specs]
    outputs = engine.generate(prompts, [spec.params for spec in specs])
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in outputs]


def bench(
    engine: llmengine.Engine, tokenizer: Any, specs: Sequence[RequestSpec], **options: Any
) -> tuple[HttpRun, dict[str, float]]:
    """`specs` streamed from `engine` behind a real server; the run and the server's metrics."""
    with served(engine, tokenizer, **options) as server:
        run = run_over_http(f"{server.url}/v1", MODEL_NAME, specs, timeout=TIMEOUT)
        assert wait_until(lambda: holds_no_records(engine))
        return run, server.metrics()


def test_a_greedy_burst_streams_the_offline_texts(model: llmengine.Llama, tokenizer: Any) -> None:
    specs = workload()
    engine = llmengine.Engine(model, num_blocks=64, block_size=BLOCK_SIZE, num_slots=8)
    run, _ = bench(engine, tokenizer, specs)
    assert all(record.ok for record in run.records), [record.error for record in run.records]
    assert [record.text for record in run.records] == offline_texts(model, tokenizer, specs)
    assert [record.output_tokens for record in run.records] == [MAX_TOKENS] * REQUESTS
    assert all(len(record.itl) < MAX_TOKENS for record in run.records)
    summary = run_summary(run)
    assert (summary["completed"], summary["failed"]) == (REQUESTS, 0)
    assert summary["output_tokens"] == REQUESTS * MAX_TOKENS
    assert summary["input_tokens"] == REQUESTS * PROMPT_LEN


def test_a_cramped_pool_preempts_yet_completes_the_same_texts(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    """Each request ends at 14 tokens, 4 blocks; 6 blocks hold one and a half of them."""
    specs = workload()
    engine = llmengine.Engine(model, num_blocks=6, block_size=BLOCK_SIZE, num_slots=REQUESTS)
    run, metrics = bench(engine, tokenizer, specs)
    assert metrics["llmengine_preemptions_total"] > 0
    assert all(record.ok for record in run.records), [record.error for record in run.records]
    assert [record.text for record in run.records] == offline_texts(model, tokenizer, specs)
    assert [record.output_tokens for record in run.records] == [MAX_TOKENS] * REQUESTS


def test_a_full_queue_gives_counted_429s(model: llmengine.Llama, tokenizer: Any) -> None:
    """One slot and room for one waiting request: of six arriving together, some are refused."""
    specs = workload(6)
    engine = SlowEngine(model, num_blocks=16, block_size=BLOCK_SIZE, num_slots=1)
    run, _ = bench(engine, tokenizer, specs, max_waiting=1)
    summary = run_summary(run)
    assert summary["completed"] + summary["failed"] == 6
    assert summary["completed"] >= 1 and summary["failed"] >= 1
    assert all(error.startswith("HTTP 429: ") for error in summary["errors"])
    expected = offline_texts(model, tokenizer, specs)
    for record, text in zip(run.records, expected, strict=True):
        assert record.text == text if record.ok else record.error.startswith("HTTP 429: ")

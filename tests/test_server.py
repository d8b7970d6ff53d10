"""The OpenAI-compatible server on the embedded model: completions and chat, streamed or not,
n, stop strings, seeds, multi-prompt order, usage, models, health, metrics, no leaked records.

One real uvicorn server for the module (a free local port, stopped at the end); every text it
returns is checked against the offline engine on the same prompts and parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_NAME, Served, holds_no_records, served, sse_payloads, wait_until

import llmengine
from llmengine.sampling import SamplingParams
from llmengine.server.chat import plain_prompt

PROMPTS = ["ROMEO:", "To be, or not", "KING HENRY:\nWhat"]
NUM_BLOCKS, BLOCK_SIZE = 64, 4


@pytest.fixture(scope="module")
def server(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, num_slots=8)
    with served(engine, tokenizer) as running:
        yield running
    assert holds_no_records(engine)


def offline(model: llmengine.Llama, tokenizer: Any, prompts: list[str], **params: Any) -> list[str]:
    """`Engine.generate_text` on a fresh engine: what the server must return."""
    engine = llmengine.Engine(model, num_blocks=256, block_size=16, tokenizer=tokenizer)
    return engine.generate_text(prompts, SamplingParams(**params))


def stream_completion(server: Served, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_payloads(response.iter_lines())


def test_a_greedy_completion_is_the_offline_engines_text(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    client = server.openai()
    for prompt in PROMPTS:
        result = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0
        )
        (expected,) = offline(model, tokenizer, [prompt], max_tokens=12)
        assert result.choices[0].text == expected
        assert result.object == "text_completion" and result.model == MODEL_NAME
        prompt_tokens = len(tokenizer.encode(prompt))
        assert result.usage.prompt_tokens == prompt_tokens
        assert result.usage.completion_tokens == 12
        assert result.usage.total_tokens == prompt_tokens + 12
        assert result.choices[0].finish_reason == "length"
    assert wait_until(lambda: holds_no_records(server.engine))


def test_a_streamed_completion_joins_into_the_same_text(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    (expected,) = offline(model, tokenizer, [PROMPTS[1]], max_tokens=15)
    client = server.openai()
    chunks = list(
        client.completions.create(
            model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=15, temperature=0, stream=True
        )
    )
    assert "".join(chunk.choices[0].text for chunk in chunks) == expected
    assert len(chunks) > 3 and all(chunk.object == "text_completion" for chunk in chunks)
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == "length"
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks[:-1])


def test_include_usage_adds_a_last_chunk_with_only_the_usage(
    server: Served, tokenizer: Any
) -> None:
    body = {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0}
    payloads = stream_completion(server, {**body, "stream_options": {"include_usage": True}})
    *chunks, last = payloads
    assert last["choices"] == []
    prompt_tokens = len(tokenizer.encode(PROMPTS[0]))
    assert last["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 6,
        "total_tokens": prompt_tokens + 6,
        "prompt_tokens_details": {"cached_tokens": 0},  # no prefix caching on this server
    }
    assert all(chunk["usage"] is None and len(chunk["choices"]) == 1 for chunk in chunks)
    assert all("usage" not in chunk for chunk in stream_completion(server, body))


def test_prompts_as_text_ids_or_lists_keep_openais_choice_order(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    expected = offline(model, tokenizer, PROMPTS[:2], max_tokens=8)
    ids = [tokenizer.encode(prompt) for prompt in PROMPTS[:2]]
    for prompt in (PROMPTS[:2], ids):
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "n": 2}
        result = server.post("/v1/completions", body).json()
        assert [c["index"] for c in result["choices"]] == [0, 1, 2, 3]
        texts = [c["text"] for c in result["choices"]]
        assert texts == [expected[0], expected[0], expected[1], expected[1]]
        assert result["usage"]["prompt_tokens"] == sum(map(len, ids))
        assert result["usage"]["completion_tokens"] == 4 * 8
        streamed = stream_completion(server, body)
        joined = ["", "", "", ""]
        for chunk in streamed:
            joined[chunk["choices"][0]["index"]] += chunk["choices"][0]["text"]
        assert joined == texts
    single = server.post("/v1/completions", {"prompt": ids[1], "max_tokens": 8, "temperature": 0})
    assert single.json()["choices"][0]["text"] == expected[1]


def test_seeded_samples_are_reproducible_and_sample_i_uses_seed_plus_i(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    body = {"prompt": PROMPTS[2], "max_tokens": 10, "temperature": 1.0, "seed": 1234, "n": 3}
    first = server.post("/v1/completions", body).json()["choices"]
    again = server.post("/v1/completions", body).json()["choices"]
    texts = [choice["text"] for choice in first]
    assert texts == [choice["text"] for choice in again]
    assert len(set(texts)) > 1  # n independent samples, not one sample three times
    for i, text in enumerate(texts):
        (expected,) = offline(
            model, tokenizer, [PROMPTS[2]], max_tokens=10, temperature=1.0, seed=1234 + i
        )
        assert text == expected


def stop_spanning_tokens(tokenizer: Any, tokens: list[int]) -> str:
    """A piece of the tokens' text from the last character of one token's text to the first
    of the token after next: a stop string that no single token holds."""
    pieces = [tokenizer.decode(tokens[:i], skip_special_tokens=True) for i in range(len(tokens))]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    for i in range(2, len(tokens) - 2):
        start, end = len(pieces[i]) - 1, len(pieces[i + 1]) + 1
        candidate = text[start:end]
        if len(pieces[i + 1]) > len(pieces[i]) and text.find(candidate) == start:
            return candidate
    raise AssertionError(f"no stop string spanning tokens in {text!r}")


def test_a_stop_string_spanning_tokens_ends_the_text_before_it(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    engine = llmengine.Engine(model, num_blocks=64, block_size=16)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    (tokens,) = engine.generate([tokenizer.encode(PROMPTS[0])], params)
    full = tokenizer.decode(tokens, skip_special_tokens=True)
    stop = stop_spanning_tokens(tokenizer, tokens)
    expected = full[: full.index(stop)]
    body = {"prompt": PROMPTS[0], "max_tokens": 30, "temperature": 0, "ignore_eos": True}
    result = server.post("/v1/completions", {**body, "stop": [stop, "never seen"]}).json()
    assert result["choices"][0] == {
        "index": 0,
        "text": expected,
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert result["usage"]["completion_tokens"] < 30
    chunks = stream_completion(server, {**body, "stop": stop})
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    unmatched = server.post("/v1/completions", {**body, "stop": "never seen"}).json()
    assert unmatched["choices"][0]["text"] == full
    assert unmatched["choices"][0]["finish_reason"] == "length"
    assert wait_until(lambda: holds_no_records(server.engine))


def test_the_earliest_of_several_stop_strings_wins(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    (full,) = offline(model, tokenizer, [PROMPTS[1]], max_tokens=20, ignore_eos=True)
    early, late = full[4:7], full[10:14]
    assert full.index(early) < full.index(late)
    body = {"prompt": PROMPTS[1], "max_tokens": 20, "temperature": 0, "ignore_eos": True}
    for stream in (False, True):
        request = {**body, "stop": [late, early]}
        if stream:
            text = "".join(c["choices"][0]["text"] for c in stream_completion(server, request))
        else:
            text = server.post("/v1/completions", request).json()["choices"][0]["text"]
        assert text == full[: full.index(early)]


def test_stop_token_ids_end_the_choice_with_stop(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    engine = llmengine.Engine(model, num_blocks=64, block_size=16)
    (tokens,) = engine.generate([tokenizer.encode(PROMPTS[0])], SamplingParams(max_tokens=10))
    stop = tokens[4]
    body = {"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0, "stop_token_ids": [stop]}
    choice = server.post("/v1/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    # As in vLLM, the stop token's text is left out unless include_stop_str_in_output.
    assert choice["text"] == tokenizer.decode(tokens[: tokens.index(stop)])
    body["include_stop_str_in_output"] = True
    kept = server.post("/v1/completions", body).json()["choices"][0]
    assert kept["text"] == tokenizer.decode(tokens[: tokens.index(stop) + 1])
    assert kept["finish_reason"] == "stop"


def test_chat_uses_the_plain_template_and_streams_the_same_text(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    messages = [
        {"role": "system", "content": "Speak in verse."},
        {"role": "user", "content": "Who goes there?"},
    ]
    prompt = plain_prompt([(m["role"], m["content"]) for m in messages])
    (expected,) = offline(model, tokenizer, [prompt], max_tokens=12)
    client = server.openai()
    result = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=12, temperature=0
    )
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == expected
    assert result.usage.prompt_tokens == len(tokenizer.encode(prompt))
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0, stream=True
        )
    )
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.choices[0].delta.role is None for chunk in chunks[1:])
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_without_a_budget_generates_as_many_tokens_as_fit(
    server: Served, tokenizer: Any
) -> None:
    body = {
        "messages": [{"role": "user", "content": "Speak."}],
        "temperature": 0,
        "ignore_eos": True,
    }
    result = server.post("/v1/chat/completions", body).json()
    fit = min(model_positions(server), NUM_BLOCKS * BLOCK_SIZE)
    assert result["usage"]["total_tokens"] == fit
    assert result["choices"][0]["finish_reason"] == "length"


def model_positions(server: Served) -> int:
    (card,) = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    return card["max_model_len"]


def test_models_and_health(server: Served, model: llmengine.Llama) -> None:
    listed = server.openai().models.list()
    assert [card.id for card in listed.data] == [MODEL_NAME]
    assert model_positions(server) == model.config.max_position_embeddings
    health = httpx.get(f"{server.url}/health", timeout=30)
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_metrics_count_the_tokens_and_show_the_pool(server: Served, tokenizer: Any) -> None:
    before = server.metrics()
    names = ("running", "waiting")
    assert all(f"llmengine_requests_{name}" in before for name in names)
    assert before["llmengine_kv_blocks_total"] == NUM_BLOCKS
    body = {"prompt": PROMPTS, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    server.post("/v1/completions", body)
    assert wait_until(lambda: server.metrics()["llmengine_kv_blocks_free"] == NUM_BLOCKS)
    after = server.metrics()
    prompt_tokens = sum(len(tokenizer.encode(prompt)) for prompt in PROMPTS)
    grew = {
        name: after[name] - before[name]
        for name in (
            "llmengine_prompt_tokens_total",
            "llmengine_generation_tokens_total",
            "llmengine_time_to_first_token_seconds_count",
            "llmengine_inter_token_latency_seconds_count",
            "llmengine_preemptions_total",
        )
    }
    assert grew == {
        "llmengine_prompt_tokens_total": prompt_tokens,
        "llmengine_generation_tokens_total": 3 * 5,
        "llmengine_time_to_first_token_seconds_count": 3,
        "llmengine_inter_token_latency_seconds_count": 3 * 4,
        "llmengine_preemptions_total": 0,
    }
    assert after["llmengine_requests_running"] == after["llmengine_requests_waiting"] == 0


def test_chat_with_n_streams_every_choice_with_its_role_first(server: Served) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Speak."}],
        "max_completion_tokens": 6,
        "temperature": 0,
        "n": 2,
    }
    whole = server.post("/v1/chat/completions", body).json()
    texts = [choice["message"]["content"] for choice in whole["choices"]]
    assert len(texts) == 2 and texts[0] == texts[1]  # greedy: both samples agree
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=30
    ) as response:
        chunks = sse_payloads(response.iter_lines())
    roles = [c["choices"][0]["delta"].get("role") for c in chunks]
    assert roles[:2] == ["assistant", "assistant"] and not any(roles[2:])
    joined = ["", ""]
    for chunk in chunks:
        (choice,) = chunk["choices"]
        joined[choice["index"]] += choice["delta"].get("content", "")
    assert joined == texts

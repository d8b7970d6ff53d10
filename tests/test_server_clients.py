"""What other people's tools send: lm-eval's loglikelihood calls (echo with prompt logprobs,
max_tokens 1 and 0), guidellm's streamed requests with usage, the openai client's
`models.retrieve`; and what a prefix cache served, in `usage`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from server_helpers import MODEL_NAME, Served, served, sse_payloads
from test_server_errors import assert_error

import llmengine

PROMPT_TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"


@pytest.fixture(scope="module")
def server(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(
        model, num_blocks=64, block_size=16, num_slots=4, enable_prefix_caching=True
    )
    with served(engine, tokenizer) as running:
        yield running


def forward_logprobs(model: llmengine.Llama, ids: list[int]) -> list[float]:
    """Each prompt token's logprob after the first, from one plain forward."""
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(torch.tensor([ids]))[0].float(), dim=-1)
    return [float(logprobs[p - 1, ids[p]]) for p in range(1, len(ids))]


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_lm_eval_loglikelihood_request(server: Served, model, tokenizer, max_tokens) -> None:
    """lm-eval's shape: token ids, echo, logprobs 1, temperature 0. Asked twice: the second
    time the prompt's blocks are in the prefix cache, and the scores must not change."""
    ids = list(tokenizer.encode(PROMPT_TEXT))
    body = {"model": MODEL_NAME, "prompt": [ids], "max_tokens": max_tokens, "logprobs": 1}
    body |= {"echo": True, "temperature": 0, "seed": 1234}
    expected = forward_logprobs(model, ids)
    for _ in range(2):
        response = server.post("/v1/completions", body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        logprobs = choice["logprobs"]
        assert len(logprobs["tokens"]) == len(ids) + max_tokens
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        got = logprobs["token_logprobs"][1 : len(ids)]
        assert got == pytest.approx(expected, abs=1e-4)
        assert choice["text"].startswith(tokenizer.decode(ids, skip_special_tokens=True))
        offsets = logprobs["text_offset"]
        assert offsets == sorted(offsets) and offsets[-1] <= len(choice["text"])
        usage = response.json()["usage"]
        assert usage["completion_tokens"] == max_tokens
        # A prompt scored in full is computed in full: the cache served none of it.
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_vllm_prompt_logprobs_without_echo(server: Served, model, tokenizer) -> None:
    ids = list(tokenizer.encode(PROMPT_TEXT))
    body = {"model": MODEL_NAME, "prompt": ids, "max_tokens": 2, "prompt_logprobs": 2}
    choice = server.post("/v1/completions", {**body, "temperature": 0}).json()["choices"][0]
    scores = choice["prompt_logprobs"]
    assert scores[0] is None and len(scores) == len(ids)
    for position, entry in enumerate(scores[1:], start=1):
        assert str(ids[position]) in entry and len(entry) <= 3  # the token and its top 2
    got = [scores[p][str(ids[p])]["logprob"] for p in range(1, len(ids))]
    assert got == pytest.approx(forward_logprobs(model, ids), abs=1e-4)
    assert not choice["text"].startswith("ROMEO")  # no echo asked for


def test_echo_without_logprobs_streams_the_prompt_first(server: Served) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT_TEXT, "max_tokens": 3, "echo": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}) as r:
        payloads = sse_payloads(r.iter_lines())
    assert payloads[0]["choices"][0]["text"] == PROMPT_TEXT


def test_max_tokens_0_needs_echo(server: Served) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT_TEXT, "max_tokens": 0}
    assert_error(server.post("/v1/completions", body), 400, "max_tokens")


def test_cached_tokens_count_what_the_prefix_cache_served(server: Served, tokenizer) -> None:
    prompt = "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n" * 3  # full blocks, new
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    first = server.post("/v1/completions", body).json()["usage"]
    second = server.post("/v1/completions", body).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    full_blocks = (len(tokenizer.encode(prompt)) - 1) // 16
    assert second["prompt_tokens_details"]["cached_tokens"] == 16 * full_blocks > 0


def test_guidellm_streamed_requests_with_usage(server: Served) -> None:
    """guidellm streams both endpoints with include_usage and a fixed output length."""
    common = {"model": MODEL_NAME, "max_tokens": 8, "ignore_eos": True, "stream": True}
    common |= {"stream_options": {"include_usage": True}}
    for path, body in (
        ("/v1/completions", {**common, "prompt": PROMPT_TEXT}),
        ("/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "Hi"}]}),
    ):
        with httpx.stream("POST", f"{server.url}{path}", json=body) as response:
            payloads = sse_payloads(response.iter_lines())
        assert payloads[-1]["usage"]["completion_tokens"] == 8


def test_models_retrieve_by_id(server: Served) -> None:
    client = server.openai()
    model = client.models.retrieve(MODEL_NAME)
    assert model.id == MODEL_NAME and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_cors_is_off_unless_origins_are_allowed(model, tokenizer, server: Served) -> None:
    preflight = {
        "origin": "https://example.org",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    closed = httpx.options(f"{server.url}/v1/completions", headers=preflight)
    assert "access-control-allow-origin" not in closed.headers
    engine = llmengine.Engine(model, num_blocks=16, block_size=16)
    options = {"api_key": "secret", "allowed_origins": ["https://example.org"]}
    with served(engine, tokenizer, **options) as running:
        url = f"{running.url}/v1/completions"
        allowed = httpx.options(url, headers=preflight)  # no key on a preflight: not a 401
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://example.org"
        other = httpx.options(url, headers={**preflight, "origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        body = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 2}
        headers = {"origin": "https://example.org", "authorization": "Bearer secret"}
        answer = httpx.post(url, json=body, headers=headers)
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == "https://example.org"

"""guidellm 0.8.1's requests, exactly as its OpenAI HTTP backend builds them, get 200s and the
usage it reads.

Its text-completions and chat handlers send `stream_options: {"include_usage": true,
"continuous_usage_stats": true}` when streaming, and, for a fixed output length,
`max_tokens` (chat: `max_completion_tokens`) with `ignore_eos: true` (its `stop: null` is
filtered out before sending). Chat messages carry their text as a list of parts. From a stream
it keeps the text of every chunk and the usage of the last chunk that has one; from a whole
response, `usage`; and it counts `prompt_tokens` and `completion_tokens`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_NAME, TIMEOUT, Served, served, sse_payloads

import llmengine

OUTPUT_TOKENS = 24
PROMPT = "the quick brown fox jumps over the lazy dog " * 4
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def server(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=64, block_size=16, num_slots=4)
    with served(engine, tokenizer) as running:
        yield running


def guidellm_body(path: str, stream: bool) -> dict[str, Any]:
    """The JSON guidellm sends for one request of a fixed output length."""
    body: dict[str, Any] = {"model": MODEL_NAME}
    if stream:
        body |= {"stream": True, "stream_options": dict(STREAM_OPTIONS)}
    if path == "/v1/completions":
        return body | {"max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "prompt": PROMPT}
    return body | {
        "max_completion_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
    }


def text_of(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return choice["text"]
    return (choice.get("delta") or choice.get("message") or {}).get("content") or ""


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_guidellms_whole_responses_carry_its_token_counts(
    server: Served, tokenizer: Any, path: str
) -> None:
    response = server.post(path, guidellm_body(path, stream=False))
    assert response.status_code == 200, response.text
    answer = response.json()
    usage = answer["usage"]
    assert usage["completion_tokens"] == OUTPUT_TOKENS  # ignore_eos: exactly as many
    if path == "/v1/completions":
        assert usage["prompt_tokens"] == len(tokenizer.encode(PROMPT))
    assert usage["total_tokens"] == usage["prompt_tokens"] + OUTPUT_TOKENS
    assert text_of(answer["choices"][0])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_guidellms_streams_carry_usage_in_every_chunk(
    server: Served, tokenizer: Any, path: str
) -> None:
    with httpx.stream(
        "POST", f"{server.url}{path}", json=guidellm_body(path, stream=True), timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200, response.read()
        chunks = sse_payloads(response.iter_lines())
    assert all(chunk.get("usage") for chunk in chunks)
    prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
    if path == "/v1/completions":
        assert prompt_tokens == len(tokenizer.encode(PROMPT))
    assert {chunk["usage"]["prompt_tokens"] for chunk in chunks} == {prompt_tokens}
    generated = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert generated == sorted(generated) and generated[-1] == OUTPUT_TOKENS
    # What guidellm keeps: every chunk's text, and the last usage it saw.
    text = "".join(text_of(choice) for chunk in chunks for choice in chunk["choices"])
    assert text

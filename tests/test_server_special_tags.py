"""Tool-call tags that a checkpoint's tokenizer marks special, over HTTP.

Hermes and Qwen tokenizers make `<tool_call>` and `</tool_call>` special tokens, Llama 3's
makes `<|python_tag|>` one; decoded as usual (special tokens skipped) a call loses its tags
and the parser never sees it. Here the embedded tokenizer gets those tags as added special
tokens, behind a random tiny Llama whose vocabulary covers them. Its output is scripted by
a Lark grammar that names the tags as tokens (`<tool_call>`), so greedy decoding writes
them as the special tokens themselves, then the end-of-sequence token.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tokenizers
from server_helpers import MODEL_NAME, Served, served, sse_payloads, streamed_message
from test_server_tool_calls import ASK, FORMATS, TEMPLATES, WEATHER

import llmengine
from llmengine.bench.decode_step import random_llama
from llmengine.model.tokenizer import Tokenizer

TAGS = ("<tool_call>", "</tool_call>", "<|python_tag|>")
CALL = {"name": "get_weather", "arguments": '{"city": "Verona"}'}


@pytest.fixture(scope="module")
def tagged_tokenizer(tokenizer: Any) -> Tokenizer:
    """The embedded tokenizer with the tool-call tags added as special tokens."""
    backend = tokenizers.Tokenizer.from_str(tokenizer.backend.to_str())
    assert backend.add_special_tokens(list(TAGS)) == len(TAGS)
    return Tokenizer(backend, {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token})


@pytest.fixture(scope="module")
def tagged_model(model: llmengine.Llama, tagged_tokenizer: Tokenizer) -> llmengine.Llama:
    """A random Llama of the embedded one's shape whose vocabulary holds the added tags, with
    room for the templates' long prompts."""
    config = dataclasses.replace(
        model.config,
        vocab_size=tagged_tokenizer.backend.get_vocab_size(),
        max_position_embeddings=2048,
    )
    return random_llama(config)


@pytest.fixture(scope="module", params=sorted(FORMATS))
def fmt(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(
    fmt: str, tagged_model: llmengine.Llama, tagged_tokenizer: Tokenizer
) -> Iterator[Served]:
    template = (TEMPLATES / FORMATS[fmt][0]).read_text()
    engine = llmengine.Engine(tagged_model, num_blocks=160, num_slots=4)
    with served(engine, tagged_tokenizer, chat_template=template, tool_call_parser=fmt) as running:
        yield running


def written(text: str) -> dict[str, Any]:
    """Request fields that make greedy decoding write exactly `text`, each tag in it as its
    special token, then stop on the end-of-sequence token: a Lark grammar of the text's
    literal pieces (JSON-quoted) and its tags (named as tokens)."""
    pieces = [piece for piece in re.split(f"({'|'.join(map(re.escape, TAGS))})", text) if piece]
    items = [piece if piece in TAGS else json.dumps(piece) for piece in pieces]
    grammar = "start: " + " ".join(items)
    return {"structured_outputs": {"grammar": grammar}, "temperature": 0, "max_tokens": 120}


def chat(server: Served, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL_NAME, "messages": ASK, "tools": [WEATHER], **fields}
    response = server.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


def stream(server: Served, **fields: Any) -> list[Any]:
    body = {"model": MODEL_NAME, "messages": ASK, "tools": [WEATHER], "stream": True, **fields}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as sse:
        assert sse.status_code == 200
        return sse_payloads(sse.iter_lines())


def test_the_tags_are_single_special_tokens(tagged_tokenizer: Tokenizer) -> None:
    for tag in TAGS:
        (token,) = tagged_tokenizer.encode(tag, add_special_tokens=False)
        assert tagged_tokenizer.decode([token], skip_special_tokens=True) == ""
        assert tagged_tokenizer.decode([token], skip_special_tokens=False) == tag


def test_the_parser_sees_special_tags_whole_and_streamed(server: Served, fmt: str) -> None:
    _, output, content = FORMATS[fmt]
    choice = chat(server, **written(output))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == content
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == CALL
    payloads = stream(server, **written(output))
    assert streamed_message(payloads) == (content or "", [CALL], "tool_calls")


def test_without_a_parsed_call_special_tags_stay_skipped(server: Served, fmt: str) -> None:
    _, output, _ = FORMATS[fmt]
    plain = output
    for tag in TAGS:
        plain = plain.replace(tag, "")
    # tool_choice "none": the output is text, decoded as the request says (skipping by default).
    choice = chat(server, tool_choice="none", **written(output))["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": plain}
    completion = server.post(
        "/v1/completions", {"model": MODEL_NAME, "prompt": "Hello", **written(output)}
    ).json()["choices"][0]
    assert completion["text"] == plain and completion["finish_reason"] == "stop"


def test_the_end_token_writes_no_text_even_unskipped(
    server: Served, fmt: str, tagged_tokenizer: Tokenizer
) -> None:
    _, output, _ = FORMATS[fmt]
    fields = {**written(output), "tool_choice": "none", "skip_special_tokens": False}
    choice = chat(server, logprobs=True, **fields)["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == output  # the tags, and no end-of-sequence text
    # The end token is still scored, under its own text, and counted.
    assert choice["logprobs"]["content"][-1]["token"] == tagged_tokenizer.eos_token
    assert streamed_message(stream(server, **fields)) == (output, [], "stop")

"""The server under hostile input: what is refused (400, never a plain-text 500 or a garbage
200), what a burst gets when slots are free, and that a request's cost before admission is
bounded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_NAME, TIMEOUT, Served, SlowEngine, served, wait_until
from test_server_errors import assert_error

import llmengine
from llmengine.server.protocol import MAX_CHOICES

COMPLETION = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 2}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=64, block_size=16, num_slots=4)
    with served(engine, tokenizer, max_waiting=8) as running:
        yield running


def test_a_request_for_more_choices_than_allowed_is_400_at_once(server: Served) -> None:
    """The reproduction of issue 21: 20,000 prompts x n=64 in a 100 KB body."""
    start = time.perf_counter()
    body = {**COMPLETION, "prompt": [[1]] * 20000, "n": 64, "max_tokens": 1}
    error = assert_error(server.post("/v1/completions", body), 400)
    assert str(MAX_CHOICES) in error["message"]
    assert time.perf_counter() - start < 5.0  # refused, not built choice by choice


def test_a_request_no_queue_could_ever_hold_is_400_not_429(server: Served) -> None:
    # 5 x 40 = 200 choices: under MAX_CHOICES, over 4 slots + 8 waiting.
    body = {**COMPLETION, "prompt": ["a"] * 5, "n": 40}
    error = assert_error(server.post("/v1/completions", body), 400, "n")
    assert "ever holds at once" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": "\udfff"}]},
            None,
        ),
        ("/v1/chat/completions", {**CHAT, "model": "\ud800"}, None),
        ("/v1/completions", {**COMPLETION, "prompt": "a\udc00b"}, None),
        ("/v1/completions", {**COMPLETION, "stop": ["\ud83d"]}, None),
    ],
)
def test_lone_surrogates_are_400_with_an_error_object(
    server: Served, path: str, body: dict, param: str | None
) -> None:
    # json.dumps escapes a lone surrogate as JSON allows (`"\\udfff"`); httpx's json= would
    # refuse to encode it.
    content = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    response = httpx.post(f"{server.url}{path}", content=content, headers=headers)
    error = assert_error(response, 400, param)
    assert "surrogate" in error["message"]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"temperature": 1e-38}, "temperature"),
        ({"temperature": 1e-320}, "temperature"),
        ({"temperature": 1e39, "structured_outputs": {"choice": ["aye", "nay"]}}, "temperature"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty"),
        ({"repetition_penalty": 1e300}, "repetition_penalty"),
        ({"stop_token_ids": [99999]}, "stop_token_ids"),
        ({"stop_token_ids": [2**70]}, "stop_token_ids"),
        ({"top_k": 2**70}, "top_k"),
        ({"n": "2"}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": "3"}, "max_tokens"),
        ({"best_of": 2}, "best_of"),
        ({"logit_bias": {"one": 5}}, "logit_bias"),
        ({"suffix": "x"}, "suffix"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "response_format",
        ),
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "x" * 100_001}}, "structured_outputs"),
        ({"stream_options": {"include_usage": True, "extra": 1}}, "stream_options"),
    ],
)
def test_values_the_server_cannot_honour_are_400_naming_the_field(
    server: Served, change: dict, param: str
) -> None:
    for path, base in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        error = assert_error(server.post(path, {**base, **change}), 400, param)
        assert param in error["message"]


def test_a_chat_message_field_the_server_does_not_use_is_400(server: Served) -> None:
    messages = [{"role": "user", "content": "Hi", "tool_calls": []}]
    error = assert_error(server.post("/v1/chat/completions", {**CHAT, "messages": messages}), 400)
    assert "tool_calls belong to an assistant message" in error["message"]
    messages = [{"role": "user", "content": "Hi", "function_call": {}}]
    error = assert_error(server.post("/v1/chat/completions", {**CHAT, "messages": messages}), 400)
    assert "messages.0.function_call" in error["message"]


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        ({"tool_choice": "auto"}, "tool_choice", "needs tools"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice",
            "'g', which tools does not define",
        ),
        (
            {
                "tools": [TOOL],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "tool_choice",
            "both constrain",
        ),
        ({"tools": [{**TOOL, "function": {"name": "a b"}}]}, "tools", "pattern"),
        ({"tools": [TOOL] * 129}, "tools", "at most 128"),
    ],
)
def test_tools_that_cannot_be_called_are_400(
    server: Served, change: dict, param: str, says: str
) -> None:
    error = assert_error(server.post("/v1/chat/completions", {**CHAT, **change}), 400, param)
    assert says in error["message"]


def test_tools_are_a_chat_field_only(server: Served) -> None:
    error = assert_error(server.post("/v1/completions", {**COMPLETION, "tools": [TOOL]}), 400)
    assert "tools" in error["message"]


def test_fields_real_clients_send_are_still_taken(server: Served) -> None:
    for path, base in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        body = {**base, "user": "someone", "temperature": 0.5, "seed": 3, "top_k": 2048}
        response = server.post(path, body)
        assert response.status_code == 200, response.text


def test_a_burst_into_free_slots_is_seated_not_refused(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    """8 free slots and --max-waiting 2: 8 requests at once all run; a 9th and 10th wait; an
    11th is one too many, and its 429 says when to retry."""
    engine = SlowEngine(model, num_blocks=64, block_size=16, num_slots=8)
    with served(engine, tokenizer, max_waiting=2) as running:
        url = f"{running.url}/v1/completions"
        body = {**COMPLETION, "max_tokens": 40, "ignore_eos": True}
        statuses: list[int] = []

        def post() -> None:
            statuses.append(httpx.post(url, json=body, timeout=TIMEOUT).status_code)

        threads = [threading.Thread(target=post) for _ in range(8)]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: running.metrics()["llmengine_requests_running"] == 8)
        waiting = [threading.Thread(target=post) for _ in range(2)]
        for thread in waiting:
            thread.start()
        assert wait_until(lambda: running.metrics()["llmengine_requests_waiting"] == 2)
        refused = running.post("/v1/completions", body)
        error = assert_error(refused, 429)
        assert error["code"] == "queue_full" and refused.headers["retry-after"].isdigit()
        for thread in threads + waiting:
            thread.join(TIMEOUT)
        assert statuses == [200] * 10


def test_a_stop_string_finish_is_counted_as_a_stop(server: Served) -> None:
    before = server.metrics().get('llmengine_requests_finished_total{reason="stop"}', 0.0)
    aborted = server.metrics().get('llmengine_requests_finished_total{reason="abort"}', 0.0)
    greedy = {**COMPLETION, "max_tokens": 30, "temperature": 0}
    text = server.post("/v1/completions", greedy).json()
    stop = text["choices"][0]["text"][1:4]  # a stop string the greedy text will meet again
    body = {**greedy, "stop": [stop]}
    assert server.post("/v1/completions", body).json()["choices"][0]["finish_reason"] == "stop"
    metrics = server.metrics()
    assert metrics['llmengine_requests_finished_total{reason="stop"}'] >= before + 1
    assert metrics.get('llmengine_requests_finished_total{reason="abort"}', 0.0) == aborted

"""Bad input, missing keys, big bodies and a full queue: refused in OpenAI's error format,
and none of it disturbs a request already running."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_helpers import (
    MODEL_NAME,
    TIMEOUT,
    Served,
    SlowEngine,
    holds_no_records,
    served,
    sse_payloads,
    wait_until,
)

import llmengine
from llmengine.sampling import SamplingParams
from llmengine.server import create_app, serve_in_thread

NUM_BLOCKS, BLOCK_SIZE = 16, 16  # 256 tokens: less than the model's 512 positions


@pytest.fixture(scope="module")
def server(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, num_slots=4)
    with served(engine, tokenizer) as running:
        yield running
    assert holds_no_records(engine)


def assert_error(response: httpx.Response, status: int, param: str | None = "") -> dict:
    """The response is `status` with OpenAI's error object; returns the error."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param != "":
        assert error["param"] == param
    return error


COMPLETION = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 4}
BAD_COMPLETIONS = [
    ({"prompt": 5}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [5, 99999]}, "prompt"),  # outside the vocabulary: the engine refuses it
    ({"prompt": [-1]}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"max_tokens": 600}, "max_tokens"),  # beyond the model's positions
    ({"max_tokens": 300}, "prompt"),  # beyond the pool: the engine refuses it
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"n": 0}, "n"),
    ({"seed": -1}, "seed"),
    ({"stop": 3}, "stop"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"logprobs": 21}, "logprobs"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"stream": "yes please"}, "stream"),
]


@pytest.mark.parametrize("change", BAD_COMPLETIONS, ids=lambda c: str(c[0]))
def test_bad_completion_fields_are_400(server: Served, change: tuple[dict, str]) -> None:
    fields, param = change
    error = assert_error(server.post("/v1/completions", {**COMPLETION, **fields}), 400, param)
    assert error["type"] == "invalid_request_error"


BAD_CHATS = [
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "word " * 300}]}, "messages"),  # no room left
]


@pytest.mark.parametrize("change", BAD_CHATS, ids=lambda c: str(c[0])[:40])
def test_bad_chat_fields_are_400(server: Served, change: tuple[dict, str]) -> None:
    fields, param = change
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}]}
    assert_error(server.post("/v1/chat/completions", {**chat, **fields}), 400, param)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"", b'"prompt"'])
def test_a_body_that_is_not_a_json_object_is_400(server: Served, body: bytes) -> None:
    response = httpx.post(
        f"{server.url}/v1/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=TIMEOUT,
    )
    assert_error(response, 400)


def test_an_unknown_model_is_404_and_an_unknown_path_too(server: Served) -> None:
    error = assert_error(server.post("/v1/completions", {**COMPLETION, "model": "gpt-9"}), 404)
    assert error["code"] == "model_not_found" and "gpt-9" in error["message"]
    chat = {"model": "gpt-9", "messages": [{"role": "user", "content": "Hi"}]}
    assert_error(server.post("/v1/chat/completions", chat), 404, "model")
    assert_error(httpx.get(f"{server.url}/v1/nowhere", timeout=TIMEOUT), 404)
    with pytest.raises(openai.NotFoundError):
        server.openai().completions.create(model="gpt-9", prompt="x", max_tokens=2)


def test_bad_requests_do_not_disturb_a_running_stream(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    """A long stream runs while every bad request above is refused; its text is intact."""
    engine = llmengine.Engine(model, num_blocks=64, block_size=16, tokenizer=tokenizer)
    (expected,) = engine.generate_text(["KING:"], SamplingParams(max_tokens=60, ignore_eos=True))
    body = {**COMPLETION, "prompt": "KING:", "max_tokens": 60, "temperature": 0}
    result: dict[str, Any] = {}

    def stream() -> None:
        request = {**body, "stream": True, "ignore_eos": True}
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json=request, timeout=TIMEOUT
        ) as response:
            result["chunks"] = sse_payloads(response.iter_lines())

    reader = threading.Thread(target=stream)
    reader.start()
    for fields, _ in BAD_COMPLETIONS:
        assert server.post("/v1/completions", {**COMPLETION, **fields}).status_code == 400
    reader.join(TIMEOUT)
    assert "".join(c["choices"][0]["text"] for c in result["chunks"]) == expected
    assert server.post("/v1/completions", COMPLETION).status_code == 200
    assert wait_until(lambda: holds_no_records(server.engine))


KEY = "sk-test-4f9a1c0e7b"


@pytest.fixture(scope="module")
def guarded(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=16, block_size=16, num_slots=2)
    with served(engine, tokenizer, api_key=KEY, max_body_bytes=4096) as running:
        yield running


def test_a_missing_or_wrong_key_is_401_on_v1_only(guarded: Served) -> None:
    url = f"{guarded.url}/v1/completions"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        error = assert_error(httpx.post(url, json=COMPLETION, headers=headers), 401)
        assert error["code"] == "invalid_api_key"
    assert_error(httpx.get(f"{guarded.url}/v1/models"), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{guarded.url}/health").status_code == 200
    assert httpx.get(f"{guarded.url}/metrics").status_code == 200
    result = guarded.openai().completions.create(model=MODEL_NAME, prompt="A", max_tokens=3)
    assert result.usage.completion_tokens == 3


def test_the_key_never_reaches_the_log(
    model: llmengine.Llama, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every log line of a run at debug level (uvicorn's and the server's), with the key
    sent right and wrong: the requests are logged, the key is not."""
    engine = llmengine.Engine(model, num_blocks=16, block_size=16, num_slots=2)
    app = create_app(engine, tokenizer, served_model_name=MODEL_NAME, api_key=KEY)
    loggers = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]
    with caplog.at_level(logging.DEBUG), serve_in_thread(app, log_level="debug") as url:
        for logger in loggers:  # uvicorn's loggers do not propagate: listen to them directly
            logger.addHandler(caplog.handler)
        try:
            client = Served(url, engine, KEY).openai()
            client.completions.create(model=MODEL_NAME, prompt="A", max_tokens=2)
            httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}x"})
        finally:
            for logger in loggers:
                logger.removeHandler(caplog.handler)
    assert "POST /v1/completions" in caplog.text and "401" in caplog.text
    assert KEY not in caplog.text


def test_a_body_over_the_limit_is_413_by_header_or_as_it_streams(guarded: Served) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    url = f"{guarded.url}/v1/completions"
    big = {**COMPLETION, "prompt": "x" * 5000}
    error = assert_error(httpx.post(url, json=big, headers=headers), 413)
    assert error["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        yield b'{"prompt": "'
        for _ in range(50):
            yield b"y" * 100
        yield b'", "max_tokens": 2}'

    assert_error(httpx.post(url, content=chunks(), headers=headers), 413)
    small = httpx.post(url, json=COMPLETION, headers=headers)
    assert small.status_code == 200


def test_more_requests_than_max_waiting_get_429_at_once(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    """One slot, room for one waiting request: the third concurrent request is refused."""
    engine = SlowEngine(model, num_blocks=16, block_size=16, num_slots=1)
    with served(engine, tokenizer, max_waiting=1) as running:
        body = {**COMPLETION, "max_tokens": 100, "ignore_eos": True, "stream": True}
        url = f"{running.url}/v1/completions"
        with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as first:
            lines = first.iter_lines()  # kept: dropping the iterator closes the stream
            assert next(lines).startswith("data: ")  # running now
            with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as second:
                assert wait_until(lambda: running.metrics()["llmengine_requests_waiting"] == 1)
                third = running.post("/v1/completions", {**COMPLETION, "max_tokens": 2})
                error = assert_error(third, 429)
                assert error["code"] == "queue_full"
                assert second.status_code == 200
        assert wait_until(lambda: holds_no_records(engine))
        assert running.metrics()["llmengine_kv_blocks_free"] == 16

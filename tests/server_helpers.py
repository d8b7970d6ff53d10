"""What the server tests share: a served engine, SSE parsing, /metrics read back, polling."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai

import llmengine
from llmengine.lessons.live_server import read_metrics
from llmengine.server import create_app, serve_in_thread

MODEL_NAME = "tiny-test"
TIMEOUT = 30.0


@dataclass
class Served:
    """A running server: its base URL, the engine it owns, and clients for it."""

    url: str
    engine: llmengine.Engine
    api_key: str = "unused"
    app: Any = None  # the FastAPI app, for its `state` (engine loop, drain, metrics)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=self.api_key, max_retries=0, timeout=TIMEOUT
        )

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=TIMEOUT, **kwargs)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by name (labels folded into the name, as `a{k="v"}`)."""
        return read_metrics(self.url, timeout=TIMEOUT)


@contextmanager
def served(engine: llmengine.Engine, tokenizer: Any, **options: Any) -> Iterator[Served]:
    """`engine` behind a real uvicorn server on a free local port, stopped on exit."""
    app = create_app(engine, tokenizer, served_model_name=MODEL_NAME, **options)
    with serve_in_thread(app) as url:
        yield Served(url, engine, options.get("api_key") or "unused", app)


def sse_payloads(lines: Iterator[str]) -> list[Any]:
    """The JSON payloads of a Server-Sent Events stream, checking it ends in [DONE]."""
    payloads: list[Any] = []
    done = False
    for line in lines:
        if not line.startswith("data: "):
            continue
        assert not done, "an event after [DONE]"
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
        else:
            payloads.append(json.loads(data))
    assert done, "the stream did not end with data: [DONE]"
    return payloads


def wait_until(condition: Callable[[], bool], *, timeout: float = 10.0) -> bool:
    """Poll `condition` (bounded in time and count) until it holds; whether it did."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.02) + 1):
        if condition():
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return condition()


def holds_no_records(engine: llmengine.Engine) -> bool:
    """The engine has nothing in flight and no request record left behind."""
    return not engine._requests and not engine.has_unfinished()


class SlowEngine(llmengine.Engine):
    """An engine whose every step takes at least `delay` seconds: a request that cannot
    finish before a test has looked at it."""

    delay = 0.02

    def step(self) -> llmengine.IterationOutcome:
        time.sleep(self.delay)
        return super().step()


def streamed_message(payloads: list[Any]) -> tuple[str, list[dict[str, str]], str | None]:
    """A streamed chat choice put back together: its content, its calls and its finish
    reason, checking each call arrives as OpenAI sends it: a first delta with the call's id,
    type and name and empty arguments, then deltas with pieces of its arguments only."""
    content, calls, reason = "", [], None
    for payload in payloads:
        for choice in payload["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls", []):
                if call["index"] == len(calls):
                    assert call["id"] and call["type"] == "function", call
                    assert call["function"]["arguments"] == "", call
                    calls.append({"name": call["function"]["name"], "arguments": ""})
                else:
                    assert set(call) == {"index", "function"}, call
                    assert set(call["function"]) == {"arguments"}, call
                    calls[call["index"]]["arguments"] += call["function"]["arguments"]
            reason = choice["finish_reason"] or reason
    return content, calls, reason


REGEX_META = set("\\.+*?()|[]{}^$#&-~")


def scripted(text: str) -> dict[str, Any]:
    """Request fields that make greedy decoding write exactly `text`, whatever the model: a
    `structured_outputs` regex that matches `text` alone."""
    regex = "".join(
        "\\n" if char == "\n" else "\\" + char if char in REGEX_META else char for char in text
    )
    return {"structured_outputs": {"regex": regex}, "temperature": 0, "max_tokens": 200}

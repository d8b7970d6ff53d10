"""Lesson 20's abuse table: requests no well-behaved client sends, and what the server answers.

Each entry is what a careless or hostile client might send; `answers` sends them all to a
running server and returns one row per request: the status, the field the error names and
its message. Everything here is deterministic (no sampling reaches the table), so the table
regenerates byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from llmengine.bench.http_client import HOST


@dataclass(frozen=True, slots=True)
class Hostile:
    """One request: what it is, where it goes, and its body (JSON-encoded as JSON allows,
    so a lone surrogate travels as `\\udfff`)."""

    what: str
    path: str
    body: Any


def hostile_requests(model: str) -> list[Hostile]:
    """The requests of the table, for a server serving `model`."""
    completion = {"model": model, "prompt": "ROMEO:", "max_tokens": 4, "temperature": 0}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    huge = "x" * (1 << 20)
    return [
        Hostile("20,000 prompts x n=64 (100 KB)", "/v1/completions",
                {**completion, "prompt": [[1]] * 20000, "n": 64, "max_tokens": 1}),
        Hostile("a body over 1 MB", "/v1/completions", {**completion, "prompt": huge}),
        Hostile("temperature 1e-38", "/v1/completions", {**completion, "temperature": 1e-38}),
        Hostile("repetition_penalty 1e-300", "/v1/completions",
                {**completion, "repetition_penalty": 1e-300}),
        Hostile("stop_token_ids [99999]", "/v1/completions",
                {**completion, "stop_token_ids": [99999]}),
        Hostile('"n": "2" (a string)', "/v1/completions", {**completion, "n": "2"}),
        Hostile('"stream": "yes"', "/v1/completions", {**completion, "stream": "yes"}),
        Hostile("tool_choice naming a function tools lacks", "/v1/chat/completions",
                {**chat, "tools": [{"type": "function", "function": {"name": "f"}}],
                 "tool_choice": {"type": "function", "function": {"name": "g"}}}),
        Hostile("a JSON schema that does not compile", "/v1/chat/completions",
                {**chat, "response_format": {"type": "json_schema",
                 "json_schema": {"name": "s", "schema": {"$ref": "#/nowhere"}}}}),
        Hostile("a lone surrogate in a message", "/v1/chat/completions",
                {**chat, "messages": [{"role": "user", "content": "\udfff"}]}),
        Hostile("an unknown model", "/v1/completions", {**completion, "model": "gpt-4"}),
        Hostile("max_tokens 0 without echo", "/v1/completions", {**completion, "max_tokens": 0}),
        Hostile("max_tokens 0 with echo and logprobs", "/v1/completions",
                {**completion, "max_tokens": 0, "echo": True, "logprobs": 1}),
    ]  # fmt: skip


def answers(base_url: str, requests: list[Hostile], timeout: float = 60.0) -> list[list[Any]]:
    """Each request's row: what was sent, the HTTP status, the field named, the message."""
    if not base_url.startswith(f"http://{HOST}:"):
        raise ValueError(f"only a local server is a target, not {base_url}")
    rows = []
    with httpx.Client(timeout=timeout) as client:
        for request in requests:
            content = json.dumps(request.body).encode()
            response = client.post(
                f"{base_url}{request.path}",
                content=content,
                headers={"content-type": "application/json"},
            )
            error = response.json().get("error") if response.status_code != 200 else None
            param = "" if error is None or error["param"] is None else error["param"]
            message = "(a normal answer)" if error is None else error["message"]
            rows.append([request.what, response.status_code, param, message])
    return rows

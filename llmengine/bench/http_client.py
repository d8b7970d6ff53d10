"""batchbench over HTTP: a workload sent to an OpenAI-compatible server, every token timed.

Each request is streamed from `POST {url}/completions` with token-id prompts, greedy, with
`ignore_eos` so it runs its whole budget, and `stream_options.include_usage` so the server
says how many tokens it generated (a chunk may carry more than one). The client notes when
each chunk that carries a choice arrives: the first is the time to first token, the gaps
after it are the inter-token latencies. Requests start at their workload arrival times
(seconds after the run starts), so a Poisson workload is a Poisson process of arrivals.

Nothing a server does can hang the run: every request has a deadline, and a server that
stalls, drops the connection, answers an error or sends something that is not an OpenAI
stream gives that request a `RequestRecord` with `error` set, never an exception.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm import tqdm

from llmengine.bench.workloads import RequestSpec

DEFAULT_TIMEOUT_S = 300.0
HOST = "127.0.0.1"  # where the project's own servers listen in tests, lessons and benchmarks


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody was listening on a moment ago."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def wait_for_health(url: str, process: subprocess.Popen, timeout: float) -> None:
    """Poll `{url}/health` every tenth of a second until it answers 200; RuntimeError when the
    server's `process` exits or `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with status {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"no healthy answer from /health in {timeout:g} s")


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it; times in seconds from when the request was sent.

    `error` is None for a request that streamed to `data: [DONE]` with at least one token.
    """

    prompt_tokens: int
    start: float = 0.0
    output_tokens: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    text: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(slots=True)
class HttpRun:
    """Every request of one run, in workload order, and the run's wall-clock duration."""

    records: list[RequestRecord]
    duration: float


def _api_root(url: str) -> str:
    """`url` without its trailing slash; ValueError unless http(s) with a host and a usable port."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise ValueError(f"not a URL: {url} ({error})") from None
    port_ok = parsed.port is None or 0 < parsed.port < 65536
    if parsed.scheme not in ("http", "https") or not parsed.host or not port_ok:
        raise ValueError(f"not an http:// or https:// URL with a host and a port: {url}")
    return url.rstrip("/")


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _request_body(spec: RequestSpec, model: str) -> dict[str, Any]:
    params = spec.params
    return {
        "model": model,
        "prompt": list(spec.prompt_token_ids),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "ignore_eos": params.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _error_message(status: int, body: bytes) -> str:
    """`HTTP 429: queue full` from an OpenAI error object, or the status and the raw start."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace").strip()
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


async def _stream_into(
    record: RequestRecord, client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> None:
    """Send one request and fill `record` from its Server-Sent Events."""
    sent = time.perf_counter()
    last = sent
    chunks, usage_tokens, done = 0, None, False
    async with client.stream("POST", f"{url}/completions", json=body) as response:
        if response.status_code != 200:
            record.error = _error_message(response.status_code, await response.aread())
            return
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if not isinstance(chunk, dict):
                raise ValueError("an event that is not a JSON object")
            if "error" in chunk:
                record.error = f"error event: {chunk['error']}"
                return
            if chunk.get("usage"):
                usage_tokens = chunk["usage"].get("completion_tokens")
            if chunk.get("choices"):
                now = time.perf_counter()
                if chunks == 0:
                    record.ttft = now - sent
                else:
                    record.itl.append(now - last)
                last = now
                chunks += 1
                record.text += chunk["choices"][0].get("text") or ""
    record.e2e = last - sent
    record.output_tokens = usage_tokens if isinstance(usage_tokens, int) else chunks
    if not done:
        record.error = "the stream ended without data: [DONE]"
    elif chunks == 0:
        record.error = "the stream carried no tokens"


async def _send(
    spec: RequestSpec,
    client: httpx.AsyncClient,
    url: str,
    model: str,
    origin: float,
    timeout: float,
) -> RequestRecord:
    await asyncio.sleep(max(0.0, origin + spec.arrival - time.perf_counter()))
    record = RequestRecord(len(spec.prompt_token_ids), start=time.perf_counter() - origin)
    try:
        async with asyncio.timeout(timeout):
            await _stream_into(record, client, url, _request_body(spec, model))
    except TimeoutError:
        record.error = f"no complete answer within {timeout:g} s"
    except httpx.HTTPError as error:
        record.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        record.error = f"not an OpenAI stream: {error}"
    return record


async def _run(
    url: str,
    model: str,
    workload: Sequence[RequestSpec],
    timeout: float,
    api_key: str | None,
    progress: bool,
) -> HttpRun:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout), limits=limits, headers=_headers(api_key)
    ) as client:
        origin = time.perf_counter()
        tasks = [
            asyncio.ensure_future(_send(spec, client, url, model, origin, timeout))
            for spec in workload
        ]
        with tqdm(total=len(tasks), desc="requests", disable=not progress, leave=False) as bar:
            for task in tasks:
                task.add_done_callback(lambda _: bar.update())
            records = list(await asyncio.gather(*tasks))
        return HttpRun(records, time.perf_counter() - origin)


def run_over_http(
    url: str,
    model: str,
    workload: Sequence[RequestSpec],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    api_key: str | None = None,
    progress: bool = False,
) -> HttpRun:
    """Stream every request of `workload` from the server at `url` (ending in /v1).

    Arrivals are seconds after the run starts. `timeout` bounds each request from when it
    is sent to its last byte, and also each connect and read. Works from inside a running
    event loop too (a notebook), on a thread of its own.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    run = _run(_api_root(url), model, workload, timeout, api_key, progress)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no event loop here, so run one
        return asyncio.run(run)
    # Called from code that already runs an event loop (a notebook kernel does): asyncio
    # cannot nest loops, so the run gets its own loop on a thread of its own.
    with ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(asyncio.run, run).result()


def served_model(url: str, *, timeout: float = 10.0, api_key: str | None = None) -> str:
    """The first model `GET {url}/models` lists: what to ask for when the user named none."""
    root = _api_root(url)
    try:
        response = httpx.get(f"{root}/models", timeout=timeout, headers=_headers(api_key))
    except httpx.HTTPError as error:
        raise OSError(f"cannot list the models at {url}: {error}") from None
    if response.status_code != 200:
        reason = _error_message(response.status_code, response.content)
        raise OSError(f"cannot list the models at {url}: {reason}")
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise OSError(f"{url}/models does not list a model; name one with --model") from None

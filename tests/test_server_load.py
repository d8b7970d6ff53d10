"""Many clients at once and clients that leave: the server's engine loop under pressure.

32 streaming clients on a pool small enough that the engine preempts get exactly the
offline engine's texts; a client that disconnects, streaming or not, has its request aborted
and its blocks back at once; the engine keeps no record of any request once it ends; and a
step hands all its streams' tokens to the asyncio loop in one wake-up.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import (
    MODEL_NAME,
    TIMEOUT,
    Served,
    SlowEngine,
    holds_no_records,
    served,
    wait_until,
)

import llmengine
from llmengine.sampling import SamplingParams
from llmengine.server import create_app, serve_in_thread
from llmengine.server.engine_loop import EngineLoop, TokenEvent
from llmengine.server.metrics import ServerMetrics

CLIENTS = 32
MAX_TOKENS = 12


def prompts() -> list[str]:
    names = ["ROMEO", "JULIET", "HAMLET", "KING LEAR", "PORTIA", "IAGO", "PUCK", "VIOLA"]
    openings = ["", "O, ", "Good my lord, ", "What is"]
    return [f"{name}:\n{opening}" for opening in openings for name in names]


async def stream_text(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> str:
    """One streaming completion, its text joined from the chunks."""
    text = ""
    async with client.stream("POST", url, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[len("data: ") :])["choices"][0]["text"]
    return text


def test_32_streaming_clients_on_a_cramped_pool_get_the_offline_texts(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    all_prompts = prompts()
    assert len(all_prompts) == CLIENTS
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    roomy = llmengine.Engine(model, num_blocks=512, block_size=4, num_slots=32, tokenizer=tokenizer)
    expected = roomy.generate_text(all_prompts, params)
    engine = llmengine.Engine(model, num_blocks=16, block_size=4, num_slots=8)
    with served(engine, tokenizer) as server:
        url = f"{server.url}/v1/completions"

        async def everyone() -> list[str]:
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
                bodies = [
                    {"model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS,
                     "temperature": 0, "ignore_eos": True}
                    for prompt in all_prompts
                ]  # fmt: skip
                return await asyncio.gather(*(stream_text(client, url, b) for b in bodies))

        texts = asyncio.run(asyncio.wait_for(everyone(), TIMEOUT))
        assert texts == expected
        metrics = server.metrics()
        assert metrics["llmengine_preemptions_total"] > 0  # the pool really was too small
        assert metrics["llmengine_generation_tokens_total"] >= CLIENTS * MAX_TOKENS
        assert wait_until(lambda: holds_no_records(engine))
        assert server.metrics()["llmengine_kv_blocks_free"] == 16


@pytest.fixture(scope="module")
def slow(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    """Every step takes 20 ms: 200 tokens take 4 s, far longer than a test waits."""
    engine = SlowEngine(model, num_blocks=32, block_size=16, num_slots=2)
    with served(engine, tokenizer) as running:
        yield running


CHAT_LONG = {"model": MODEL_NAME, "max_tokens": 200, "ignore_eos": True}
LONG = {**CHAT_LONG, "prompt": "ROMEO:"}


def aborted(server: Served) -> float:
    return server.metrics().get('llmengine_requests_finished_total{reason="abort"}', 0.0)


def blocks_all_free(server: Served) -> bool:
    metrics = server.metrics()
    return metrics["llmengine_kv_blocks_free"] == metrics["llmengine_kv_blocks_total"]


def test_a_client_that_leaves_mid_stream_gets_its_request_aborted(slow: Served) -> None:
    before = aborted(slow)
    for path, body in (
        ("/v1/completions", LONG),
        ("/v1/chat/completions", {**CHAT_LONG, "messages": [{"role": "user", "content": "Hi"}]}),
    ):
        with httpx.stream(
            "POST", f"{slow.url}{path}", json={**body, "stream": True}, timeout=TIMEOUT
        ) as response:
            lines = response.iter_lines()
            received = [line for line, _ in zip(lines, range(6), strict=False) if line]
            assert len(received) >= 2
            assert not blocks_all_free(slow)  # the request holds blocks while it streams
        assert wait_until(lambda: blocks_all_free(slow), timeout=2.0)
    assert aborted(slow) == before + 2
    assert wait_until(lambda: holds_no_records(slow.engine), timeout=2.0)


def test_a_client_that_gives_up_waiting_gets_its_request_aborted(slow: Served) -> None:
    before = aborted(slow)
    timeout = httpx.Timeout(TIMEOUT, read=0.3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{slow.url}/v1/completions", json=LONG, timeout=timeout)
    assert wait_until(lambda: blocks_all_free(slow), timeout=2.0)
    assert aborted(slow) == before + 1
    assert wait_until(lambda: holds_no_records(slow.engine), timeout=2.0)


def test_a_stop_string_frees_the_request_before_its_budget(slow: Served) -> None:
    """The text hits the stop string early: the engine request ends there, not 200 tokens on."""
    body = {**LONG, "temperature": 0, "stop": "\n"}
    result = httpx.post(f"{slow.url}/v1/completions", json=body, timeout=3.0).json()
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["usage"]["completion_tokens"] < 200
    assert wait_until(lambda: holds_no_records(slow.engine), timeout=2.0)


def test_stopping_the_server_mid_stream_ends_the_stream_and_the_engine_thread(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    """A stream still running when the server stops: cut after the grace period (its 200
    tokens would take 4 s), its request aborted, the engine thread joined, no record left."""
    engine = SlowEngine(model, num_blocks=32, block_size=16, num_slots=2)
    app = create_app(engine, tokenizer, served_model_name=MODEL_NAME)
    received: list[str] = []

    def read(url: str) -> None:
        body = {**LONG, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as r:
                received.extend(line for line in r.iter_lines() if line)
        except httpx.HTTPError:
            pass  # cut off by the shutdown: what this test expects

    with serve_in_thread(app, shutdown_timeout=0.3) as url:
        reader = threading.Thread(target=read, args=(url,))
        reader.start()
        assert wait_until(lambda: len(received) >= 2, timeout=5.0)
        start = time.monotonic()
    elapsed = time.monotonic() - start
    reader.join(TIMEOUT)
    assert not reader.is_alive()
    assert elapsed < 3.0 and "data: [DONE]" not in received
    assert not app.state.engine_loop.running
    assert holds_no_records(engine)


def test_an_idle_engine_thread_blocks_instead_of_spinning(slow: Served) -> None:
    """Half a second with nothing to do costs the process (almost) no CPU time."""
    assert wait_until(lambda: holds_no_records(slow.engine))
    iteration, cpu = slow.engine.iteration, time.process_time()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.1
    assert slow.engine.iteration == iteration


def test_a_step_wakes_the_asyncio_loop_once_for_all_its_streams(
    model: llmengine.Llama, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `call_soon_threadsafe` writes to the loop's wake-up socket: the engine thread
    hands a step's tokens for all its streams over in one, and they arrive in order."""
    steps: list[int] = []
    real_step = EngineLoop._step
    monkeypatch.setattr(EngineLoop, "_step", lambda self: (steps.append(1), real_step(self)))
    engine = llmengine.Engine(model, num_blocks=32, block_size=16, num_slots=4)
    loop_of_engine = EngineLoop(engine, ServerMetrics(), max_waiting=8)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    expected = engine.generate(prompts, params)

    async def run() -> tuple[dict[int, list[int]], int]:
        loop = asyncio.get_running_loop()
        wakes = 0
        real_call = loop.call_soon_threadsafe

        def counted(callback, *args, **kwargs):
            nonlocal wakes
            wakes += 1
            return real_call(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        ids, events = await loop_of_engine.add(prompts, [params] * len(prompts))
        wakes = 0  # from here on: the steps' hand-offs only
        tokens: dict[int, list[int]] = {request_id: [] for request_id in ids}
        finished = 0
        while finished < len(ids):
            event = await asyncio.wait_for(events.get(), TIMEOUT)
            assert isinstance(event, TokenEvent)
            tokens[event.request_id].append(event.token_id)
            finished += event.finish_reason is not None
        return tokens, wakes

    loop_of_engine.start()
    try:
        tokens, wakes = asyncio.run(run())
    finally:
        loop_of_engine.stop()
    assert list(tokens.values()) == expected
    assert wakes <= len(steps) < len(prompts) * MAX_TOKENS

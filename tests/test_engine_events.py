"""The engine's live feed, without a browser: what a snapshot holds after a preempting
burst, how often snapshots come, that nobody listening costs nothing, and who may listen."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import llmengine
from llmengine.cli import build_parser
from llmengine.server import engine_events
from llmengine.server.engine_events import QUEUE_SIZE, Subscriber
from llmengine.server.engine_snapshot import CACHED, FREE, run_length
from tests.server_helpers import MODEL_NAME, TIMEOUT, Served, served, wait_until

FEED = "/v1/engine/events"
BURST = 8
MAX_TOKENS = 24


def burst(server: Served, count: int = BURST, **headers: str) -> None:
    """`count` completions at once, each long enough to outgrow a cramped pool."""

    def one(index: int) -> None:
        body = {"model": MODEL_NAME, "prompt": f"ROMEO {index}:", "max_tokens": MAX_TOKENS,
                "ignore_eos": True}  # fmt: skip
        response = server.post("/v1/completions", body, headers=headers)
        assert response.status_code == 200, response.text

    threads = [threading.Thread(target=one, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)


def drained(snapshot: dict[str, Any]) -> bool:
    return not (snapshot["running"] or snapshot["waiting"] or snapshot["swapped"])


def listen_during_burst(server: Served, **headers: str) -> list[dict[str, Any]]:
    """Every snapshot from subscribing until the feed shows the burst finished and drained."""
    snapshots: list[dict[str, Any]] = []
    subscribed = threading.Event()

    def listen() -> None:
        with httpx.stream("GET", server.url + FEED, headers=headers, timeout=TIMEOUT) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                subscribed.set()
                if line.startswith("data: "):
                    snapshots.append(json.loads(line[len("data: ") :]))
                    finished = sum(e["kind"] == "finished" for s in snapshots for e in s["events"])
                    if finished == BURST and drained(snapshots[-1]):
                        return

    listener = threading.Thread(target=listen)
    listener.start()
    assert subscribed.wait(TIMEOUT)
    burst(server, **headers)
    listener.join(TIMEOUT)
    assert not listener.is_alive(), "the feed never showed the burst drained"
    return snapshots


@pytest.fixture(scope="module")
def cramped(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    """16 blocks of 4 tokens for 8 slots: 8 requests of 5 + 24 tokens must preempt, by swap
    while the 8 host blocks last and by recompute after."""
    engine = llmengine.Engine(model, num_blocks=16, block_size=4, num_slots=8,
                              preemption="swap", swap_blocks=8)  # fmt: skip
    with served(engine, tokenizer) as server:
        yield server


def owners(pool: dict[str, Any]) -> list[int]:
    return [owner for owner, count in pool["owners"] for _ in range(count)]


def test_a_preempting_burst_shows_in_the_snapshots(cramped: Served) -> None:
    snapshots = listen_during_burst(cramped)
    for snapshot in snapshots:  # every block accounted for, in both pools
        assert sum(count for _, count in snapshot["pool"]["owners"]) == 16
        assert sum(count for _, count in snapshot["host"]["owners"]) == 8
        held = {row[0] for row in snapshot["running"]}
        assert {o for o in owners(snapshot["pool"]) if o >= 0} <= held
        assert {o for o in owners(snapshot["host"]) if o >= 0} == {
            r[0] for r in snapshot["swapped"]
        }
    events = [event for snapshot in snapshots for event in snapshot["events"]]
    preemptions = [event for event in events if event["kind"] == "preempt"]
    assert preemptions, "the cramped pool never preempted"
    finished = {event["request"] for event in events if event["kind"] == "finished"}
    assert len(finished) == BURST
    for event in preemptions:
        assert event["victim"] in finished and event["for"] in finished
        assert event["mode"] in ("swap", "recompute")
    # The scheduler preempts the youngest: a victim never arrived before whom it made room for.
    assert all(event["victim"] >= event["for"] for event in preemptions)
    assert {event["mode"] for event in preemptions} == {"swap", "recompute"}
    assert any(event["kind"] == "swap_in" for event in events)
    assert any(snapshot["swapped"] for snapshot in snapshots)
    last = snapshots[-1]
    assert set(owners(last["pool"])) == {FREE} and set(owners(last["host"])) == {FREE}
    assert any(s["rates"]["tokens_per_s"] > 0 for s in snapshots)
    assert last["rates"]["ttft_ms"] > 0 and last["rates"]["itl_ms"] > 0
    assert any(s["step_ms"][1] > 0 for s in snapshots)


def test_snapshots_come_at_most_once_a_step_and_once_per_100_ms(cramped: Served) -> None:
    first_step = cramped.engine.iteration
    snapshots = listen_during_burst(cramped)
    steps = cramped.engine.iteration - first_step
    assert 1 < len(snapshots) <= steps + 1  # the +1: the state sent on subscribing
    assert sum(snapshot["steps"] for snapshot in snapshots) == steps
    gaps = [b["t"] - a["t"] for a, b in zip(snapshots, snapshots[1:], strict=False)]
    assert min(gaps) >= engine_events.INTERVAL - 0.002, gaps
    # Coalesced: some snapshot stands for several steps, and carries all their events.
    assert max(snapshot["steps"] for snapshot in snapshots) > 1


def test_nobody_listening_builds_nothing_and_a_leaver_is_dropped(
    cramped: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = []
    real = engine_events.engine_state
    monkeypatch.setattr(engine_events, "engine_state", lambda e: built.append(1) or real(e))
    events = cramped.app.state.engine_loop.events
    assert wait_until(lambda: not events.listening)  # the previous tests' listeners left
    burst(cramped)
    assert built == [] and events._events == []
    with httpx.stream("GET", cramped.url + FEED, timeout=TIMEOUT) as response:
        lines = response.iter_lines()
        assert next(lines).startswith(":")
        assert next(line for line in lines if line.startswith("data: "))
        assert events.listening and built == [1]
    assert wait_until(lambda: not events.listening)


def test_a_slow_subscriber_loses_its_oldest_snapshots_not_the_engines_time() -> None:
    async def offer_too_many() -> list[str]:
        subscriber = Subscriber(asyncio.get_running_loop())
        for index in range(QUEUE_SIZE + 5):
            subscriber.offer(str(index))
        return [subscriber.queue.get_nowait() for _ in range(subscriber.queue.qsize())]

    kept = asyncio.run(offer_too_many())
    assert kept == [str(index) for index in range(5, QUEUE_SIZE + 5)]


def test_owners_are_run_length_encoded() -> None:
    assert run_length([FREE, FREE, 3, 3, 3, CACHED, 3]) == [[FREE, 2], [3, 3], [CACHED, 1], [3, 1]]
    assert run_length([]) == []


@pytest.fixture(scope="module")
def guarded(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=16, block_size=4, num_slots=8)
    with served(engine, tokenizer, api_key="sesame",
                allowed_origins=["http://good.example"]) as server:  # fmt: skip
        yield server


def test_the_feed_needs_the_key_and_the_page_does_not(guarded: Served) -> None:
    refused = httpx.get(guarded.url + FEED, timeout=TIMEOUT)
    assert refused.status_code == 401
    wrong = httpx.get(guarded.url + FEED, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    page = httpx.get(guarded.url + "/dashboard", timeout=TIMEOUT)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "/v1/engine/events" in page.text and "sesame" not in page.text
    document = httpx.get(guarded.url + "/openapi.json", timeout=TIMEOUT).json()
    responses = document["paths"][FEED]["get"]["responses"]
    assert list(responses["200"]["content"]) == ["text/event-stream"] and "401" in responses
    snapshots = listen_during_burst(guarded, Authorization="Bearer sesame")
    assert any(event["kind"] == "preempt" for s in snapshots for event in s["events"])


@pytest.mark.parametrize("path", [FEED, "/dashboard"])
def test_other_origins_are_refused_as_the_api_refuses_them(guarded: Served, path: str) -> None:
    def preflight(origin: str) -> httpx.Response:
        headers = {"Origin": origin, "Access-Control-Request-Method": "GET",
                   "Access-Control-Request-Headers": "authorization"}  # fmt: skip
        return httpx.options(guarded.url + path, headers=headers, timeout=TIMEOUT)

    allowed = preflight("http://good.example")
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "http://good.example"
    refused = preflight("http://evil.example")
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers
    api = httpx.options(guarded.url + "/v1/models", headers=dict(refused.request.headers))
    assert api.status_code == refused.status_code  # the same answer as the API's


def test_a_shutdown_ends_the_feed_at_once(model: llmengine.Llama, tokenizer: Any) -> None:
    engine = llmengine.Engine(model, num_blocks=16, block_size=4, num_slots=2)
    with served(engine, tokenizer) as server:
        with httpx.stream("GET", server.url + FEED, timeout=TIMEOUT) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            started = time.monotonic()
            server.app.state.drain.begin(timeout=TIMEOUT)
            assert [line for line in lines if line] == []  # it ends, with no snapshot after
            assert time.monotonic() - started < 5  # not the keepalive's 15 s, nor the drain's
        assert httpx.get(server.url + FEED, timeout=TIMEOUT).status_code == 503


def test_no_dashboard_serves_neither_route(model: llmengine.Llama, tokenizer: Any) -> None:
    assert build_parser().parse_args(["serve", "--no-dashboard"]).dashboard is False
    assert build_parser().parse_args(["serve"]).dashboard is True
    engine = llmengine.Engine(model, num_blocks=16, block_size=4, num_slots=2)
    with served(engine, tokenizer, dashboard=False) as server:
        for path in ("/dashboard", FEED):
            assert httpx.get(server.url + path, timeout=TIMEOUT).status_code == 404, path
        assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 200

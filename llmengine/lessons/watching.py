"""Lesson 29's reader of a live server's feed, and what the lesson computes from it.

`FeedRecorder` listens to `GET /v1/engine/events` (Server-Sent Events, one JSON snapshot per
step or per 100 ms, `llmengine.server.engine_events` describes the format) on a thread of
its own while the lesson drives a workload, and stops once the feed has reported every
request of that workload finished, or at a bound in snapshots or seconds (an error: the
recording is then partial). The functions
below turn the recorded snapshots into what the earlier lessons drew from finished runs: the
pool over time (blocks per request, free, cached), the preemptions (who gave way for whom,
at which step), each request's state from snapshot to snapshot, and the rates.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from llmengine.bench.workloads import RequestSpec, uniform_burst
from llmengine.server.engine_snapshot import CACHED, FREE

FEED_PATH = "/v1/engine/events"
MAX_SNAPSHOTS = 2000  # at ten a second, over three minutes of feed
MAX_SECONDS = 60.0

# The lesson's burst and servers: every prompt opens with the same 32 tokens (two blocks a
# prefix cache can share), then 16 of its own, and asks for 64 tokens past any end token.
REQUESTS, SHARED_LEN, OWN_LEN, MAX_TOKENS = 16, 32, 16, 64
BLOCK_SIZE, LIVE_POOL, LIVE_SLOTS, ROOMY_POOL = 16, 24, 8, 256
SEED = 29


def lesson_burst() -> list[RequestSpec]:
    """`REQUESTS` greedy requests, `SHARED_LEN` shared prompt tokens then `OWN_LEN` seeded
    ones each (ids below 1,000), `MAX_TOKENS` tokens each with `ignore_eos`."""
    shared = tuple(uniform_burst(1, SHARED_LEN, 1, vocab_size=1000, seed=SEED)[0].prompt_token_ids)
    return [
        replace(spec, prompt_token_ids=shared + spec.prompt_token_ids)
        for spec in uniform_burst(REQUESTS, OWN_LEN, MAX_TOKENS, vocab_size=1000, seed=SEED + 1)
    ]


def parse_sse(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    """The JSON object of every `data:` line; comments (`: keepalive`) and blanks skipped."""
    for line in lines:
        if line.startswith("data:"):
            yield json.loads(line[len("data:") :])


def finished_ids(snapshots: Iterable[dict[str, Any]]) -> set[int]:
    """Every request the snapshots' events report finished."""
    return {
        event["request"]
        for snapshot in snapshots
        for event in snapshot["events"]
        if event["kind"] == "finished"
    }


@dataclass
class FeedRecorder:
    """Record `{url}/v1/engine/events` on a thread until `expected` requests have finished.

    Use it as a context manager around the workload: entering waits for the first snapshot
    (the feed sends the current state to a new listener), leaving waits for the thread and
    raises unless every expected request was heard finishing. The recording is bounded by
    `max_snapshots` and `max_seconds` whatever the server does.
    """

    url: str
    expected: int
    max_snapshots: int = MAX_SNAPSHOTS
    max_seconds: float = MAX_SECONDS
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    _connected: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> FeedRecorder:
        self._thread = threading.Thread(target=self._read, name="feed-recorder", daemon=True)
        self._thread.start()
        if not self._connected.wait(self.max_seconds):
            raise TimeoutError(f"no snapshot from {self.url}{FEED_PATH} in {self.max_seconds} s")
        self._raise_if_failed()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        """Wait for the thread, then raise if the feed failed or stopped at a bound before
        every request finished: a partial recording would draw a run that did not happen.
        When the workload itself raised, return at once (the thread is a daemon, and the
        server's shutdown ends its stream)."""
        assert self._thread is not None
        if exc_type is not None:
            return
        self._thread.join(self.max_seconds)
        self._raise_if_failed()
        finished = len(finished_ids(self.snapshots))
        if finished < self.expected:
            raise RuntimeError(
                f"the feed reported {finished} of {self.expected} requests finished within "
                f"its bounds ({len(self.snapshots)} snapshots, {self.max_seconds} s)"
            )

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"reading the feed failed: {self.error}") from self.error

    def _read(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        seen: set[int] = set()
        try:
            timeout = httpx.Timeout(10.0, read=self.max_seconds)
            with httpx.stream("GET", self.url + FEED_PATH, timeout=timeout) as response:
                response.raise_for_status()
                for snapshot in parse_sse(response.iter_lines()):
                    self.snapshots.append(snapshot)
                    self._connected.set()
                    seen |= finished_ids([snapshot])
                    if (
                        len(seen) >= self.expected
                        or len(self.snapshots) >= self.max_snapshots
                        or time.monotonic() > deadline
                    ):
                        return
        except BaseException as error:  # handed to the lesson's thread, which raises it
            self.error = error
        finally:
            self._connected.set()


def expand_owners(runs: Sequence[Sequence[int]]) -> list[int]:
    """The block-by-block owners of a run-length encoded `owners` list."""
    return [owner for owner, count in runs for _ in range(count)]


@dataclass(frozen=True, slots=True)
class PoolOverTime:
    """The pool at every snapshot: `held[r][i]` blocks of request r at snapshot i, `t[i]`
    seconds after the first snapshot."""

    t: list[float]
    steps: list[int]
    held: dict[int, list[int]]
    free: list[int]
    cached: list[int]
    size: int


def pool_over_time(snapshots: Sequence[dict[str, Any]]) -> PoolOverTime:
    """Blocks per request, free and cached blocks, snapshot by snapshot."""
    counts = []
    for snapshot in snapshots:
        owned: dict[int, int] = {}
        for owner, count in snapshot["pool"]["owners"]:
            owned[owner] = owned.get(owner, 0) + count
        counts.append(owned)
    requests = sorted({owner for owned in counts for owner in owned if owner >= 0})
    return PoolOverTime(
        t=[snapshot["t"] - snapshots[0]["t"] for snapshot in snapshots],
        steps=[snapshot["step"] for snapshot in snapshots],
        held={request: [owned.get(request, 0) for owned in counts] for request in requests},
        free=[owned.get(FREE, 0) for owned in counts],
        cached=[owned.get(CACHED, 0) for owned in counts],
        size=snapshots[0]["pool"]["size"] if snapshots else 0,
    )


@dataclass(frozen=True, slots=True)
class Preemption:
    """One preemption the feed reported: at which step (and the time of the snapshot that
    carried it), the victim, the request whose growth took its blocks, and the mode."""

    t: float
    step: int
    victim: int
    made_room_for: int
    mode: str


def preemptions(snapshots: Iterable[dict[str, Any]]) -> list[Preemption]:
    """Every `preempt` event, oldest first, timed like `pool_over_time` (the first snapshot
    at 0)."""
    snapshots = list(snapshots)
    return [
        Preemption(
            snapshot["t"] - snapshots[0]["t"],
            event["step"],
            event["victim"],
            event["for"],
            event["mode"],
        )
        for snapshot in snapshots
        for event in snapshot["events"]
        if event["kind"] == "preempt"
    ]


def states_over_time(snapshots: Iterable[dict[str, Any]]) -> dict[int, list[tuple[int, str]]]:
    """Each request's `(step, state)` at every snapshot that lists it in a queue."""
    states: dict[int, list[tuple[int, str]]] = {}
    for snapshot in snapshots:
        for queue in ("running", "waiting", "swapped"):
            for request_id, _, _, state in snapshot[queue]:
                states.setdefault(request_id, []).append((snapshot["step"], state))
    return states


def dropped_events(snapshots: Iterable[dict[str, Any]]) -> int:
    """Events the feed had to leave out (over `MAX_EVENTS` between two snapshots)."""
    return sum(snapshot.get("dropped", 0) for snapshot in snapshots)


def step_gaps(snapshots: Sequence[dict[str, Any]]) -> list[int]:
    """Steps between consecutive snapshots (each snapshot's `steps`), the first left out."""
    return [snapshot["steps"] for snapshot in snapshots[1:]]

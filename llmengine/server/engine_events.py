"""The engine's live feed (`GET /v1/engine/events`): one JSON snapshot per step or per
100 ms, whichever is rarer, to every page that listens.

The engine thread calls `record` after each step and `publish_if_due` after each turn of its
loop. With no subscriber both return after one check, so a server nobody watches pays
nothing more. With subscribers, `record` keeps the step's events (preemptions, swaps,
prefix-cache hits, speculation, constrained admissions, finished requests) and its times,
and `publish_if_due` builds one snapshot when 100 ms have passed since the last one (the
loop waits at most that long while one is owed, so the last state of a burst is always
sent), serialises it once and hands the text to each subscriber's asyncio loop. A
subscriber's queue is bounded and drops its oldest snapshot when full, so a slow page falls
behind without ever blocking the engine; one that disconnects is removed at once.

A snapshot is a JSON object:

- `t`: seconds since the feed started; `step`: the engine's step count; `steps`: steps
  since the previous snapshot.
- `pool`: `{"size", "block_size", "owners"}` and `host` (the swap space): `{"size",
  "owners"}`, where `owners` is the blocks' owners run-length encoded as `[owner, count]`
  pairs in block order: a request id, -1 for a free block, -2 for a prefix-cached block
  nobody holds (`llmengine.server.engine_snapshot`).
- `running`, `waiting`, `swapped`: `[id, prompt tokens, tokens so far, state]` per request
  in admission order; state is prefill, decode, waiting, preempted or swapped.
- `events` since the previous snapshot, oldest first, each with its `step` and `kind`:
  `preempt` (`victim`, `for`: the request whose growth took its blocks, `mode`: "swap" or
  "recompute"), `swap_in` (`request`), `prefix_hit` (`request`, `tokens`), `spec`
  (`proposed`, `accepted`: the step's drafted tokens), `constrained` (`request`, admitted
  with a grammar), `finished` (`request`). At most `MAX_EVENTS` are kept; `dropped` counts
  the rest.
- `rates`: `tokens_per_s` since the previous snapshot, and `ttft_ms` and `itl_ms`, the mean
  time to first token and inter-token latency over the last minute the feed has listened
  (null when there was none).
- `step_ms`: `[host, forward]`, the mean milliseconds per step since the previous snapshot
  spent outside the forward and in it (`IterationOutcome.forward_seconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmengine.engine import Engine
from llmengine.outcome import IterationOutcome
from llmengine.server.engine_snapshot import engine_state
from llmengine.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from prometheus_client import Histogram

INTERVAL = 0.1  # seconds: at most ten snapshots a second, however fast the engine steps
WINDOW = 60.0  # seconds of latency the rates average over
QUEUE_SIZE = 16  # snapshots a slow subscriber may fall behind before the oldest are dropped
MAX_EVENTS = 256  # events one snapshot carries at most


class Subscriber:
    """One listening page: its asyncio loop and a bounded queue of snapshot texts."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(QUEUE_SIZE)

    def deliver(self, text: str | None) -> None:
        """From any thread: hand `text` to the subscriber's loop (RuntimeError once that loop
        is closed)."""
        self.loop.call_soon_threadsafe(self.offer, text)

    def offer(self, text: str | None) -> None:
        """Queue a snapshot (None: the end of the feed) on the subscriber's loop, dropping
        the oldest when full."""
        if self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(text)


class FeedSubscribers:
    """The pages listening to the feed: subscribed and dropped on the asyncio side, sent to
    from any thread. `subscribed` is what a new subscriber sets off."""

    def __init__(self) -> None:
        self._subscribers: tuple[Any, ...] = ()  # replaced whole: read lock-free

    @property
    def listening(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self) -> Subscriber:
        """A new subscriber on the running asyncio loop."""
        subscriber = Subscriber(asyncio.get_running_loop())
        self.attach(subscriber)
        return subscriber

    def attach(self, subscriber: Any) -> None:
        """Send `subscriber` (anything with `deliver(text)`) every snapshot from now on."""
        self._subscribers = (*self._subscribers, subscriber)
        self.subscribed()

    def subscribed(self) -> None:
        """Called once a subscriber is attached; nothing here."""

    def unsubscribe(self, subscriber: Any) -> None:
        self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

    def close(self) -> None:
        """End every subscriber's stream (the server is shutting down): an open page must
        not hold the shutdown up. Safe from any thread."""
        self.send(None)

    def send(self, text: str | None) -> None:
        """`text` (None: the end of the feed) to every subscriber, from any thread."""
        for subscriber in self._subscribers:
            # RuntimeError: that loop is closed, so nobody is listening there any more.
            with contextlib.suppress(RuntimeError):
                subscriber.deliver(text)


class EngineEvents(FeedSubscribers):
    """The feed's subscribers and what the engine thread gathers for them between snapshots.

    `wake` is called (from any thread) when a subscriber arrives, so that an idle engine
    loop turns once and sends it the current state."""

    def __init__(self, metrics: ServerMetrics) -> None:
        super().__init__()
        self.metrics = metrics
        self.wake: Callable[[], None] | None = None  # set by the engine loop
        self._started = time.monotonic()
        self._reset()
        self._last_sent = float("-inf")
        self._owed = False  # something happened since the last snapshot
        self._window: deque[tuple[float, float, float, float, float]] = deque()

    def subscribed(self) -> None:
        """The next turn of the engine loop sends the new subscriber the current state."""
        self._owed = True
        if self.wake is not None:
            self.wake()

    # -- the engine thread --------------------------------------------------------------------

    def record(self, engine: Engine, outcome: IterationOutcome, seconds: float) -> None:
        """Keep one step's events and times for the next snapshot (nothing with no listener)."""
        if not self._subscribers:
            return
        self._owed = True
        self._steps += 1
        self._step_seconds += seconds
        self._forward_seconds += outcome.forward_seconds
        self._tokens += outcome.num_new_tokens
        step, swapped = outcome.iteration, set(outcome.swapped_out)
        for victim in outcome.evicted:
            mode = "swap" if victim in swapped else "recompute"
            self._add(step, "preempt", victim=victim, mode=mode,
                      **{"for": outcome.evicted_for.get(victim, victim)})  # fmt: skip
        for request_id in outcome.swapped_in:
            self._add(step, "swap_in", request=request_id)
        for request_id, tokens in outcome.cached_prefix.items():
            self._add(step, "prefix_hit", request=request_id, tokens=tokens)
        if outcome.drafts:
            self._add(step, "spec", proposed=outcome.num_draft_tokens,
                      accepted=outcome.num_accepted_tokens)  # fmt: skip
        resumed = set(outcome.resumed)
        for request_id in outcome.admitted:
            if request_id not in resumed and engine.request(request_id).params.constraint:
                self._add(step, "constrained", request=request_id)
        for request_id in outcome.finished:
            self._add(step, "finished", request=request_id)

    def wait_limit(self) -> float | None:
        """How long the engine loop may block for a command: until an owed snapshot is due
        (None: no limit)."""
        if not (self._subscribers and self._owed):
            return None
        return max(0.0, self._last_sent + INTERVAL - time.monotonic())

    def publish_if_due(self, engine: Engine) -> None:
        """Send a snapshot if one is owed and the last went out `INTERVAL` ago or more."""
        subscribers = self._subscribers
        if not (subscribers and self._owed):
            return
        now = time.monotonic()
        if now - self._last_sent < INTERVAL:
            return
        self.send(json.dumps(self.snapshot(engine, now), separators=(",", ":")))

    def snapshot(self, engine: Engine, now: float) -> dict[str, Any]:
        """The engine's state now and what happened since the previous snapshot."""
        elapsed = now - self._last_sent
        steps = self._steps
        snapshot = {
            "t": round(now - self._started, 3),
            "step": engine.iteration,
            "steps": steps,
            **engine_state(engine),
            "events": self._events,
            "rates": self._rates(now, elapsed),
            "step_ms": [
                round(1e3 * (self._step_seconds - self._forward_seconds) / max(steps, 1), 3),
                round(1e3 * self._forward_seconds / max(steps, 1), 3),
            ],
        }
        if self._dropped:
            snapshot["dropped"] = self._dropped
        self._last_sent, self._owed = now, False
        self._reset()
        return snapshot

    def _reset(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._dropped = 0
        self._steps = 0
        self._step_seconds = 0.0
        self._forward_seconds = 0.0
        self._tokens = 0

    def _add(self, step: int, kind: str, **fields: Any) -> None:
        if len(self._events) < MAX_EVENTS:
            self._events.append({"step": step, "kind": kind, **fields})
        else:
            self._dropped += 1

    def _rates(self, now: float, elapsed: float) -> dict[str, float | None]:
        """Tokens per second since the previous snapshot; mean TTFT and ITL over the last
        `WINDOW` seconds, from the sums and counts of the server's latency histograms."""
        sample = (now, *sum_and_count(self.metrics.time_to_first_token),
                  *sum_and_count(self.metrics.inter_token_latency))  # fmt: skip
        self._window.append(sample)
        while now - self._window[0][0] > WINDOW:
            self._window.popleft()
        first = self._window[0]

        def mean_ms(index: int) -> float | None:
            count = sample[index + 1] - first[index + 1]
            return round(1e3 * (sample[index] - first[index]) / count, 3) if count else None

        return {
            "tokens_per_s": round(self._tokens / elapsed, 2) if elapsed > 0 else 0.0,
            "ttft_ms": mean_ms(1),
            "itl_ms": mean_ms(3),
        }


def sum_and_count(histogram: Histogram) -> tuple[float, float]:
    """A Prometheus histogram's running sum and count of observations."""
    values = {s.name.rsplit("_", 1)[-1]: s.value for s in histogram.collect()[0].samples}
    return values["sum"], values["count"]

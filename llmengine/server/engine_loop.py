"""The engine on a thread of its own, and the hand-off between it and the asyncio side.

The engine is not thread-safe and its step is a blocking forward, so it lives on exactly one
background thread, which owns it: nothing else calls it. The HTTP side talks to it through a
queue of commands (add, abort, stop). The thread takes every pending command, then steps
once if anything is unfinished, and blocks on the queue when idle (no busy spin). Each
engine request's tokens go back to the asyncio loop that asked for it, into an asyncio.Queue
of its own, via `loop.call_soon_threadsafe`. A request that ends (finished or aborted) has
its record released from the engine at once, so a server that runs for ever holds none.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmengine.engine import Engine
from llmengine.outcome import IterationOutcome
from llmengine.params import SamplingParams
from llmengine.server.metrics import ServerMetrics

logger = logging.getLogger("llmengine.server")


class QueueFull(Exception):
    """More requests would wait than the server allows (HTTP 429)."""


class EngineStopped(Exception):
    """The engine loop stopped (shutdown, or a failed step) before the request ended."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One token of one engine request; `finish_reason` is set on its last."""

    request_id: int
    token_id: int
    logprobs: Any = None  # llmengine.outcome.TokenLogprobs when the request asked for them
    finish_reason: str | None = None


@dataclass(slots=True)
class _Sink:
    """Where one engine request's events go (the queue it shares with the other requests of
    the same add), and its timing for the latency histograms."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    added_at: float
    last_token_at: float | None = None

    def put(self, event: TokenEvent | Exception) -> None:
        # RuntimeError: that event loop is closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass(frozen=True, slots=True)
class _Add:
    prompts: list[list[int]]
    params: list[SamplingParams]
    loop: asyncio.AbstractEventLoop
    future: concurrent.futures.Future


@dataclass(frozen=True, slots=True)
class _Abort:
    request_ids: tuple[int, ...]


_STOP = object()


class EngineLoop:
    """Runs `engine` on a background thread; `add` and `abort` may be called from anywhere.

    `max_waiting` bounds the requests waiting for a slot: an add that would take it past
    that is refused with `QueueFull`, checked on the engine thread, so the bound is exact.
    """

    def __init__(self, engine: Engine, metrics: ServerMetrics, *, max_waiting: int) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_waiting = max_waiting
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[int, _Sink] = {}
        self._thread: threading.Thread | None = None
        metrics.kv_blocks_total.set(engine.num_blocks)
        self._publish()

    # -- the asyncio side ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop is already started")
        self._thread = threading.Thread(target=self._run, name="llmengine-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort what is in flight, end the thread and wait for it."""
        if self._thread is None:
            return
        self._commands.put(_STOP)
        self._thread.join(timeout)
        self._thread = None
        self._refuse_pending()  # an add that slipped in as the thread ended

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def add(
        self, prompts: Sequence[list[int]], params: Sequence[SamplingParams]
    ) -> tuple[list[int], asyncio.Queue]:
        """Queue one engine request per prompt: their ids, and the queue their events arrive on.

        Events are `TokenEvent`s in the order the engine produced them, or an `EngineStopped`
        if the loop ends first. All or none: ValueError (the engine's refusal) or QueueFull
        leaves nothing queued. If the caller is cancelled while the engine thread adds, the
        requests are aborted.
        """
        if not self.running:
            raise EngineStopped("the engine is not running")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_Add(list(prompts), list(params), asyncio.get_running_loop(), future))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._abort_if_added)
            raise

    def _abort_if_added(self, future: concurrent.futures.Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self.abort(future.result()[0])

    def abort(self, request_ids: Sequence[int]) -> None:
        """Ask the engine thread to abort these requests (finished ones are left alone)."""
        if request_ids:
            self._commands.put(_Abort(tuple(request_ids)))

    # -- the engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            # Block for a command only when there is nothing to step.
            try:
                command = self._commands.get(block=not self.engine.has_unfinished())
            except queue.Empty:
                command = None
            while command is not None:
                if command is _STOP:
                    self._abort_all(EngineStopped("the server is shutting down"))
                    self._refuse_pending()
                    return
                self._handle(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if self.engine.has_unfinished():
                self._step()
            self._publish()

    def _handle(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            for request_id in command.request_ids:
                self._end(request_id, abort=True)
            return
        if not command.future.set_running_or_notify_cancel():
            return
        waiting = len(self.engine.scheduler.waiting)
        if waiting + len(command.prompts) > self.max_waiting:
            command.future.set_exception(
                QueueFull(f"{waiting} requests are waiting already (at most {self.max_waiting})")
            )
            return
        try:
            ids = self.engine.add_requests(command.prompts, command.params)
        except ValueError as error:
            command.future.set_exception(error)
            return
        now = time.perf_counter()
        events: asyncio.Queue = asyncio.Queue()
        for request_id, prompt in zip(ids, command.prompts, strict=True):
            self._sinks[request_id] = _Sink(command.loop, events, now)
            self.metrics.prompt_tokens.inc(len(prompt))
        command.future.set_result((ids, events))

    def _step(self) -> None:
        try:
            outcome = self.engine.step()
        except Exception as error:  # a broken engine must not leave clients waiting for ever
            logger.exception("engine step failed; aborting every request in flight")
            self._abort_all(EngineStopped(f"the engine failed: {error}"))
            return
        self._deliver(outcome)

    def _deliver(self, outcome: IterationOutcome) -> None:
        now = time.perf_counter()
        self.metrics.preemptions.inc(len(outcome.evicted))
        self.metrics.generation_tokens.inc(len(outcome.tokens))
        self.metrics.forward_tokens.inc(outcome.forward_tokens)
        self.metrics.prefix_cache_hit_tokens.inc(outcome.cached_tokens)
        logprobs = getattr(outcome, "logprobs", None) or {}
        finished = set(outcome.finished)
        for request_id, token_id in outcome.tokens.items():
            sink = self._sinks.get(request_id)
            if sink is None:
                continue
            if sink.last_token_at is None:
                self.metrics.time_to_first_token.observe(now - sink.added_at)
            else:
                self.metrics.inter_token_latency.observe(now - sink.last_token_at)
            sink.last_token_at = now
            reason = None
            if request_id in finished:
                reason = self.engine.request(request_id).finish_reason
            sink.put(TokenEvent(request_id, token_id, logprobs.get(request_id), reason))
        for request_id in finished:
            self._end(request_id, abort=False)

    def _end(self, request_id: int, *, abort: bool) -> None:
        """Forget a request: abort it if asked (False for a finished one), release its record."""
        sink = self._sinks.pop(request_id, None)
        if sink is None:
            return  # already ended: an abort that lost the race with the last token
        if abort:
            self.engine.abort(request_id)
        record = self.engine.release(request_id)
        self.metrics.requests_finished.labels(record.finish_reason or "abort").inc()

    def _abort_all(self, error: Exception) -> None:
        """Tell every waiting client `error` and end its requests."""
        for request_id in list(self._sinks):
            self._sinks[request_id].put(error)
            try:
                self._end(request_id, abort=True)
            except (KeyError, ValueError):  # a step that failed half-way: forget it anyway
                self._sinks.pop(request_id, None)
        self._publish()

    def _refuse_pending(self) -> None:
        """Fail every add still queued, so that no caller waits for a thread that has ended."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add) and command.future.set_running_or_notify_cancel():
                command.future.set_exception(EngineStopped("the server is shutting down"))

    def _publish(self) -> None:
        scheduler = self.engine.scheduler
        self.metrics.requests_running.set(len(scheduler.running))
        self.metrics.requests_waiting.set(len(scheduler.waiting))
        self.metrics.requests_swapped.set(len(scheduler.swapped))
        self.metrics.kv_blocks_free.set(self.engine.num_free_blocks)

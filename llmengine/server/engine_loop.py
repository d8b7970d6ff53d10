"""The engine on a thread of its own, and the hand-off between it and the asyncio side.

The engine is not thread-safe and its step is a blocking forward, so it lives on exactly one
background thread, which owns it: nothing else calls it. What the HTTP side must know of it
(the model's length and vocabulary, the pool, a grammar compiler that is safe from any
thread) is read once, as `EngineFacts`, before that thread starts. The HTTP side talks to it
through a queue of commands (add, abort, stop). The thread takes every pending command, then
steps once if anything is unfinished, and blocks on the queue when idle (no busy spin). Each
engine request's tokens go back to the asyncio loop that asked for it, into an asyncio.Queue
of its own: a step's events for one loop go in one `loop.call_soon_threadsafe`, since each
such call writes to the loop's wake-up socket (a system call per token and stream
otherwise). A request that ends (finished or aborted) has its record released from the
engine at once, so a server that runs for ever holds none.
The live feed (`EngineEvents`) is fed on this thread too: each step's outcome and time, and
a snapshot of the pool and queues when one is due and someone listens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmengine.engine import Engine
from llmengine.outcome import IterationOutcome
from llmengine.params import SamplingParams
from llmengine.server.engine_events import EngineEvents
from llmengine.server.metrics import ServerMetrics
from llmengine.structured.grammar import GrammarCompiler

logger = logging.getLogger("llmengine.server")


class QueueFull(Exception):
    """More requests would wait than the server allows (HTTP 429)."""


class EngineStopped(Exception):
    """The engine loop stopped (shutdown, or a failed step) before the request ended."""


class RequestFailed(Exception):
    """The engine could not go on with one request (its logits were not finite, say, or
    handling it raised); the others go on."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One token of one engine request; `finish_reason` is set on its last."""

    request_id: int
    token_id: int
    logprobs: Any = None  # llmengine.outcome.TokenLogprobs when the request asked for them
    finish_reason: str | None = None
    cached_tokens: int = 0  # prompt tokens the prefix cache served when it was first admitted


@dataclass(frozen=True, slots=True)
class PromptEvent:
    """Logprobs of some of one engine request's prompt tokens, in prompt order (token 1 on),
    sent before any of its generated tokens."""

    request_id: int
    logprobs: list[Any]  # llmengine.outcome.TokenLogprobs


@dataclass(slots=True)
class _Sink:
    """Where one engine request's events go (`group`: what the add that brought it answered
    with, shared by the other requests of that add), and its timing for the latency
    histograms."""

    group: Any
    added_at: float
    last_token_at: float | None = None
    cached_tokens: int | None = None  # set when first admitted


def _put_all(posted: list[tuple[asyncio.Queue, TokenEvent | PromptEvent | Exception]]) -> None:
    """On the asyncio loop: each posted event into its queue, in the order posted."""
    for events, event in posted:
        events.put_nowait(event)


def hand_over(posted: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]]) -> None:
    """Hand each asyncio loop the (queue, event) pairs posted for it, in one call per loop."""
    for loop, events in posted.items():
        # RuntimeError: that event loop is closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_put_all, events)


class LocalReply:
    """How an add made on an asyncio loop of this process is answered: its ids and the queue
    of its events, through a future; its events go to that queue on that loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, future: concurrent.futures.Future) -> None:
        self.loop = loop
        self.future = future

    def claim(self) -> bool:
        """False if the caller gave up before the engine thread took the add."""
        return self.future.set_running_or_notify_cancel()

    @property
    def answered(self) -> bool:
        return self.future.done()

    def open(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue]:
        """The group the add's events go to: its loop and a queue of their own."""
        return self.loop, asyncio.Queue()

    def accept(self, request_ids: list[int], group: Any) -> None:
        self.future.set_result((request_ids, group[1]))

    def refuse(self, error: Exception) -> None:
        self.future.set_exception(error)


async def answer_of_add(
    future: concurrent.futures.Future, abort: Callable[[Sequence[int]], None]
) -> tuple[list[int], asyncio.Queue]:
    """Wait for an add's answer; a caller cancelled meanwhile has `abort` end its requests
    once they are added, so that none runs for nobody."""
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:

        def abort_if_added(done: concurrent.futures.Future) -> None:
            if not done.cancelled() and done.exception() is None:
                abort(done.result()[0])

        future.add_done_callback(abort_if_added)
        raise


@dataclass(frozen=True, slots=True)
class _Add:
    prompts: list[list[int]]
    params: list[SamplingParams]
    reply: Any  # a LocalReply, or what the engine's own process answers an add through


@dataclass(frozen=True, slots=True)
class _Abort:
    request_ids: tuple[int, ...]
    reason: str  # the metrics' label: "abort", or "stop" for a stop string


@dataclass(frozen=True, slots=True)
class _FailAll:
    reason: str


_STOP = object()
_WAKE = object()  # turn the loop once: a feed subscriber wants the current state


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What the HTTP side knows of the engine, read before the engine thread starts: the
    model's positions and vocabulary, the pool, and the grammar compiler the model runner
    owns (thread-safe; None for an engine without a tokenizer)."""

    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    num_slots: int
    grammar_compiler: GrammarCompiler | None

    @classmethod
    def of(cls, engine: Engine) -> EngineFacts:
        config = engine.model.config
        return cls(
            max_model_len=config.max_position_embeddings,
            vocab_size=config.vocab_size,
            num_blocks=engine.num_blocks,
            block_size=engine.block_size,
            num_slots=engine.num_slots,
            grammar_compiler=None if engine.tokenizer is None else engine.runner.grammar_compiler,
        )


class EngineLoop:
    """Runs `engine` on a background thread; `add` and `abort` may be called from anywhere.

    `max_waiting` bounds the requests that wait for a slot: an add whose requests could not
    all be seated at the next step (the free slots taken first by the requests already
    queued or swapped out) and would take the waiting ones past that bound is refused with
    `QueueFull`. It is checked on the engine thread, so the bound is exact.
    """

    def __init__(
        self,
        engine: Engine,
        metrics: ServerMetrics,
        *,
        max_waiting: int,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.facts = EngineFacts.of(engine)  # the asyncio side reads these, never the engine
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.on_fatal = on_fatal  # called on the engine thread if its loop cannot go on
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[int, _Sink] = {}
        # Events posted during a step (or an abort of all), by the loop they go to.
        self._posted: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        self._thread: threading.Thread | None = None
        self.events = EngineEvents(metrics)  # the live feed, fed on the engine thread
        self.events.wake = lambda: self._commands.put(_WAKE)
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
    def capacity(self) -> int:
        """The most engine requests the server ever holds at once: seated plus waiting."""
        return self.facts.num_slots + self.max_waiting

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
        reply = LocalReply(asyncio.get_running_loop(), future)
        self._commands.put(_Add(list(prompts), list(params), reply))
        return await answer_of_add(future, self.abort)

    def abort(self, request_ids: Sequence[int], reason: str = "abort") -> None:
        """Ask the engine thread to abort these requests (finished ones are left alone);
        `reason` is what the metrics count them as (a stop string's end is a "stop")."""
        if request_ids:
            self._commands.put(_Abort(tuple(request_ids), reason))

    async def render_metrics(self) -> bytes:
        """The server's metrics in the Prometheus text format."""
        return self.metrics.render()

    def fail_all(self, reason: str) -> None:
        """End every request in flight with `EngineStopped(reason)`; the loop goes on."""
        self._commands.put(_FailAll(reason))

    # -- the engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        """The loop, and what happens if it cannot go on: every open request is told, and
        `on_fatal` decides the process's fate (the server exits non-zero, for a supervisor
        to restart it, rather than live on with /health answering 503 for ever)."""
        try:
            self._loop()
        except BaseException as error:
            logger.exception("the engine loop failed; ending every request in flight")
            with contextlib.suppress(Exception):
                self._abort_all(EngineStopped(f"the engine loop failed: {error}"))
            self._refuse_pending()
            if self.on_fatal is not None:
                self.on_fatal(error)

    def _loop(self) -> None:
        while True:
            # Block for a command only when there is nothing to step, and no longer than
            # until the feed owes its listeners a snapshot.
            idle = not self.engine.has_unfinished()
            try:
                command = self._commands.get(block=idle, timeout=self.events.wait_limit())
            except queue.Empty:
                command = None
            while command is not None:
                if command is _STOP:
                    self._abort_all(EngineStopped("the server is shutting down"))
                    self._refuse_pending()
                    return
                if command is not _WAKE:
                    self._handle_one(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if self.engine.has_unfinished():
                self._step()
            self._publish()
            self.events.publish_if_due(self.engine)

    def _handle_one(self, command: _Add | _Abort | _FailAll) -> None:
        """Carry out one command; an exception fails that command's requests, not the loop."""
        try:
            self._handle(command)
        except Exception as error:
            logger.exception("handling a %s failed", type(command).__name__)
            if isinstance(command, _Add) and not command.reply.answered:
                command.reply.refuse(RequestFailed(f"adding the request failed: {error}"))

    def _handle(self, command: _Add | _Abort | _FailAll) -> None:
        if isinstance(command, _FailAll):
            self._abort_all(EngineStopped(command.reason))
            return
        if isinstance(command, _Abort):
            for request_id in command.request_ids:
                self._end(request_id, abort=True, reason=command.reason)
            return
        if not command.reply.claim():
            return
        engine = self.engine
        queued = engine.num_waiting + engine.num_swapped
        free = engine.num_slots - engine.num_running
        would_wait = max(queued + len(command.prompts) - free, 0)
        if would_wait > self.max_waiting:
            command.reply.refuse(
                QueueFull(
                    f"{len(command.prompts)} more requests would make {would_wait} wait for a "
                    f"slot (at most {self.max_waiting})"
                )
            )
            return
        try:
            ids = self.engine.add_requests(command.prompts, command.params)
        except ValueError as error:
            command.reply.refuse(error)
            return
        try:
            now = time.perf_counter()
            group = command.reply.open()
            for request_id, prompt in zip(ids, command.prompts, strict=True):
                self._sinks[request_id] = _Sink(group, now)
                self.metrics.prompt_tokens.inc(len(prompt))
        except Exception:
            for request_id in ids:  # in the engine already: take them out again
                self._sinks.pop(request_id, None)
                self.engine.abort(request_id)
                self.engine.release(request_id)
            raise
        command.reply.accept(ids, group)

    def _step(self) -> None:
        started = time.perf_counter()
        try:
            outcome = self.engine.step()
        except Exception as error:  # a broken engine must not leave clients waiting for ever
            logger.exception("engine step failed; aborting every request in flight")
            self._abort_all(EngineStopped(f"the engine failed: {error}"))
            return
        self.events.record(self.engine, outcome, time.perf_counter() - started)
        self._deliver(outcome)

    def _deliver(self, outcome: IterationOutcome) -> None:
        now = time.perf_counter()
        self.metrics.preemptions.inc(len(outcome.evicted))
        self.metrics.generation_tokens.inc(outcome.num_new_tokens)
        self.metrics.spec_decode_draft_tokens.inc(outcome.num_draft_tokens)
        self.metrics.spec_decode_accepted_tokens.inc(outcome.num_accepted_tokens)
        self.metrics.forward_tokens.inc(outcome.forward_tokens)
        self.metrics.forward_steps.labels(outcome.forward).inc()
        self.metrics.prefix_cache_hit_tokens.inc(outcome.cached_tokens)
        finished = set(outcome.finished)
        for request_id in outcome.admitted:
            sink = self._sinks.get(request_id)
            if sink is not None and sink.cached_tokens is None:
                sink.cached_tokens = outcome.cached_prefix.get(request_id, 0)
        for request_id, entries in outcome.prompt_logprobs.items():
            if (sink := self._sinks.get(request_id)) is not None:
                self._post(sink, PromptEvent(request_id, entries))
        for request_id in outcome.tokens:
            sink = self._sinks.get(request_id)
            if sink is None:
                continue
            try:
                self._deliver_tokens(request_id, outcome, sink, now, finished)
            except Exception as error:  # this request's fault: fail it, not the loop
                logger.exception("delivering request %d's token failed", request_id)
                self._fail(request_id, RequestFailed(f"delivering a token failed: {error}"))
                finished.discard(request_id)
        for request_id, reason in outcome.failed.items():  # the engine aborted these itself
            error = RequestFailed(f"the engine could not go on: {reason}")
            self._fail(request_id, error, abort=False)
        for request_id in finished:
            self._end(request_id, abort=False)
        self._send_posted()

    def _post(self, sink: _Sink, event: TokenEvent | PromptEvent | Exception) -> None:
        """Queue `event` for `sink`'s loop; `_send_posted` hands them over."""
        loop, events = sink.group
        self._posted.setdefault(loop, []).append((events, event))

    def _send_posted(self) -> None:
        """Hand each loop the events posted for it, in one call."""
        posted, self._posted = self._posted, {}
        hand_over(posted)

    def _deliver_tokens(
        self,
        request_id: int,
        outcome: IterationOutcome,
        sink: _Sink,
        now: float,
        finished: set[int],
    ) -> None:
        """One event per token the step added to the request (several with speculation, all
        arriving now), the finish reason on the last."""
        tokens = outcome.new_tokens(request_id)
        for index, token_id in enumerate(tokens):
            if sink.last_token_at is None:
                self.metrics.time_to_first_token.observe(now - sink.added_at)
            else:
                self.metrics.inter_token_latency.observe(now - sink.last_token_at)
            sink.last_token_at = now
            reason = None
            if index == len(tokens) - 1 and request_id in finished:
                reason = self.engine.request(request_id).finish_reason
            logprobs = outcome.logprobs.get(request_id)
            cached = sink.cached_tokens or 0
            self._post(sink, TokenEvent(request_id, token_id, logprobs, reason, cached))

    def _fail(self, request_id: int, error: Exception, *, abort: bool = True) -> None:
        """Tell one request's client `error` and end the request, aborting it unless the
        engine already has."""
        sink = self._sinks.get(request_id)
        if sink is not None:
            self._post(sink, error)
        self._end(request_id, abort=abort, reason="error")

    def _end(self, request_id: int, *, abort: bool, reason: str = "abort") -> None:
        """Forget a request: abort it if asked (False for a finished one), release its record.

        `reason` labels an aborted request in the metrics (a finished one has its own)."""
        sink = self._sinks.pop(request_id, None)
        if sink is None:
            return  # already ended: an abort that lost the race with the last token
        if abort:
            self.engine.abort(request_id)
        record = self.engine.release(request_id)
        self.metrics.requests_finished.labels(record.finish_reason or reason).inc()

    def _abort_all(self, error: Exception) -> None:
        """Tell every waiting client `error` and end its requests."""
        for request_id in list(self._sinks):
            self._post(self._sinks[request_id], error)
            try:
                self._end(request_id, abort=True)
            except (KeyError, ValueError):  # a step that failed half-way: forget it anyway
                self._sinks.pop(request_id, None)
        self._send_posted()
        self._publish()

    def _refuse_pending(self) -> None:
        """Fail every add still queued, so that no caller waits for a thread that has ended."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add) and command.reply.claim():
                command.reply.refuse(EngineStopped("the server is shutting down"))

    def _publish(self) -> None:
        engine = self.engine
        self.metrics.requests_running.set(engine.num_running)
        self.metrics.requests_waiting.set(engine.num_waiting)
        self.metrics.requests_swapped.set(engine.num_swapped)
        self.metrics.kv_blocks_free.set(engine.num_free_blocks)

"""The engine in a process of its own, beside the HTTP server's (`llmengine serve
--engine-process`).

In one process the engine thread and the HTTP side share one interpreter lock: while the
asyncio loop parses a request or writes a token to a socket the engine waits, and each
socket write hands the lock over and waits to get it back. On a small machine that, and not
the forward, bounds a busy server (`reports/wallclock/http-bound.md`). Here the engine runs
the same `EngineLoop` in a child process, with no HTTP in it; the server keeps an
`EngineProcess`, which answers to what the HTTP side asks of an `EngineLoop` (`add`,
`abort`, `fail_all`, `facts`, `events`, `render_metrics`, `start`, `stop`).

They talk over one pipe. The server sends commands (add, abort, fail all, listen to the
feed, render the metrics, stop); the child's loop takes them between steps as it takes its
own thread's, and sends back, per step, every event of that step in one message, the
answers to adds and metrics requests, and the live feed's snapshots. The counters and
histograms live in the child, beside the engine that feeds them, and `/metrics` asks for
them. A child that dies ends every request in flight with `EngineStopped` and calls
`on_fatal`, as a failed engine thread does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import multiprocessing
import signal
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmengine.engine import Engine
from llmengine.params import SamplingParams
from llmengine.server.engine_events import FeedSubscribers
from llmengine.server.engine_loop import (
    EngineFacts,
    EngineLoop,
    EngineStopped,
    _Abort,
    _Add,
    _FailAll,
    answer_of_add,
    hand_over,
)
from llmengine.server.metrics import ServerMetrics

logger = logging.getLogger("llmengine.server")

JOIN_TIMEOUT_S = 30.0  # how long `stop` waits for the child to end before killing it


class EngineProcess:
    """An engine built by `build()` in a child process, and the server's end of its pipe.

    The constructor starts the child and returns once the engine is built (its facts known);
    the child's ValueError or OSError if building failed on them (a bad option, a missing
    checkpoint), else RuntimeError if the child exits first. The facts carry a grammar
    compiler like the child's, built again on this side, which checks the constraints the
    HTTP side receives. `max_waiting` is read when the loop starts (`create_app` sets it).
    Call `close()` (or `stop()`) so the child ends.
    """

    def __init__(self, build: Callable[[], Engine], max_waiting: int = 0) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        # Not a daemon: a tensor-parallel engine starts worker processes of its own.
        self._process = context.Process(
            target=_engine_main, args=(child_end, build), name="llmengine-engine"
        )
        self._process.start()
        child_end.close()
        try:
            self.facts = self._wait_until_built()
        except BaseException:  # Ctrl-C during a long build, say: the child must not linger
            self._process.kill()
            self._process.join()
            self._conn.close()
            raise
        self.max_waiting = max_waiting
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.events = FeedRelay(self._send)
        self._send_lock = threading.Lock()
        self._calls = itertools.count()
        self._pending: dict[int, tuple[concurrent.futures.Future, Any]] = {}
        # An add's queue, by add: dropped with the response that reads it.
        self._queues: weakref.WeakValueDictionary[int, _EventQueue] = weakref.WeakValueDictionary()
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._ended: str | None = None  # why the engine can take no more calls

    def _wait_until_built(self) -> EngineFacts:
        while not self._conn.poll(0.5):
            if not self._process.is_alive():
                raise RuntimeError(
                    f"the engine process exited with status {self._process.exitcode} "
                    "before its engine was built (its error is above)"
                )
        kind, *message = self._conn.recv()
        if kind != "built":
            raise message[0]  # the child's own error: a bad option stays a ValueError
        return message[0]

    # -- what the HTTP side calls, as on an EngineLoop -------------------------------------------

    def start(self) -> None:
        if self._reader is not None:
            raise RuntimeError("the engine process is already started")
        self._send(("start", self.max_waiting))
        self._reader = threading.Thread(target=self._read, name="llmengine-pipe", daemon=True)
        self._reader.start()

    @property
    def capacity(self) -> int:
        return self.facts.num_slots + self.max_waiting

    @property
    def running(self) -> bool:
        started = self._reader is not None and self._ended is None
        return started and not self._stopping and self._process.is_alive()

    async def add(
        self, prompts: Sequence[list[int]], params: Sequence[SamplingParams]
    ) -> tuple[list[int], asyncio.Queue]:
        """As `EngineLoop.add`: the engine requests' ids and the queue their events arrive on."""
        if not self.running:
            raise EngineStopped("the engine is not running")
        call, future = self._call(_EventQueue(asyncio.get_running_loop()))
        self._send(("add", call, list(prompts), list(params)))
        return await answer_of_add(future, self.abort)

    def abort(self, request_ids: Sequence[int], reason: str = "abort") -> None:
        if request_ids:
            self._send(("abort", tuple(request_ids), reason))

    def fail_all(self, reason: str) -> None:
        self._send(("fail_all", reason))

    async def render_metrics(self) -> bytes:
        """The child's metrics in the Prometheus text format, as its loop renders them."""
        if not self.running:
            raise EngineStopped("the engine is not running")
        call, future = self._call(None)
        self._send(("metrics", call))
        return await asyncio.wrap_future(future)

    def stop(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Abort what is in flight and end the child (killed if it has not ended in
        `timeout` seconds); the requests still open get `EngineStopped`."""
        self._stopping = True
        self._send(("stop",))
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        self._ended = self._ended or "the server is shutting down"
        self._end_everything(self._ended)
        self._conn.close()

    close = stop

    # -- the pipe ---------------------------------------------------------------------------------

    def _call(self, queue: Any) -> tuple[int, concurrent.futures.Future]:
        call = next(self._calls)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._pending[call] = (future, queue)
        if self._ended is not None:  # the reader has already failed what was pending
            self._pending.pop(call, None)
            future.set_exception(EngineStopped(self._ended))
        return call, future

    def _send(self, message: tuple) -> None:
        """One command to the child, from any thread; a closed pipe is a stopped engine."""
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self._conn.send(message)

    def _read(self) -> None:
        """The reader thread: every message from the child, until it ends."""
        try:
            while True:
                kind, *message = self._conn.recv()
                if kind == "events":
                    self._route(message[0])
                elif kind == "answer":
                    call, result, error = message
                    future, queue = self._pending.pop(call)
                    if future.cancelled():  # its caller left: nothing may run for nobody
                        if queue is not None and error is None:
                            self.abort(result)
                    elif error is not None:
                        future.set_exception(error)
                    elif queue is not None:  # an add: its ids, and where their events go
                        self._queues[call] = queue
                        future.set_result((result, queue))
                    else:
                        future.set_result(result)
                elif kind == "feed":
                    self.events.send(message[0])
                elif kind == "failed":
                    self._fail(f"the engine loop failed: {message[0]}")
        except (EOFError, OSError):
            pass
        finally:
            self._fail("the engine process ended")

    def _fail(self, reason: str) -> None:
        """The engine can go on no more: end what is open and, unless the server is stopping
        it, tell `on_fatal` (once)."""
        if self._ended is not None:
            return
        self._ended = reason
        self._end_everything(reason)
        if not self._stopping and self.on_fatal is not None:
            self.on_fatal(RuntimeError(reason))

    def _route(self, events: list[tuple[int, Any]]) -> None:
        """A step's events to the queues they belong to, one hand-over per asyncio loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        for call, event in events:
            queue = self._queues.get(call)
            if queue is not None:  # else its response is gone: nobody reads it
                by_loop.setdefault(queue.home, []).append((queue, event))
        hand_over(by_loop)

    def _end_everything(self, reason: str) -> None:
        """Fail every call still unanswered and end every open response with EngineStopped."""
        for call in list(self._pending):
            future, _ = self._pending.pop(call, (None, None))
            if future is not None and not future.done():
                future.set_exception(EngineStopped(reason))
        self._route([(call, EngineStopped(reason)) for call in list(self._queues.keys())])
        self._queues.clear()


class _EventQueue(asyncio.Queue):
    """An add's queue of events, and the loop it lives on."""

    def __init__(self, home: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.home = home


class FeedRelay(FeedSubscribers):
    """The live feed's subscribers on the server's side; the child is told whether anyone
    listens, and sends its snapshots only then."""

    def __init__(self, command: Callable[[tuple], None]) -> None:
        super().__init__()
        self._command = command

    def subscribed(self) -> None:
        self._command(("listen", True))  # the child then sends the current state

    def unsubscribe(self, subscriber: Any) -> None:
        super().unsubscribe(subscriber)
        if not self.listening:
            self._command(("listen", False))


# -- the child --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Listen:
    listening: bool


@dataclass(frozen=True, slots=True)
class _RenderMetrics:
    call: int


class _Reply:
    """How an add from the server is answered: over the pipe, by its call number, which is
    also the group its events are sent under."""

    def __init__(self, call: int, send: Callable[[tuple], None]) -> None:
        self.call = call
        self.send = send
        self.answered = False

    def claim(self) -> bool:
        return True

    def open(self) -> int:
        return self.call

    def accept(self, request_ids: list[int], group: Any) -> None:
        self.answered = True
        self.send(("answer", self.call, request_ids, None))

    def refuse(self, error: Exception) -> None:
        self.answered = True
        self.send(("answer", self.call, None, error))


class _FeedToServer:
    """The child's one feed subscriber while the server has any: the pipe."""

    def __init__(self, send: Callable[[tuple], None]) -> None:
        self.send = send

    def deliver(self, text: str | None) -> None:
        if text is not None:  # the server ends its own subscribers' streams
            self.send(("feed", text))


class ChildEngineLoop(EngineLoop):
    """The `EngineLoop` of the engine's process: its events and answers go over the pipe, one
    message per step for the events."""

    def __init__(self, engine: Engine, max_waiting: int, send: Callable[[tuple], None]) -> None:
        super().__init__(engine, ServerMetrics(), max_waiting=max_waiting)
        self.send = send
        self._outgoing: list[tuple[int, Any]] = []
        self._feed = _FeedToServer(send)
        self.on_fatal = lambda error: send(("failed", str(error)))

    def _post(self, sink: Any, event: Any) -> None:
        self._outgoing.append((sink.group, event))

    def _send_posted(self) -> None:
        if self._outgoing:
            outgoing, self._outgoing = self._outgoing, []
            self.send(("events", outgoing))

    def _handle(self, command: Any) -> None:
        if isinstance(command, _Listen):
            self.events.unsubscribe(self._feed)
            if command.listening:  # (again): a new page gets the current state at once
                self.events.attach(self._feed)
        elif isinstance(command, _RenderMetrics):
            self.send(("answer", command.call, self.metrics.render(), None))
        else:
            super()._handle(command)

    def take(self, message: tuple) -> bool:
        """Queue the command one message from the server carries; False for "stop"."""
        kind, *fields = message
        if kind == "add":
            call, prompts, params = fields
            self._commands.put(_Add(prompts, params, _Reply(call, self.send)))
        elif kind in _COMMANDS:
            self._commands.put(_COMMANDS[kind](*fields))
        return kind != "stop"


# The server's other messages, by kind, as the loop's commands.
_COMMANDS = {"abort": _Abort, "fail_all": _FailAll, "listen": _Listen, "metrics": _RenderMetrics}


def _engine_main(conn: Any, build: Callable[[], Engine]) -> None:
    """The child's life: build the engine, wait for the server's start, then run the loop on
    its own thread while this one reads the pipe; a closed pipe stops it as "stop" does."""
    # Ctrl-C in a terminal signals the whole process group: the server drains, then stops
    # its engine; the engine must not die first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine = build()
    except (ValueError, OSError) as error:  # the options' fault: the server says it in a line
        conn.send(("build failed", error))
        conn.close()
        return
    except BaseException as error:
        conn.send(("build failed", RuntimeError(f"building the engine failed: {error!r}")))
        raise
    try:
        conn.send(("built", EngineFacts.of(engine)))  # its grammar compiler is built again
        kind, *fields = conn.recv()
        if kind != "start":
            return

        def send(message: tuple) -> None:  # only ever from the loop's thread
            with contextlib.suppress(OSError, ValueError):  # the server has gone
                conn.send(message)

        loop = ChildEngineLoop(engine, fields[0], send)
        loop.start()
        with contextlib.suppress(EOFError, OSError):
            while loop.take(conn.recv()):
                pass
        loop.stop()
    except (EOFError, OSError):
        pass  # the server went away before the start
    finally:
        engine.close()
        conn.close()

"""Running the app under uvicorn: in the foreground (`llmengine serve`), or on a thread.

`serve` is the command's: it returns 0 once SIGINT or SIGTERM has shut the server down, and
1 if the engine loop failed for good (so that a supervisor restarts the process). uvicorn
turns either signal into a graceful shutdown and re-raises it afterwards, which would kill
the process with the signal; a no-op handler installed for the duration makes that re-raise
harmless.

A shutdown begins the app's drain (`app.state.drain`: new requests get 503, the requests in
flight get up to `shutdown_timeout` seconds to finish, then each still running ends with an
error event or a JSON 503), stops taking connections, and waits for the responses to go out;
uvicorn itself waits `FINAL_WORDS_S` longer before it cancels anything, and last the app's
lifespan stops and joins the engine thread.

`serve_in_thread` is for tests, lessons and benchmarks: a real server on a background thread.

    with serve_in_thread(app) as base_url:      # e.g. "http://127.0.0.1:41237"
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")

The socket is bound here, to port 0, before uvicorn starts, so the port is free and known
with no race; the server listens on 127.0.0.1 unless told otherwise. Leaving the block
stops the server (the app's shutdown stops its engine thread) and joins its thread.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

# Drain for 20 s, plus the final words: inside the 30 s a supervisor such as Kubernetes
# allows between SIGTERM and SIGKILL by default.
SHUTDOWN_TIMEOUT = 20.0
THREAD_SHUTDOWN_TIMEOUT = 5.0  # serve_in_thread's: tests and lessons stop at once
FINAL_WORDS_S = 2.0  # after the drain's deadline: time for the error events to be sent


@contextmanager
def serve_in_thread(
    app: Any,
    *,
    host: str = "127.0.0.1",
    start_timeout: float = 30.0,
    shutdown_timeout: float = THREAD_SHUTDOWN_TIMEOUT,
    log_level: str = "warning",
) -> Iterator[str]:
    """Serve `app` with uvicorn on a free port of `host`; yields the base URL.

    RuntimeError if it has not started within `start_timeout` seconds.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(_config(app, log_level, shutdown_timeout))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(shutdown_timeout + start_timeout)
        sock.close()


def serve(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
    log_level: str = "info",
) -> int:
    """Serve `app` until SIGINT or SIGTERM (0 after a clean shutdown), or until its engine
    loop fails for good (1)."""
    config = _config(app, log_level, shutdown_timeout + FINAL_WORDS_S, host=host, port=port)
    server = _DrainingServer(config, app.state.drain, shutdown_timeout)
    failed = threading.Event()

    def on_fatal(_: BaseException) -> None:  # on the engine thread
        failed.set()
        server.should_exit = True

    app.state.engine_loop.on_fatal = on_fatal
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, _already_shutting_down) for sig in handled}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started and not failed.is_set() else 1


def _config(app: Any, log_level: str, graceful_s: float, **bind: Any) -> uvicorn.Config:
    """uvicorn's settings for both ways of serving; `bind` is the host and port of a server that
    opens its own socket (`serve_in_thread` hands uvicorn one already bound).

    The lifespan is required ("on"), not detected: the app's starts and joins the engine
    thread, and a server without it would queue requests nobody steps. `graceful_s` is how
    long uvicorn waits for the responses in flight at shutdown before it cancels them.
    """
    return uvicorn.Config(
        app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=graceful_s, **bind
    )


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, beginning the app's drain when a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, drain: Any, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.shutdown_timeout = shutdown_timeout

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.drain.begin(self.shutdown_timeout)
        super().handle_exit(sig, frame)


def _already_shutting_down(signum: int, frame: Any) -> None:
    """What a signal does once uvicorn has handled it: nothing more."""

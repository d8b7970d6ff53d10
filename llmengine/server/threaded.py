"""A real uvicorn server on a background thread, for tests, lessons and benchmarks.

    with serve_in_thread(app) as base_url:      # e.g. "http://127.0.0.1:41237"
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")

The socket is bound here, to port 0, before uvicorn starts, so the port is free and known
with no race; the server listens on 127.0.0.1 unless told otherwise. Leaving the block
stops the server (the app's shutdown stops its engine thread) and joins its thread.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_in_thread(
    app: Any, *, host: str = "127.0.0.1", start_timeout: float = 30.0, log_level: str = "warning"
) -> Iterator[str]:
    """Serve `app` with uvicorn on a free port of `host`; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
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
        thread.join(start_timeout)
        sock.close()

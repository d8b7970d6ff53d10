"""Server-Sent Events out, and noticing a client that went away, streaming or not.

A client that disconnects must have its requests aborted at once, not when its last token
would have been sent. Both helpers watch the ASGI `receive` channel for `http.disconnect`
while the work runs, and cancel the work when it arrives; the caller's clean-up
(`ChoiceRun.close`) then aborts the engine requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


def sse_event(payload: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying a JSON object."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and raising ClientGone) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ClientGone
    return task.result()


class EventStreamResponse(Response):
    """Streams `events` (already encoded SSE events), then `data: [DONE]`.

    Unlike a plain StreamingResponse it calls `on_close` however the stream ends (finished,
    client gone, error, or gone before the first event), so the engine requests behind it are
    always aborted, and at once.
    """

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        self.events = events
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await cancel_on_disconnect(receive, self._stream(send))
        except (ClientGone, OSError):
            pass  # nobody to tell
        finally:
            self.on_close()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for event in self.events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": DONE, "more_body": False})

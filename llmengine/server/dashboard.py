"""The live page (`GET /dashboard`) and the feed it reads (`GET /v1/engine/events`).

The page is one self-contained HTML file shipped in the package (`static/dashboard.html`:
its CSS and script inline, no CDN, nothing to build). It holds no data, so it loads without
the API key; the feed is under `/v1`, so it needs the key like the rest of the API, and the
same CORS rules answer other origins. The page sends the key in an `Authorization` header
from `fetch` (an `EventSource` cannot send headers), never in a URL.

The feed is Server-Sent Events: one `data:` line per snapshot (`engine_events` describes
the format), and a comment line every `KEEPALIVE` seconds of silence, so that a page that
closed is noticed (and its subscription dropped) even while the engine is idle. A
shutdown's drain ends every feed at once, so that an open page never holds it up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, StreamingResponse

from llmengine.server.engine_events import EngineEvents

KEEPALIVE = 15.0  # seconds


def page() -> str:
    """The dashboard's HTML, read from the package."""
    return files("llmengine.server").joinpath("static/dashboard.html").read_text("utf-8")


async def feed(events: EngineEvents) -> AsyncIterator[str]:
    """The SSE stream of one subscriber; its subscription ends when the stream does (the
    client left: Starlette cancels the stream, and `finally` drops it at once)."""
    subscriber = events.subscribe()
    try:
        yield ": llmengine engine events\n\n"
        while True:
            try:
                text = await asyncio.wait_for(subscriber.queue.get(), KEEPALIVE)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            if text is None:  # the server is shutting down
                return
            yield f"data: {text}\n\n"
    finally:
        events.unsubscribe(subscriber)


def add_dashboard(app: FastAPI, events: EngineEvents) -> None:
    """Mount `/dashboard` and `/v1/engine/events` on `app`."""
    html = page()

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/v1/engine/events", response_model=None)
    async def engine_events() -> StreamingResponse:
        """The engine's live snapshots, as Server-Sent Events."""
        return StreamingResponse(
            feed(events),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

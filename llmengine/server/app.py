"""The FastAPI app: routes, who may come in, how big a body may be, and the engine's life.

`create_app` wraps an `Engine` and its tokenizer. The engine loop starts with the app (its
lifespan) and stops with it: uvicorn turns SIGINT and SIGTERM into a shutdown, and the
shutdown aborts what is in flight and joins the engine thread.

A shutdown drains first (`Drain`, begun by the runner when SIGTERM or SIGINT arrives): new
`/v1` requests get a JSON 503 and `/health` turns 503, the requests in flight get up to the
shutdown timeout to finish, and those still running then end with an error (an OpenAI error
event, then `[DONE]`, on a stream; a JSON 503 otherwise), never cut off mid-body. The
dashboard's feeds, which never end by themselves, end as the drain begins.

With `allowed_origins`, CORS headers let the pages of those origins call the API from a
browser (preflights are answered before the key is checked: a browser sends none with them).
Two checks run before any route, as plain ASGI middleware: with an API key, every `/v1`
request needs `Authorization: Bearer KEY` (compared in constant time) or gets 401, while
`/health`, `/metrics` and the `/dashboard` page (which holds no data: its feed is under
`/v1`) stay open; and a body over `max_body_bytes` gets 413, whether its
Content-Length says so or it only turns out so as it streams in. Headers are never logged,
so the key never reaches a log.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmengine.engine import Engine
from llmengine.server.chat import ChatFormatter, ChatTemplate
from llmengine.server.dashboard import add_dashboard
from llmengine.server.engine_loop import EngineLoop, EngineStopped
from llmengine.server.engine_process import EngineProcess
from llmengine.server.errors import APIError, install_error_handlers
from llmengine.server.metrics import ServerMetrics
from llmengine.server.openapi import describe
from llmengine.server.protocol import ChatCompletionRequest, CompletionRequest
from llmengine.server.serving import Serving
from llmengine.server.tool_parsers import TOOL_CALL_PARSERS

MAX_BODY_BYTES = 1 << 20
# guidellm's default sweep opens 512 streams at once: a standard sweep runs without a 429.
MAX_WAITING = 1024


def create_app(
    engine: Engine | EngineProcess,
    tokenizer: Any,
    *,
    served_model_name: str,
    api_key: str | None = None,
    max_waiting: int = MAX_WAITING,
    max_body_bytes: int = MAX_BODY_BYTES,
    chat_template: ChatTemplate | None = None,
    allowed_origins: Sequence[str] = (),
    tool_call_parser: str | None = None,
    dashboard: bool = True,
) -> FastAPI:
    """An OpenAI-compatible app serving `engine` (in this process, on a thread of its own, or
    an `EngineProcess`) as the model `served_model_name`.

    `max_waiting`: the most engine requests left waiting for a slot once the free ones are
    taken (each of a request's `n` samples counts); a request that would pass it gets 429.
    `chat_template`: a Jinja chat template, or named ones (see `llmengine.server.chat`); None
    uses the plain one. `allowed_origins`: the web origins (`https://example.org`, or `*`)
    whose pages may call the API from a browser (CORS); none by default. `tool_call_parser`:
    the format (`hermes`, `llama3_json`) in which tool_choice "auto" outputs are read for
    calls (see `llmengine.server.tool_calls`); None returns them as text. `dashboard`: serve
    the live page `/dashboard` and its feed `/v1/engine/events` (`llmengine.server.dashboard`).
    The app owns the engine from its startup to its shutdown: nothing else may step it
    meanwhile. `app.state.engine_loop`, `app.state.metrics` (None with an `EngineProcess`,
    whose metrics live in its process) and `app.state.drain` are there to inspect. An engine
    built without a tokenizer is given this one: its constrained requests need it.
    """
    if tool_call_parser is not None and tool_call_parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"unknown tool-call parser {tool_call_parser!r}; known: "
                         f"{', '.join(TOOL_CALL_PARSERS)}")  # fmt: skip
    if isinstance(engine, EngineProcess):
        engine.max_waiting = max_waiting
        engine_loop: EngineLoop | EngineProcess = engine
        metrics = None  # in the engine's process: /metrics asks for them
    else:
        if engine.tokenizer is None:
            engine.tokenizer = tokenizer
        metrics = ServerMetrics()
        engine_loop = EngineLoop(engine, metrics, max_waiting=max_waiting)
    serving = Serving(engine_loop, tokenizer, ChatFormatter(tokenizer, chat_template),
                      served_model_name, tool_call_parser)  # fmt: skip

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine_loop.start()
        try:
            yield
        finally:
            drain.cancel()
            engine_loop.stop()

    app = FastAPI(title="llmengine", lifespan=lifespan, redoc_url=None)  # /docs: Swagger UI
    drain = Drain(engine_loop)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics
    app.state.drain = drain
    install_error_handlers(app)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await serving.completions(body, request.receive)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await serving.chat_completions(body, request.receive)

    card = {
        "id": served_model_name,
        "object": "model",
        "created": 0,
        "owned_by": "llmengine",
        "max_model_len": serving.max_model_len,
    }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        serving.check_model(model_id)  # 404 for any other name
        return card

    @app.get("/health", response_model=None)
    async def health() -> Response:
        if not engine_loop.running:
            return APIError(503, "the engine is not running", type="server_error").response()
        if drain.started:
            return SHUTTING_DOWN.response()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        try:  # an engine process that has ended has no metrics to give
            text = await engine_loop.render_metrics()
        except EngineStopped:
            return APIError(503, "the engine is not running", type="server_error").response()
        return Response(text, media_type=ServerMetrics.content_type)

    if dashboard:
        add_dashboard(app, engine_loop.events)

    describe(app, api_key=bool(api_key))
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    app.add_middleware(RefuseWhileDraining, drain=drain)
    if api_key:
        app.add_middleware(RequireKey, api_key=api_key)
    if allowed_origins:  # added last, so it runs first: a browser's preflight carries no key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return app


SHUTTING_DOWN = APIError(503, "the server is shutting down", type="server_error")


class Drain:
    """A shutdown's first phase: refuse new requests, then, `timeout` seconds after `begin`,
    end those still in flight with `EngineStopped` (which their responses turn into an error
    event or a JSON 503). The runner gives uvicorn a little longer than `timeout`, so that
    those endings are sent before uvicorn cancels what is left."""

    def __init__(self, engine_loop: EngineLoop) -> None:
        self.engine_loop = engine_loop
        self.started = False
        self._timer: threading.Timer | None = None

    def begin(self, timeout: float) -> None:
        """Start draining (a second call changes nothing): safe from a signal handler."""
        if self.started:
            return
        self.started = True
        self.engine_loop.events.close()  # the dashboard's feeds would never end by themselves
        reason = f"the server shut down before this request finished ({timeout:g} s allowed)"
        self._timer = threading.Timer(timeout, self.engine_loop.fail_all, args=(reason,))
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        """Forget the deadline: everything finished before it (the app is stopping)."""
        if self._timer is not None:
            self._timer.cancel()


class RefuseWhileDraining:
    """503 for a `/v1` request that arrives once the shutdown has begun."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.drain.started and scope["type"] == "http" and scope["path"].startswith("/v1"):
            await SHUTTING_DOWN.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


class RequireKey:
    """401 for a `/v1` request without `Authorization: Bearer <the key>`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(
                    401, "a valid API key is required: Authorization: Bearer <key>",
                    code="invalid_api_key",
                )  # fmt: skip
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """413 for a body over the limit; the body is read here first and handed on whole."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await self._too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client left before sending it all; let the app see that
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await self._too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        whole: list[Message] = [{"type": "http.request", "body": b"".join(chunks)}]

        async def replay() -> Message:
            return whole.pop() if whole else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(
            413, f"the request body is over {self.max_body_bytes} bytes",
            code="request_too_large",
        )  # fmt: skip
        await error.response()(scope, receive, send)

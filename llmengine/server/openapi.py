"""The OpenAPI document, made to tell the truth about what the server answers.

FastAPI documents a 422 for every route with a body, but the server turns validation errors
into OpenAI's 400 (`errors.from_validation`), and it does not know the responses the routes
build by hand. `describe(app, ...)` replaces its document with one that lists, per route,
the error responses that can really come back (each with the error schema), the success
schemas below, `text/event-stream` beside JSON for the generating endpoints, and `/metrics`
as Prometheus text. The schemas describe the fields clients read; they are not used to
build or check responses.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorObject


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None
    prompt_logprobs: list[Any] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatChoice(BaseModel):
    index: int
    message: dict[str, Any] | None = None  # a whole response
    delta: dict[str, Any] | None = None  # a stream's chunk
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class Model(BaseModel):
    id: str
    object: str
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: str
    data: list[Model]


ERRORS = {
    400: "the request is malformed or asks for what this server cannot honour",
    401: "a valid API key is required (when the server has one)",
    404: "no such model",
    413: "the body is over the size limit",
    429: "too many requests are waiting; retry after the Retry-After header's seconds",
    500: "the engine failed this request",
    503: "the server is shutting down, or its engine is not running",
}
# One Server-Sent Event: its `data` is a chunk as JSON (the response's shape, a `delta` in
# place of chat's `message`), an error object, or the final `[DONE]`.
SSE_EVENT = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}
GENERATING = {
    "/v1/completions": CompletionResponse,
    "/v1/chat/completions": ChatCompletionResponse,
}


def describe(app: FastAPI, *, api_key: bool) -> None:
    """Give `app` a truthful OpenAPI document (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, api_key)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(app: FastAPI, api_key: bool) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model in (ErrorResponse, CompletionResponse, ChatCompletionResponse, ModelList, Model):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    paths = document["paths"]
    for path, response in GENERATING.items():
        statuses = [400, 404, 413, 429, 500, 503] + ([401] if api_key else [])
        paths[path]["post"]["responses"] = {
            "200": {
                "description": "the response, or with `stream: true` its chunks as "
                "Server-Sent Events ending in `data: [DONE]`",
                "content": {
                    "application/json": {"schema": _ref(response.__name__)},
                    "text/event-stream": {"schema": SSE_EVENT},
                },
            },
            **_errors(statuses),
        }
    key = [401] if api_key else []
    paths["/v1/models"]["get"]["responses"] = {
        "200": _json("the served model", "ModelList"),
        **_errors(key),
    }
    paths["/v1/models/{model_id}"]["get"]["responses"] = {
        "200": _json("the served model", "Model"),
        **_errors([404, *key]),
    }
    paths["/health"]["get"]["responses"] = {
        "200": {
            "description": "the engine is running and the server takes requests",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **_errors([503]),
    }
    if "/v1/engine/events" in paths:  # the dashboard's feed, unless --no-dashboard
        paths["/v1/engine/events"]["get"]["responses"] = {
            "200": {
                "description": "the engine's live snapshots as Server-Sent Events, one JSON "
                "object per `data:` line (see llmengine.server.engine_events)",
                "content": {"text/event-stream": {"schema": SSE_EVENT}},
            },
            **_errors(key),
        }
    paths["/metrics"]["get"]["responses"] = {
        "200": {
            "description": "Prometheus metrics",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    }
    return document


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _errors(statuses: list[int]) -> dict[str, Any]:
    return {str(status): _json(ERRORS[status], "ErrorResponse") for status in sorted(statuses)}

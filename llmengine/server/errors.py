"""Errors as OpenAI reports them: a status code and `{"error": {message, type, param, code}}`.

Every refusal the server makes (bad input, unknown model, missing key, full queue, a body too
large) goes through `APIError`, so a client sees one shape whatever went wrong, and FastAPI's
own 422 validation errors are turned into the same 400.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException


class APIError(Exception):
    """A refusal with an HTTP status, in OpenAI's error format."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    """HTTP 400: the request itself is wrong."""
    return APIError(400, message, param=param)


def from_validation(error: RequestValidationError) -> APIError:
    """The first of pydantic's complaints as one 400, naming the field it is about."""
    problems = error.errors()
    if not problems:
        return bad_request("invalid request")
    first = problems[0]
    if first.get("type") == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first.get('msg', '')}", param=None)
    # The field is the first place after "body"; deeper places name union members or items.
    location = [part for part in first.get("loc", ()) if part != "body"]
    param = str(location[0]) if location else None
    if first.get("type") == "extra_forbidden":
        place = ".".join(str(part) for part in location)
        return bad_request(f"{place}: this server does not support this field", param=param)
    prefix = f"{param}: " if param else "the body: "
    # pydantic prefixes a validator's own message with "Value error, ": drop it.
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return bad_request(f"{prefix}{message}", param=param)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI raises through the OpenAI error format."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return from_validation(error).response()

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        # Starlette's own headers go on: a 405 carries `Allow`, the methods the path takes.
        kind = "not_found" if error.status_code == 404 else None
        return APIError(
            error.status_code, str(error.detail), code=kind, headers=error.headers
        ).response()

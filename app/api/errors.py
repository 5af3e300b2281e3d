"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every refusal of the HTTP API is an `ApiError`; `install_handlers` makes FastAPI answer it, any
request-validation error and any unexpected exception in that shape, so a stock client (the
`openai` SDK raises `BadRequestError`, `AuthenticationError`, `RateLimitError`, ... from the
status) shows the message. Statuses: 400 malformed request (unknown or missing fields, an empty
file), 401 missing or wrong API key, 404 a model that is not loaded (as OpenAI answers) or a
path that is no route, 405 a route's other methods, 413 audio
too large or too long, 415 not audio / not multipart, 422 a value out of range or a combination
this server cannot do, 429 the queue is full, 503 a front that is not enabled or a server
shutting down.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from .work_queue import ShuttingDown

log = logging.getLogger(__name__)

# OpenAI's error "type" for each status this API answers.
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """A request the API refuses. status: its HTTP status; param: the offending field, if one;
    code: a short machine-readable reason ("queue_full", "model_not_found", ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    error_type = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def install_handlers(app: FastAPI) -> None:
    """ApiError, FastAPI's own validation errors and unexpected exceptions -> OpenAI's shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        param = ".".join(str(p) for p in problems[0]["loc"][1:]) if problems else None
        message = "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems)
        return error_response(ApiError(422, message, param=param or None))

    @app.exception_handler(ShuttingDown)
    async def _shutting_down(request: Request, error: ShuttingDown) -> JSONResponse:
        headers = {"Retry-After": "10"}
        return error_response(ApiError(503, str(error), code="shutting_down", headers=headers))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        from ..out_of_memory import out_of_memory, said

        log.exception("%s %s failed", request.method, request.url.path)
        if out_of_memory(error):  # the server's limit, not the request: it may pass later
            message = f"{said(error)}: the server has too little memory for this request now"
            return error_response(ApiError(503, message, code="out_of_memory"))
        message = f"{HTTPStatus(500).phrase} ({type(error).__name__}); the server log has details"
        return error_response(ApiError(500, message))

"""build_api: the OpenAI-compatible FastAPI app over the loaded models.

Routes: `GET /health` (no key: for load balancers and container probes), `GET /v1/models`
(and `/v1/models/`), `GET /v1/models/{id}` (each with HEAD), `POST /v1/audio/transcriptions`,
`POST /v1/audio/translations`, `POST /v1/completions`, `POST /v1/chat/completions`. With an
API key, every `/v1` route wants `Authorization: Bearer KEY` (401 otherwise); any other `/v1`
path is a 404 (405 for a route's other methods, `/health`'s too) in OpenAI's error shape. All
model work goes through one `WorkQueue`.
"""

from __future__ import annotations

import hmac
import time

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import Match, Mount

from ..request import echoed
from ..service import TranscriptionService
from .audio_request import WHISPER_ALIAS
from .audio_routes import AudioApi
from .errors import ApiError, install_handlers
from .text_front import TextFront
from .text_routes import TextApi
from .work_queue import WorkQueue


def bearer_check(api_key: str | None):
    """A FastAPI dependency: refuses a missing or wrong bearer token (401) when a key is set."""

    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "").strip()
        scheme, _, token = header.partition(" ")
        if not header:
            raise ApiError(
                401,
                "missing API key: send the header 'Authorization: Bearer KEY'",
                code="missing_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if scheme.lower() != "bearer" or not token.strip():
            # The header is there, so "missing" would mislead; its value is not echoed (it
            # may be the key itself).
            raise ApiError(
                401,
                "the Authorization header must read 'Bearer KEY' (the word Bearer, a space, "
                "then the key)",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(
                401,
                "incorrect API key",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check


def build_api(
    service: TranscriptionService,
    work: WorkQueue,
    text: TextFront | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """The API app. `service` should be loaded already (the first request would wait);
    `text`: the text front, or None (the text routes then answer 503)."""
    app = FastAPI(title="specscribe", docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    started = int(time.time())
    auth = [Depends(bearer_check(api_key))]

    def model_entries() -> list[dict]:
        names = [(service.asr_model_name, "speech-to-text")]
        if text is not None:
            names.append((text.name, "text-generation"))
        return [
            {"id": name, "object": "model", "created": started, "owned_by": "specscribe", "task": t}
            for name, t in names
        ]

    @app.api_route("/health", methods=["GET", "HEAD"], include_in_schema=False)
    async def health() -> JSONResponse:
        """200 while requests are taken, 503 once a stop has begun (a balancer then sends
        new requests elsewhere); the queue's state, for a probe or a person to read."""
        stopping = work.stopping
        body = {
            "status": "shutting_down" if stopping else "ok",
            "models": [entry["id"] for entry in model_entries()],
            "running": work.running,
            "waiting": work.waiting,
            "queue_size": work.size,
        }
        return JSONResponse(body, status_code=503 if stopping else 200)

    @app.api_route("/health", methods=_NOT_HEALTHS, include_in_schema=False)
    async def health_other_methods(request: Request) -> None:
        # Without it the web page mounted at "/" would answer a probe's wrong method with
        # its own 404.
        raise ApiError(
            405,
            f"{request.method} is not allowed on /health; use GET or HEAD",
            code="method_not_allowed",
            headers={"Allow": "GET, HEAD"},
        )

    @app.api_route("/v1/models", methods=["GET", "HEAD"], dependencies=auth)
    async def models() -> dict:
        return {"object": "list", "data": model_entries()}

    @app.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"], dependencies=auth)
    async def model(model_id: str) -> dict:
        if not model_id:  # "/v1/models/": the list, as a client joining paths asks for it
            return await models()
        for entry in model_entries():
            if entry["id"] == model_id:
                return entry
        if model_id == WHISPER_ALIAS:  # what stock clients name; the audio routes take it
            return {**model_entries()[0], "id": WHISPER_ALIAS}
        raise ApiError(
            404,
            f"the model {echoed(model_id)} does not exist",
            param="model",
            code="model_not_found",
        )

    app.include_router(AudioApi(service, work).router(), dependencies=auth)
    app.include_router(TextApi(text, work).router(), dependencies=auth)

    # Last: any other /v1 path, /v1 itself included, answers in OpenAI's shape, not the web
    # page's 404.
    @app.api_route("/v1", methods=_METHODS, dependencies=auth, include_in_schema=False)
    @app.api_route("/v1/{rest:path}", methods=_METHODS, dependencies=auth, include_in_schema=False)
    async def unknown(request: Request) -> None:
        path = request.url.path
        allowed = [
            method
            for method in _METHODS
            if any(
                route.matches({**request.scope, "method": method})[0] == Match.FULL
                for route in app.router.routes
                # not this route, nor the web page mounted at "/", which takes any path
                if getattr(route, "endpoint", None) is not unknown and not isinstance(route, Mount)
            )
        ]
        if allowed:
            raise ApiError(
                405,
                f"{request.method} is not allowed on {path}; use {' or '.join(allowed)}",
                code="method_not_allowed",
                headers={"Allow": ", ".join(allowed)},
            )
        raise ApiError(404, f"there is no route {request.method} {path}", code="unknown_url")

    return app


_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]
_NOT_HEALTHS = [method for method in _METHODS if method not in ("GET", "HEAD")]

"""build_api: the OpenAI-compatible FastAPI app over the loaded models.

Routes: `GET /v1/models`, `POST /v1/audio/transcriptions`, `POST /v1/audio/translations`,
`POST /v1/completions`, `POST /v1/chat/completions`. With an API key, every `/v1` route wants
`Authorization: Bearer KEY` (401 otherwise). All model work goes through one `WorkQueue`.
"""

from __future__ import annotations

import hmac
import time

from fastapi import Depends, FastAPI, Request

from ..service import TranscriptionService
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
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "missing API key: send the header 'Authorization: Bearer KEY'",
                code="missing_api_key",
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

    @app.get("/v1/models", dependencies=auth)
    async def models() -> dict:
        names = [(service.asr_model_name, "speech-to-text")]
        if text is not None:
            names.append((text.name, "text-generation"))
        data = [
            {"id": name, "object": "model", "created": started, "owned_by": "specscribe", "task": t}
            for name, t in names
        ]
        return {"object": "list", "data": data}

    app.include_router(AudioApi(service, work).router(), dependencies=auth)
    app.include_router(TextApi(text, work).router(), dependencies=auth)
    return app

"""The page takes files it was sent, nothing else: a file input naming a server path or a URL
is refused before Gradio reads it.

Gradio's API takes a file input as `{"path": ..., "meta": {"_type": "gradio.FileData"}}`,
whose path should be one the page uploaded (`/gradio_api/upload`). Gradio checks that only
once `launch()` has run, and a page mounted on FastAPI (`gr.mount_gradio_app`, as `specscribe
serve` mounts it) never has: a call naming a recording elsewhere on the server had it
transcribed for the caller (and copied into Gradio's cache), and one naming /dev/zero hung the
server's event loop while Gradio hashed it. A URL Gradio fetches whatever the check, with no
size limit. `UploadsOnly` refuses both (403) for every JSON call under the page's API;
`app.server` also marks the page launched, so Gradio's own check runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

PAGE_API_PREFIX = "/gradio_api/"
MAX_CALL_BYTES = 1_000_000  # a call's JSON body: form values and file references, no audio


class UploadsOnly:
    """ASGI middleware: a POST under PAGE_API_PREFIX whose body is JSON naming a file outside
    `upload_folder` (Gradio's, where `/gradio_api/upload` puts files), or a URL, is answered
    403 without reaching Gradio. Uploads themselves (multipart) and other routes pass."""

    def __init__(self, app: ASGIApp, upload_folder: Path) -> None:
        self.app = app
        self.upload_folder = os.path.realpath(upload_folder)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].startswith(PAGE_API_PREFIX)
            # whatever type it claims: FastAPI may read a body as JSON without the header
            and not dict(scope["headers"]).get(b"content-type", b"").startswith(b"multipart/")
        ):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_CALL_BYTES:
                await _refuse(send, 413, "the call's JSON is too large")
                return
        try:
            foreign = next(self._foreign_files(json.loads(body)), None)
        except ValueError:  # not JSON after all: Gradio answers it
            foreign = None
        if foreign is not None:
            await _refuse(send, 403, f"not a file this page was sent: {foreign[:200]}")
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _foreign_files(self, value: object) -> Iterator[str]:
        """The file references in `value` (any dict with a string "path") that are URLs or
        lie outside the upload folder."""
        if isinstance(value, dict):
            path = value.get("path")
            if isinstance(path, str) and not self._uploaded(path):
                yield path
            for item in value.values():
                yield from self._foreign_files(item)
        elif isinstance(value, list):
            for item in value:
                yield from self._foreign_files(item)

    def _uploaded(self, path: str) -> bool:
        if "://" in path or "\0" in path:
            return False
        real = os.path.realpath(path)
        return os.path.commonpath([real, self.upload_folder]) == self.upload_folder


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

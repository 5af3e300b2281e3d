"""`specscribe serve`: the web UI and the OpenAI-compatible API in one process, on one port.

The FastAPI app from `app.api.build_api` takes `/v1/...`; the Gradio page is mounted at `/`. Both
use the same TranscriptionService (models loaded once, one request decoding at a time behind its
lock); the API's requests wait in a WorkQueue bounded by `queue_size`, the page's in Gradio's
queue of the same bound. With an API key, the API wants it as a bearer token and the page asks
for it on a login form (any user name, the key as the password).
"""

from __future__ import annotations

import hmac
import logging
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import gradio as gr
import uvicorn
from fastapi import FastAPI
from gradio.utils import get_upload_folder as gradio_upload_folder

from .api.app import build_api
from .api.text_front import TextFront
from .api.work_queue import WorkQueue
from .page_inputs import UploadsOnly
from .service import TranscriptionService
from .ui import DEFAULT_HOST, DEFAULT_PORT, build_app

log = logging.getLogger(__name__)
GRACEFUL_SHUTDOWN_SECONDS = 5  # open event streams (the page's queue) are closed after this
# Of those, the time a running request has to finish: the rest answers it (503) before uvicorn
# closes its connection, and lets the job stop after the window it is decoding.
RUNNING_REQUEST_GRACE_SECONDS = 3.0
JOB_STOP_SECONDS = 30.0  # how long a stop waits for that window before exiting anyway


def page_login(api_key: str):
    """Gradio's auth check: any user name, the API key as the password."""

    def check(username: str, password: str) -> bool:
        return hmac.compare_digest(password.encode(), api_key.encode())

    return check


def build_server(
    service: TranscriptionService,
    outputs_dir: Path,
    queue_size: int = 16,
    text: TextFront | None = None,
    api_key: str | None = None,
) -> tuple[FastAPI, WorkQueue]:
    """The API with the page mounted at `/`; the WorkQueue is the caller's to close."""
    work = WorkQueue(queue_size)
    app = build_api(service, work, text, api_key)
    demo = build_app(service, outputs_dir, queue_size)
    app = gr.mount_gradio_app(
        app,
        demo,
        path="/",
        ssr_mode=False,  # client-side rendering: no Node server, nothing fetched
        show_error=False,  # unexpected errors are turned into messages by WebApp
        allowed_paths=[str(outputs_dir)],
        max_file_size=service.settings.max_audio_bytes,
        footer_links=["api", "settings"],
        auth=page_login(api_key) if api_key else None,
        auth_message="Enter any user name and the server's API key as the password."
        if api_key
        else None,
    )
    # Gradio checks that a file input is one the page uploaded only once launch() has run,
    # which a mounted page never does; URLs it fetches regardless (`app.page_inputs`).
    demo.has_launched = True
    app.add_middleware(UploadsOnly, upload_folder=Path(gradio_upload_folder()))
    return app, work


def serve(
    service: TranscriptionService,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    queue_size: int = 16,
    text: TextFront | None = None,
    api_key: str | None = None,
) -> None:
    """Loads the models, then serves the page and the API until SIGINT or SIGTERM (blocks)."""
    service.load(diarization=True, vad=True)  # the first request should not wait for models
    outputs_dir = Path(tempfile.mkdtemp(prefix="specscribe-ui-"))
    work = None
    try:
        app, work = build_server(service, outputs_dir, queue_size, text, api_key)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        )
        if threading.current_thread() is threading.main_thread():
            # uvicorn stops on SIGINT/SIGTERM, then raises the signal again for the handler it
            # found: make that one quiet, so a stop (`docker stop`, Ctrl-C) exits with status 0.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
        print(f"specscribe: serving http://{host}:{port}/ (API under /v1)", flush=True)
        _Server(config, work).run()
    finally:
        if work is not None:
            work.close(timeout=JOB_STOP_SECONDS)
        shutil.rmtree(outputs_dir, ignore_errors=True)


class _Server(uvicorn.Server):
    """uvicorn's server, which tells the API's queue when a stop begins (SIGINT, SIGTERM):
    requests waiting are answered 503 at once, and a running one within
    RUNNING_REQUEST_GRACE_SECONDS (its transcript, or 503), never cut off without an answer."""

    def __init__(self, config: uvicorn.Config, work: WorkQueue) -> None:
        super().__init__(config)
        self.work = work

    def handle_exit(self, sig: int, frame) -> None:
        self.work.shut_down(RUNNING_REQUEST_GRACE_SECONDS)
        super().handle_exit(sig, frame)

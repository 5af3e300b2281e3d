"""`POST /v1/audio/transcriptions` and `POST /v1/audio/translations` on the shared service.

Each request, in order: the form (400/422), the model name (404), the options (422), the file
(400 empty, 413 too large), a place in the queue (429), the audio decoded outside the queue
(415 not audio, 413 too long), then the service's run in the queue; a client that goes away
gives its place back, and stops its transcription after the window being decoded. With
`stream`, the answer is server-sent events in OpenAI's shape: a `transcript.text.delta` as
each 30 s window's text is decided, then one `transcript.text.done` with the whole text
(speakers, when asked for, are only known then).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response

from asr.audio import SAMPLE_RATE, AudioChannel, AudioStream, DecodedAudio, DecodingStopped
from asr.types import DecidedWindow, Transcript

from ..request import echoed
from ..service import ServiceOptions, TranscriptionService
from .audio_formats import language_fields, render, usage
from .audio_request import WHISPER_ALIAS, AudioRequest, parse_form
from .errors import ApiError, error_body
from .events import sse
from .work_queue import (
    ABANDON_POLL_SECONDS,
    Abandoned,
    ClosingStream,
    HeldAudio,
    Place,
    QueueFull,
    ShuttingDown,
    WorkQueue,
    until_stopped,
)

log = logging.getLogger(__name__)

# nginx's status for a request whose client closed the connection first (nobody reads it).
CLIENT_CLOSED_REQUEST = 499
HELD_AUDIO_BUDGET = 2  # decoded audio requests may hold, in MAX_AUDIO_SECONDS (`HeldAudio`)
# Multipart framing and the form's text fields, on top of the file itself.
FORM_OVERHEAD_BYTES = 1_000_000
# The form field a model's refusal names (`TranscribeOptions.validate` opens its message with
# the option at fault): OpenAI's errors carry it as "param".
_VALIDATED_FIELDS = {
    "language": "language",
    "multilingual": "multilingual",
    "task": "model",  # translate with an English-only model
    "temperatures": "temperature",
    "word_timestamps": "timestamp_granularities",
}


def model_refusal(error: ValueError) -> ApiError:
    """`TranscribeOptions.validate`'s refusal of a request -> a 422 naming the form field."""
    message = str(error)
    return ApiError(422, message, param=_VALIDATED_FIELDS.get(message.split(" ")[0].rstrip(":")))


Task = Literal["transcribe", "translate"]


class AudioApi:
    """The two audio routes over one TranscriptionService and the API's WorkQueue."""

    def __init__(self, service: TranscriptionService, work: WorkQueue) -> None:
        self.service = service
        self.work = work
        self.max_bytes = service.settings.max_audio_bytes
        self.max_seconds = service.settings.max_audio_seconds
        # Decoded audio held by requests waiting or running: twice the longest one allows
        # (6 h, 1.4 GB of samples, by default).
        self.held = HeldAudio(HELD_AUDIO_BUDGET * self.max_seconds)

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.post("/v1/audio/transcriptions")
        async def transcriptions(request: Request) -> Response:
            return await self.answer(request, "transcribe")

        @router.post("/v1/audio/translations")
        async def translations(request: Request) -> Response:
            return await self.answer(request, "translate")

        return router

    async def answer(self, request: Request, task: Task) -> Response:
        # 1. The request, checked before anything is decoded.
        asked, audio = await self._read(request)
        self._check_model(asked.model)
        options = asked.service_options(task)
        try:
            options.transcribe_options().validate(self.service.model)
        except ValueError as error:  # a language or task this model does not have
            raise model_refusal(error) from None
        with self._place() as place:  # given back if the audio does not decode
            # 2. The audio, decoded outside the queue (ffmpeg runs in its own process).
            try:
                samples = await self._decoded_while_connected(request, audio, options)
            except DecodingStopped:
                log.info("a transcription request was abandoned while its audio decoded")
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            seconds = samples.samples.size / SAMPLE_RATE
            if not self.held.take(seconds):
                raise self._holding_too_much()
            # 3. The model work, in the queue.
            if asked.stream:
                try:
                    return self._stream(samples, options, place, task, seconds)
                except BaseException:
                    self.held.give_back(seconds)
                    raise
            windows: list[DecidedWindow] = []
            stop = threading.Event()
            on_window = until_stopped(stop, windows.append)
            try:
                transcript = await self._queued(request, samples, options, on_window, place, stop)
            except Abandoned:
                log.info("a transcription request was abandoned by its client")
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            finally:
                self.held.give_back(seconds)
        return render(transcript, asked, task, windows)

    def _holding_too_much(self) -> ApiError:
        hours = self.held.budget_seconds / 3600
        return ApiError(
            429,
            f"the server is busy: the requests before this one hold {hours:g} h of audio "
            f"({HELD_AUDIO_BUDGET} x MAX_AUDIO_SECONDS); try again shortly",
            code="queue_full",
            headers={"Retry-After": "30"},
        )

    async def _read(self, request: Request) -> tuple[AudioRequest, bytes]:
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith("multipart/form-data"):
            raise ApiError(
                415,
                f"send multipart/form-data with the audio in 'file' (got {content_type or 'none'})",
                code="unsupported_media_type",
            )
        limit = self.max_bytes + FORM_OVERHEAD_BYTES
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise self._too_large(int(length), whole_request=True)
        try:
            form = await _capped(request, limit, self._too_large).form(max_files=2, max_fields=64)
        except ApiError:
            raise
        except Exception as error:  # starlette's MultiPartException and malformed bodies
            raise ApiError(400, f"the multipart form cannot be read: {error}") from None
        try:
            asked, upload = parse_form(form)
            audio = await upload.read()
        finally:
            await form.close()
        if not audio:
            raise ApiError(400, "file is empty (0 bytes)", param="file", code="empty_file")
        if len(audio) > self.max_bytes:
            raise self._too_large(len(audio))
        return asked, audio

    def _too_large(
        self, size: int, whole_request: bool = False, at_least: bool = False
    ) -> ApiError:
        """413 for an upload past MAX_AUDIO_BYTES; whole_request: `size` is the request's
        Content-Length (the form's fields and boundaries with the file), refused before reading;
        at_least: `size` is what a request without one had sent when it passed the limit."""
        what = "the request (its form with the audio file)" if whole_request else "the audio file"
        has = "went past" if at_least else "has"  # at_least: no Content-Length
        return ApiError(
            413,
            f"{what} {has} {size} bytes, more than the {self.max_bytes} allowed for the audio "
            "file (the server's MAX_AUDIO_BYTES environment variable; a compressed file, "
            "mp3, ogg or opus, is about a tenth of its WAV)",
            param="file",
            code="file_too_large",
        )

    def _check_model(self, model: str | None) -> None:
        if model in (None, "", WHISPER_ALIAS, self.service.asr_model_name):
            return
        raise ApiError(
            404,
            f"model {echoed(model)} is not loaded; this server transcribes with "
            f"{self.service.asr_model_name!r} (or say {WHISPER_ALIAS!r})",
            param="model",
            code="model_not_found",
        )

    def _place(self) -> Place:
        """A place in the queue, taken before the audio costs any decoding; refused at once
        (429) when the queue is full."""
        try:
            return self.work.reserve()
        except QueueFull:
            raise queue_full(self.work) from None

    async def _decoded_while_connected(
        self, request: Request, audio: bytes, options: ServiceOptions
    ) -> DecodedAudio:
        """`_decode` in a thread; a client gone meanwhile ends ffmpeg (an hour of mp3 takes
        it seconds, the place in the queue held) and DecodingStopped is raised."""
        stop = threading.Event()
        decoding = asyncio.ensure_future(
            asyncio.to_thread(self._decode, audio, options.audio_stream, options.channel, stop)
        )
        # Its end goes unread where this request is cancelled (the server stopping).
        decoding.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            while not (await asyncio.wait({decoding}, timeout=ABANDON_POLL_SECONDS))[0]:
                if await request.is_disconnected():
                    stop.set()
            return decoding.result()
        finally:
            stop.set()  # ffmpeg ends with the request, however it ends

    def _decode(
        self,
        audio: bytes,
        audio_stream: AudioStream,
        channel: AudioChannel,
        stop: threading.Event | None = None,
    ) -> DecodedAudio:
        """The upload's samples (from `audio_stream`, where it holds several; `channel` alone,
        where one is asked for), with what its decoding warned about (they reach the
        transcript's warnings, as a file's do on the command line)."""
        from asr.audio import (
            AudioChannelError,
            AudioLoadError,
            AudioStreamError,
            AudioTooLongError,
            decode_audio,
        )

        try:
            return decode_audio(
                audio,
                name="file",
                max_seconds=self.max_seconds,
                audio_stream=audio_stream,
                channel=channel,
                stop=stop,
            )
        except AudioStreamError as error:
            raise ApiError(422, str(error), param="audio_stream") from None
        except AudioChannelError as error:
            raise ApiError(422, str(error), param="channel") from None
        except AudioTooLongError as error:
            raise ApiError(
                413, f"{error} (MAX_AUDIO_SECONDS)", param="file", code="audio_too_long"
            ) from None
        except AudioLoadError as error:
            raise ApiError(
                415,
                f"the file is not audio that ffmpeg can decode: {error}",
                param="file",
                code="invalid_audio",
            ) from None

    async def _queued(
        self,
        request: Request,
        samples: DecodedAudio,
        options: ServiceOptions,
        on_window: Callable[[DecidedWindow], None],
        place: Place,
        stop: threading.Event,
    ) -> Transcript:
        """The transcription in `place`; raises Abandoned when the client leaves first."""
        try:
            return await self.work.run(
                lambda: self.service.run(samples, options, on_window=on_window),
                place,
                abandoned=request.is_disconnected,
                stop=stop,
            )
        except ValueError as error:
            raise ApiError(422, str(error)) from None

    def _stream(
        self,
        samples: DecodedAudio,
        options: ServiceOptions,
        place: Place,
        task: Task,
        held_seconds: float,
    ):
        """Server-sent events. A client that leaves cancels the response's generator, which
        cancels the job: one waiting gives its place back, one running stops at its next
        window. held_seconds: the samples' length, given back to `held` once the job ends."""
        stop = threading.Event()

        def job(emit: Callable[[DecidedWindow], None]) -> Transcript:
            return self.service.run(samples, options, on_window=until_stopped(stop, emit))

        done, windows = self.work.submit_streaming(job, place)
        done.add_done_callback(lambda d: stop.set() if d.cancelled() else None)
        done.add_done_callback(lambda d: self.held.give_back(held_seconds))
        return ClosingStream(
            _transcript_events(done, windows, task),
            on_close=done.cancel,  # a no-op once it is done; else its place is given back
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )


def _capped(request: Request, limit: int, too_large: Callable[..., ApiError]) -> Request:
    """`request` reading its body through a count that raises `too_large`'s 413 once more than
    `limit` bytes have come: a body sent without Content-Length (chunked) was spooled whole,
    then read into memory, before its size was checked (a few such uploads of some GB could
    fill the disk or end the server)."""
    received = 0

    async def receive():
        nonlocal received
        message = await request.receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise too_large(limit, whole_request=True, at_least=True)
        return message

    return Request(request.scope, receive)


async def _transcript_events(
    done: asyncio.Future[Transcript], windows: AsyncIterator[DecidedWindow], task: Task
) -> AsyncIterator[str]:
    """OpenAI's transcription events: deltas whose concatenation is the final text (leading
    and trailing spaces held back), then `transcript.text.done`, which names the text's
    language as verbose_json does; an error becomes one `{"error": ...}` event, which the SDKs
    raise."""
    sent = ""
    raw = ""
    try:
        async for window in windows:
            raw += "".join(segment.text for segment in window.segments)
            text = raw.strip()
            if len(text) > len(sent) and text.startswith(sent):
                yield sse({"type": "transcript.text.delta", "delta": text[len(sent) :]})
                sent = text
        transcript = done.result()
    except ApiError as error:
        yield sse(error.body())
        return
    except ValueError as error:
        yield sse(error_body(422, str(error)))
        return
    except ShuttingDown as error:  # waiting or running when the server began to stop
        yield sse(error_body(503, str(error), code="shutting_down"))
        return
    except Exception as error:
        log.exception("streamed transcription failed")
        yield sse(error_body(500, f"transcription failed ({type(error).__name__})"))
        return
    if transcript.text.startswith(sent) and len(transcript.text) > len(sent):
        yield sse({"type": "transcript.text.delta", "delta": transcript.text[len(sent) :]})
    yield sse(
        {
            "type": "transcript.text.done",
            "text": transcript.text,
            "usage": usage(transcript),
            **language_fields(transcript, task),
            "stats": transcript.stats,
            "warnings": list(transcript.warnings),
        }
    )


def queue_full(work: WorkQueue) -> ApiError:
    return ApiError(
        429,
        f"the server is busy: {work.size} requests are waiting already (--queue-size); "
        "try again shortly",
        code="queue_full",
        headers={"Retry-After": "5"},
    )

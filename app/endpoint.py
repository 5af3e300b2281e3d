"""EndpointHandler: the Hugging Face Inference Endpoints custom handler (handler.py re-exports it).

The Inference Toolkit builds `EndpointHandler(path)` once, with `path` the mounted repository,
and calls it with the request body: `{"inputs": <audio>, "parameters": {...}}` for JSON, or
`{"inputs": <bytes>}` for an `audio/*` body (its query string then becomes "parameters").

Errors: bad input raises `EndpointError`, which carries an HTTP status (400 malformed request,
413 too large, 422 parameters or audio that cannot be processed) and a message naming the cause.
The toolkit answers any exception with HTTP 400 and `{"error": str(exception)}`, while a returned
dict always goes out as 200; raising is therefore the only way to give the user a 4xx, and
`str(EndpointError)` starts with the precise status ("422 Unprocessable Entity: ..."). A server
of one's own can read `.status` and send `.to_dict()`. Failures that are not the request's fault
propagate unchanged.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from asr.types import MAX_BATCH_SIZE, MAX_SPEAKERS, Transcript

from .config import Settings
from .request import off_is_none
from .service import (
    MAX_PROMPT_CHARACTERS,
    ServiceOptions,
    TranscriptionService,
    decoding_choices,
)

logger = logging.getLogger(__name__)

_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/=_\-\s]")  # both alphabets, line breaks
_BASE64_BYTES = re.compile(rb"[A-Za-z0-9+/=_\-\s]+")
_INPUT_REPR = 80  # characters of a rejected value quoted back in an error message
_DIARIZATION_OFF = "none"


class EndpointError(ValueError):
    """A request the endpoint refuses: `status` is the HTTP status it deserves (4xx)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"{status} {HTTPStatus(status).phrase}: {message}")

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "status": self.status}


# The parameters that take decimals, which a query string can only give as strings.
DECIMAL_FIELDS = (
    "vad_threshold",
    "vad_min_speech_duration",
    "vad_min_silence_duration",
    "vad_speech_pad",
    "passage_pause",
    "hallucination_silence_threshold",
    "temperature",
    "temperature_increment_on_fallback",
    "compression_ratio_threshold",
    "logprob_threshold",
    "no_speech_threshold",
    "patience",
)

# The parameters that take text, which a query string's digits reach as numbers (the toolkit
# makes `?hotwords=1984` an int; `?clip_timestamps=5` means from 5 s).
TEXT_FIELDS = ("language", "initial_prompt", "hotwords", "clip_timestamps")


class EndpointParameters(BaseModel):
    """The request's "parameters". Names from the asr-diarization blog handler are accepted
    where they mean the same here: `assisted`, and `chunk_length_s` / `sampling_rate` at the
    only values this pipeline uses (30 s windows; audio is resampled to 16 kHz by ffmpeg)."""

    # strict: "2" is not a speaker count and 1 is not a boolean. The toolkit turns a query
    # string's whole non-negative numbers and true/false into JSON types, but leaves "0.5" and
    # "-1" strings: `_decimal_from_query` reads those for the fields that take decimals.
    # nan or infinite numbers mean nothing here (app.request.ServiceOptions)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    language: str | None = None  # code ("en"), name ("english") or "<|en|>"; None: detected
    multilingual: bool = False  # each window's language detected (not with `language`)
    task: Literal["transcribe", "translate"] = "transcribe"
    word_timestamps: bool = False  # True: one chunk per word
    # None: draft with the ASSISTANT_MODEL when one is configured.
    assistant: bool | None = Field(None, validation_alias=AliasChoices("assistant", "assisted"))
    diarize: bool | None = None  # None: diarize when a speaker count is given
    num_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    min_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    max_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    batch_size: int = Field(
        1, ge=1, le=MAX_BATCH_SIZE
    )  # >1: windows cut at silences and decoded together
    initial_prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARACTERS)
    condition_on_previous_text: bool = True
    hotwords: str | None = Field(None, max_length=MAX_PROMPT_CHARACTERS)
    audio_stream: int | str | None = None  # an index counted from 0, or a language
    channel: int | str | None = None  # an index counted from 0, left, right; None: mixed
    clip_timestamps: str | None = Field(None, max_length=1000)
    vad: bool = True
    vad_threshold: float = Field(0.4, gt=0, lt=1)
    vad_min_speech_duration: float = Field(0.25, ge=0, le=60)
    vad_min_silence_duration: float = Field(2.0, ge=0, le=60)
    vad_speech_pad: float = Field(0.4, ge=0, le=60)
    passage_pause: float | None = Field(5.0, ge=0)  # 0 or None: off
    repetition_ngram: int | None = Field(6, ge=0, le=50)  # 0 or None: off; 1 is refused
    hallucination_silence_threshold: float | None = Field(None, gt=0)
    # The temperature fallback (app.request): the first temperature, its increment (0 or None:
    # no fallback) and the quality checks that trigger it (None: off).
    temperature: float = Field(0.0, ge=0, le=1)
    temperature_increment_on_fallback: float | None = Field(0.2, ge=0, le=1)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    beam_size: int = Field(1, ge=1, le=16)  # >1: beam search, without the draft
    patience: float = Field(1.0, gt=0)
    best_of: int = Field(1, ge=1, le=16)  # samples per window at each fallback temperature
    chunk_length_s: Literal[30] | None = None
    sampling_rate: Literal[16000] | None = None

    @field_validator(*DECIMAL_FIELDS, mode="before")
    @classmethod
    def _decimal_from_query(cls, value: Any) -> Any:
        """A string that spells a number is that number (`?vad_threshold=0.5` was refused:
        "input should be a valid number (got '0.5')"), and off / none / null turns an
        optional setting off; any other string stays one, to be refused."""
        value = off_is_none(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        return value

    @field_validator(*TEXT_FIELDS, mode="before")
    @classmethod
    def _text_from_query(cls, value: Any) -> Any:
        """A number where text is taken is its digits (`?hotwords=1984`, `?clip_timestamps=5`
        were refused: "input should be a valid string (got 5)"); clip timestamps also come as
        openai-whisper's list of seconds, [start, end, start, ...]."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, list) and all(
            isinstance(item, int | float) and not isinstance(item, bool) for item in value
        ):
            return ",".join(str(item) for item in value)
        return value

    @field_validator("repetition_ngram", mode="before")
    @classmethod
    def _off_from_query(cls, value: Any) -> Any:
        """off / none / null turns the repetition guard off, as it does passage_pause."""
        return off_is_none(value)

    @property
    def guards_silence(self) -> bool:
        return self.hallucination_silence_threshold is not None

    def service_options(self) -> ServiceOptions:
        """The request's ServiceOptions (app.request's rules; ValueError names a field)."""
        return ServiceOptions(
            language=self.language,
            task=self.task,
            # The guard reads word times: computed for it, while chunks stay one per segment
            # unless word_timestamps asks for words (as the HTTP API does).
            word_timestamps=self.word_timestamps or self.guards_silence,
            use_assistant=self.assistant is not False,
            diarize=self.diarize,
            num_speakers=self.num_speakers,
            min_speakers=self.min_speakers,
            max_speakers=self.max_speakers,
            batch_size=self.batch_size,
            initial_prompt=self.initial_prompt,
            condition_on_previous_text=self.condition_on_previous_text,
            temperature=self.temperature,
            **decoding_choices(self),
        )


def parse_parameters(parameters: Any) -> EndpointParameters:
    """The "parameters" object -> EndpointParameters; EndpointError 400/422 names each bad
    field."""
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise EndpointError(
            400, f"parameters must be a JSON object, not {type(parameters).__name__}"
        )
    try:
        return EndpointParameters.model_validate(parameters)
    except ValidationError as error:
        problems = [_describe(problem, parameters) for problem in error.errors()]
        raise EndpointError(422, "invalid parameters: " + "; ".join(problems)) from None


def _describe(problem: dict[str, Any], given: dict[str, Any]) -> str:
    name = ".".join(str(part) for part in problem["loc"])
    if problem["type"] == "extra_forbidden":
        if name == "assisted" and "assistant" in given:
            return "assisted: another name for assistant, which is given too"
        accepted = ", ".join([*EndpointParameters.model_fields, "assisted"])
        return f"{name}: unknown parameter (accepted: {accepted})"
    shown = repr(problem.get("input"))
    if len(shown) > _INPUT_REPR:
        shown = shown[:_INPUT_REPR] + "..."
    return f"{name}: {problem['msg']} (got {shown})"


def read_audio_bytes(inputs: Any, max_bytes: int) -> bytes:
    """The request's "inputs" -> the bytes of the audio file.

    inputs: the file as base64 text (standard or URL-safe alphabet, padding optional, line
    breaks allowed), the same as a `data:<type>;base64,` URL, or the raw bytes (an `audio/*`
    request body; bytes that are base64 text are decoded too). Raises EndpointError 400 for
    empty or malformed input, 413 past `max_bytes`.
    """
    if isinstance(inputs, bytearray | memoryview):
        inputs = bytes(inputs)
    if isinstance(inputs, bytes) and inputs.startswith(b"data:"):
        inputs = inputs.decode("ascii", errors="replace")
    elif isinstance(inputs, bytes) and inputs and _BASE64_BYTES.fullmatch(inputs):
        # An audio file always holds bytes outside the base64 alphabet (binary headers).
        inputs = inputs.decode("ascii")
    if isinstance(inputs, bytes):
        audio = inputs
    elif isinstance(inputs, str):
        if re.match(r"\s*(https?|ftp|s3|gs)://", inputs, re.IGNORECASE):
            # Fetching URLs would let a request make the endpoint call any address.
            raise EndpointError(
                400, "inputs is a URL: this endpoint fetches nothing; send the audio file itself"
            )
        audio = _decode_base64(inputs, max_bytes)
    else:
        raise EndpointError(
            400,
            f"inputs must be the audio file as a base64 string or as bytes, "
            f"not {type(inputs).__name__}",
        )
    if not audio:
        raise EndpointError(400, "inputs is empty: send the audio file")
    if len(audio) > max_bytes:
        raise EndpointError(
            413, f"inputs: the audio file has {len(audio)} bytes, more than the {max_bytes} allowed"
        )
    return audio


def _decode_base64(text: str, max_bytes: int) -> bytes:
    text = text.strip()
    if text[:5].lower() == "data:":  # RFC 2397: the scheme and ";base64" in any case
        header, comma, text = text.partition(",")
        if not comma or not header.lower().endswith(";base64"):
            raise EndpointError(
                400, "inputs: a data URL must be base64: data:<media type>;base64,<data>"
            )
    bad = _NOT_BASE64.search(text)
    if bad:
        raise EndpointError(
            400,
            f"inputs is not base64: character {bad.group()!r} at position {bad.start()} "
            "(send the audio file as base64 text, a data: URL, or raw bytes)",
        )
    text = "".join(text.split()).translate(str.maketrans("-_", "+/"))
    # Checked before decoding so that an oversized request costs no memory beyond itself.
    if len(text) * 3 // 4 > max_bytes + 2:
        raise EndpointError(
            413,
            f"inputs: the audio file has about {len(text) * 3 // 4} bytes, "
            f"more than the {max_bytes} allowed",
        )
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except binascii.Error as error:
        raise EndpointError(400, f"inputs is not valid base64: {error}") from None


def to_response(transcript: Transcript, word_level: bool, seconds: float) -> dict[str, Any]:
    """Transcript -> the response: the asr-diarization blog's keys ("text", "chunks",
    "speakers") plus "language", "stats" and "options".

    chunks: [{"text", "timestamp": [start, end], "speaker"}], one per segment, or one per word
    when `word_level` (a segment without word times stays one chunk); "speaker" is None
    without diarization; with `multilingual` each chunk also has its segment's "language".
    speakers: consecutive segments of one speaker merged into [{"speaker", "text",
    "timestamp": [start, end]}]; [] without diarization.
    Times are seconds from the start of the audio.
    """
    chunks = []
    multilingual = bool(transcript.options.get("multilingual"))
    for segment in transcript.segments:
        parts = segment.words if word_level and segment.words else (segment,)
        for part in parts:
            chunks.append(_chunk(part.text, part.start, part.end, part.speaker))
            if multilingual:  # the language its window was decoded in
                chunks[-1]["language"] = segment.language
    speakers: list[dict[str, Any]] = []
    for segment in transcript.segments:
        if segment.speaker is None:
            continue
        if speakers and speakers[-1]["speaker"] == segment.speaker:
            speakers[-1]["text"] += segment.text
            speakers[-1]["timestamp"][1] = round(segment.end, 3)
        else:
            speakers.append(_chunk(segment.text, segment.start, segment.end, segment.speaker))
    for turn in speakers:
        turn["text"] = turn["text"].strip()
    duration = transcript.duration
    return {
        "text": transcript.text,
        "chunks": chunks,
        "speakers": speakers,
        "language": transcript.language,
        "stats": {
            **transcript.stats,
            "audio_seconds": round(duration, 3),
            "seconds": round(seconds, 3),
            "real_time_factor": round(seconds / duration, 4) if duration > 0 else None,
        },
        "options": transcript.options,
        "warnings": list(transcript.warnings),
    }


def _chunk(text: str, start: float, end: float, speaker: str | None) -> dict[str, Any]:
    return {"text": text, "timestamp": [round(start, 3), round(end, 3)], "speaker": speaker}


def whisper_checkpoint(path: str) -> str | None:
    """`path` when it is a directory holding a transformers Whisper checkpoint, else None."""
    config = Path(path) / "config.json" if path else None
    if config is None or not config.is_file():
        return None
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (ValueError, AttributeError):
        return None
    return path if model_type == "whisper" else None


class EndpointHandler:
    """Inference Endpoints handler: models load once here, `__call__` answers one request.

    path: the repository the endpoint mounted ("" outside the toolkit). When it holds a Whisper
    checkpoint (config.json with model_type "whisper"), that checkpoint is the ASR model and
    ASR_MODEL is ignored, so a repository of Whisper weights plus handler.py deploys as is.
    Otherwise ASR_MODEL, ASSISTANT_MODEL ("none": no draft) and DIARIZATION_MODEL ("embedded";
    "none": refuse diarize requests and load nothing) choose, through Settings.
    """

    def __init__(self, path: str = "", settings: Settings | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.diarization = self.settings.diarization_model != _DIARIZATION_OFF
        self.service = TranscriptionService(self.settings, asr_model=whisper_checkpoint(path))
        started = time.perf_counter()
        self.service.load(diarization=self.diarization, vad=True)
        logger.info(
            "endpoint ready in %.1f s: asr %s, assistant %s, diarization %s",
            time.perf_counter() - started,
            self.service.asr_model_name,
            self.service.draft_model_name,
            self.settings.diarization_model,
        )

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        """{"inputs": audio, "parameters": {...}} -> the response of `to_response`.
        Raises EndpointError (400/413/422) for a request that cannot be served."""
        from asr.audio import (
            SAMPLE_RATE,
            AudioChannelError,
            AudioLoadError,
            AudioStreamError,
            AudioTooLongError,
            decode_audio,
        )

        started = time.perf_counter()
        # 1. The request's shape, then its parameters: both cheap, before any decoding.
        if not isinstance(data, dict) or "inputs" not in data:
            raise EndpointError(400, 'the request must be a JSON object with "inputs"')
        unknown = sorted(set(data) - {"inputs", "parameters"})
        if unknown:
            raise EndpointError(
                400, f'unknown request keys {unknown}: send "inputs" and "parameters"'
            )
        parameters = parse_parameters(data.get("parameters"))
        options = self._options(parameters)
        # 2. The audio: bytes within the size limit, decodable, within the duration limit.
        audio = read_audio_bytes(data["inputs"], self.settings.max_audio_bytes)
        try:
            # The duration limit stops decoding early: a few MB of Opus can hold hours.
            decoded = decode_audio(
                audio,
                name="inputs",
                max_seconds=self.settings.max_audio_seconds,
                audio_stream=options.audio_stream,
                channel=options.channel,
            )
        except AudioTooLongError as error:
            raise EndpointError(413, str(error)) from None
        except (AudioStreamError, AudioChannelError) as error:  # no such stream or channel
            raise EndpointError(422, str(error)) from None
        except AudioLoadError as error:
            raise EndpointError(422, f"not decodable audio: {error}") from None
        duration = decoded.samples.size / SAMPLE_RATE
        # 3. Transcribe (and diarize); what decoding warned about joins the warnings.
        transcript = self.service.run(decoded, options)
        seconds = time.perf_counter() - started
        logger.info("%.1f s of audio in %.2f s (%s)", duration, seconds, options)
        return to_response(transcript, parameters.word_timestamps, seconds)

    def _options(self, parameters: EndpointParameters) -> ServiceOptions:
        """ServiceOptions checked against this endpoint's models: EndpointError 422."""
        try:
            options = parameters.service_options()
        except ValueError as error:
            raise EndpointError(422, f"invalid parameters: {error}") from None
        if parameters.assistant and self.service.draft is None:
            raise EndpointError(
                422,
                f"assistant: this endpoint has no assistant model (ASSISTANT_MODEL="
                f"{self.settings.assistant_model}: none for {self.service.asr_model_name})",
            )
        if options.diarize and not self.diarization:
            raise EndpointError(
                422, "diarize: diarization is off on this endpoint (DIARIZATION_MODEL=none)"
            )
        try:
            options.transcribe_options().validate(self.service.model)
        except ValueError as error:
            raise EndpointError(422, f"invalid parameters: {error}") from None
        return options

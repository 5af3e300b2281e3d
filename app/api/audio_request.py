"""One `/v1/audio/transcriptions` or `/v1/audio/translations` request: the multipart form ->
a validated `AudioRequest` and the uploaded file's bytes.

OpenAI's fields (`file`, `model`, `language`, `prompt`, `response_format`, `temperature`,
`timestamp_granularities[]`, `stream`) plus specscribe's extras (`diarize`, `num_speakers`,
`min_speakers`, `max_speakers`, `assistant`, `audio_stream`, `multilingual`, `vad` and its
thresholds, `hotwords`,
`clip_timestamps`, `repetition_ngram`, `hallucination_silence_threshold`, the temperature
fallback's `temperature_increment_on_fallback`, `compression_ratio_threshold`,
`logprob_threshold`, `no_speech_threshold` and `best_of`, and beam search's `beam_size` and
`patience`), each checked once;
anything else is refused with 400, so a misspelt option is never silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.datastructures import FormData, UploadFile

from asr.types import MAX_SPEAKERS

from ..request import (
    FALLBACK_SETTINGS,
    MAX_PROMPT_CHARACTERS,
    ServiceOptions,
    decoding_choices,
    echoed,
    off_is_none,
)
from .errors import ApiError

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
Granularity = Literal["segment", "word"]
# Form fields that may repeat (sent as `name[]` by the SDKs, or `name` repeated by hand).
LIST_FIELDS = frozenset({"timestamp_granularities"})
# What stock clients send as `model` for OpenAI's Whisper: it means the loaded Whisper.
WHISPER_ALIAS = "whisper-1"


class AudioRequest(BaseModel):
    """The form's fields other than the file, typed (form text "true", "0.2", "2" convert)."""

    # nan or infinite numbers mean nothing here (app.request.ServiceOptions)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: str | None = None  # None or "": the loaded Whisper
    language: str | None = None  # code, English name or "<|de|>"; None: detected
    multilingual: bool = False  # each window's language detected (not with `language`)
    prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARACTERS)
    response_format: ResponseFormat = "json"
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    timestamp_granularities: tuple[Granularity, ...] = ()
    stream: bool = False
    diarize: bool | None = None  # None: on when a speaker count is given
    num_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    min_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    max_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    assistant: bool | None = None  # False: decode without the draft; None: with it, if any
    vad: bool = True  # decode only where someone speaks (asr.vad)
    vad_threshold: float = Field(0.4, gt=0.0, lt=1.0)
    vad_min_speech_duration: float = Field(0.25, ge=0.0, le=60.0)
    vad_min_silence_duration: float = Field(2.0, ge=0.0, le=60.0)
    vad_speech_pad: float = Field(0.4, ge=0.0, le=60.0)
    passage_pause: float = Field(5.0, ge=0.0)  # 0: one passage
    hotwords: str | None = Field(None, max_length=MAX_PROMPT_CHARACTERS)
    audio_stream: str | None = Field(None, max_length=100)  # an index or a language
    channel: str | None = Field(None, max_length=20)  # an index from 0, left, right or mix
    clip_timestamps: str | None = Field(None, max_length=1000)
    repetition_ngram: int = Field(6, ge=0, le=50)  # 0: the repetition guard is off
    hallucination_silence_threshold: float | None = Field(None, gt=0.0)
    # The temperature fallback's settings; "off" or "none" turns one off (app.request).
    temperature_increment_on_fallback: float | None = Field(0.2, ge=0.0, le=1.0)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    beam_size: int = Field(1, ge=1, le=16)  # >1: beam search, without the draft
    patience: float = Field(1.0, gt=0.0)
    best_of: int = Field(1, ge=1, le=16)  # samples per window at each fallback temperature

    _off_is_none = field_validator(*FALLBACK_SETTINGS, mode="before")(off_is_none)

    @property
    def words(self) -> bool:
        return "word" in self.timestamp_granularities

    @property
    def segments(self) -> bool:
        """Segments in verbose_json: asked for, or no granularity asked (OpenAI's default)."""
        return "segment" in self.timestamp_granularities or not self.timestamp_granularities

    def check(self) -> AudioRequest:
        """Combinations OpenAI refuses too: ApiError 422 naming the field."""
        if self.timestamp_granularities and self.response_format != "verbose_json":
            raise ApiError(
                422,
                "timestamp_granularities needs response_format=verbose_json "
                f"(got {self.response_format})",
                param="timestamp_granularities",
            )
        if self.stream and self.response_format not in ("json", "text"):
            raise ApiError(
                422,
                f"stream needs response_format json or text (got {self.response_format}): "
                "the events carry text",
                param="stream",
            )
        return self

    def service_options(self, task: Literal["transcribe", "translate"]) -> ServiceOptions:
        """ServiceOptions for this request; ApiError 422 for values the service refuses."""
        try:
            return ServiceOptions(
                language=self.language,
                task=task,
                # The guard reads word times: computed for it whatever the response shows
                # (the API has no word_timestamps field to ask for them apart from words).
                word_timestamps=self.words or self.hallucination_silence_threshold is not None,
                use_assistant=self.assistant is not False,
                diarize=self.diarize,
                num_speakers=self.num_speakers,
                min_speakers=self.min_speakers,
                max_speakers=self.max_speakers,
                initial_prompt=self.prompt,
                temperature=self.temperature,
                **decoding_choices(self),
            )
        except ValueError as error:
            raise ApiError(422, str(error), param=_param_of(str(error))) from None


def _param_of(message: str) -> str | None:
    """The field a ServiceOptions message is about (they start with or name it)."""
    names = (
        "audio_stream",  # before "language", which its message names
        "channel",
        *FALLBACK_SETTINGS,  # before "temperature", which the increment's name starts with
        "language",
        "temperature",
        "num_speakers",
        "min_speakers",
        "max_speakers",
        "hallucination_silence_threshold",
        "repetition_ngram",
        "clip_timestamps",
        "vad_threshold",
        "vad_min_speech_duration",
        "vad_min_silence_duration",
        "vad_speech_pad",
    )
    for name in names:
        if message.startswith(name) or f"{name} " in message:
            return name
    if message.startswith("clip range") or "is not a time" in message:
        return "clip_timestamps"
    if message.startswith("initial_prompt"):
        return "prompt"
    return None


def parse_form(form: FormData) -> tuple[AudioRequest, UploadFile]:
    """The multipart form -> (AudioRequest, the upload). ApiError 400 for a missing or repeated
    field, an unknown one, or a `file` that is text; 422 for a value out of range. A field sent
    empty (`-F temperature=`, as a form or script leaves an unset input) is taken as not sent,
    whatever its type: a text field's empty value and a number's alike."""
    fields: dict[str, Any] = {}
    upload: UploadFile | None = None
    for key, value in form.multi_items():
        if key == "file":
            if not isinstance(value, UploadFile):
                raise ApiError(400, "file must be an uploaded file, not a text field", param="file")
            if upload is not None:
                raise ApiError(400, "send one file per request", param="file")
            upload = value
            continue
        name = key.removesuffix("[]")
        if isinstance(value, UploadFile):
            raise ApiError(400, f"{name} must be a text field, not a file", param=name)
        if not value.strip() and name in AudioRequest.model_fields:
            continue
        if name in LIST_FIELDS:
            fields.setdefault(name, []).append(value)
        elif name in fields:
            raise ApiError(400, f"{name} is given more than once", param=name)
        else:
            fields[name] = value
    if upload is None:
        raise ApiError(
            400, "file is missing: send the audio as the multipart field 'file'", param="file"
        )
    try:
        request = AudioRequest.model_validate(fields)
    except ValidationError as error:
        raise _refusal(error) from None
    return request.check(), upload


def _refusal(error: ValidationError) -> ApiError:
    problems = error.errors()
    unknown = [str(p["loc"][0]) for p in problems if p["type"] == "extra_forbidden"]
    if unknown:
        accepted = ", ".join(["file", *AudioRequest.model_fields])
        return ApiError(
            400,
            f"unknown field {', '.join(unknown)} (accepted: {accepted})",
            param=unknown[0],
            code="unknown_parameter",
        )
    first = problems[0]
    param = str(first["loc"][0]) if first["loc"] else None
    described = "; ".join(
        f"{'.'.join(map(str, p['loc']))}: {p['msg']} (got {echoed(p.get('input'))})"
        for p in problems
    )
    return ApiError(422, described, param=param)

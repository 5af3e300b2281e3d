"""A Transcript -> the body OpenAI's `response_format` asks for: json, text, srt, vtt or
verbose_json (OpenAI's fields, plus speakers and the decode statistics).

verbose_json segments carry OpenAI's fields from the decoded windows (`DecidedWindow`): `seek`
(the window's first frame), `tokens` (timestamps included), `temperature` and the window's
`compression_ratio`. A segment that diarization split out of a decoded one (its words changed
speaker) keeps its window's seek, temperature and ratio, and has `tokens: []`: its tokens are
not a slice the decoder made.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response

from asr.languages import LANGUAGES
from asr.types import DecidedWindow, Segment, Transcript
from asr.writers import WRITERS

from .audio_request import AudioRequest


def usage(transcript: Transcript) -> dict[str, Any]:
    """OpenAI's usage for Whisper: billed by audio duration."""
    return {"type": "duration", "seconds": round(transcript.duration, 3)}


def render(
    transcript: Transcript,
    request: AudioRequest,
    task: str,
    windows: list[DecidedWindow],
) -> Response:
    """The response for `request.response_format`. Whatever the format, the transcript's
    warnings (a language the speech is not, audio cut short, text left out) also travel in the
    `X-Specscribe-Warnings` header, a JSON list in ASCII; json carries them as "warnings" too
    when there are any (verbose_json always)."""
    headers = (
        {WARNINGS_HEADER: json.dumps(list(transcript.warnings))} if transcript.warnings else {}
    )
    match request.response_format:
        case "json":
            body = {"text": transcript.text, "usage": usage(transcript)}
            if transcript.warnings:
                body["warnings"] = list(transcript.warnings)
            return JSONResponse(body, headers=headers)
        case "text":
            return PlainTextResponse(transcript.text + "\n", headers=headers)
        case "srt" | "vtt" as name:
            return PlainTextResponse(WRITERS[name](transcript, "audio"), headers=headers)
        case "verbose_json":
            return JSONResponse(verbose_json(transcript, request, task, windows), headers=headers)
    raise AssertionError(request.response_format)  # AudioRequest admits no other value


WARNINGS_HEADER = "X-Specscribe-Warnings"


def language_fields(transcript: Transcript, task: str) -> dict[str, str]:
    """The text's language as verbose_json and the streamed `transcript.text.done` give it:
    `language` (its English name, as OpenAI gives it) and `language_code`; a translation's text
    is English, always, and the speech's own language goes in `source_language(_code)`."""
    spoken = {
        "language": LANGUAGES.get(transcript.language, transcript.language),
        "language_code": transcript.language,
    }
    if task != "translate":
        return spoken
    return {
        "language": LANGUAGES["en"],
        "language_code": "en",
        "source_language": spoken["language"],
        "source_language_code": spoken["language_code"],
    }


def verbose_json(
    transcript: Transcript, request: AudioRequest, task: str, windows: list[DecidedWindow]
) -> dict[str, Any]:
    """OpenAI's verbose_json: task, language (its English name, as OpenAI gives it: for a
    translation, the text's, English), duration, text, segments (unless only words were asked
    for), words (when asked for), usage; and specscribe's: language_code (and each segment's
    language with `multilingual`), for a translation the speech's source_language and
    source_language_code, speakers
    (the diarizer's turns, when diarized), stats (decode statistics: target and draft calls,
    tokens per target call, seconds per stage), warnings."""
    body: dict[str, Any] = {
        "task": task,
        **language_fields(transcript, task),
        "duration": round(transcript.duration, 3),
        "text": transcript.text,
    }
    diarized = bool(transcript.turns) or any(s.speaker for s in transcript.segments)
    if request.segments:
        origins = _Origins(windows)
        body["segments"] = [
            _segment(index, segment, origins, diarized, request.multilingual)
            for index, segment in enumerate(transcript.segments)
        ]
    if request.words:
        body["words"] = [
            {
                "word": word.text.strip(),
                "start": round(word.start, 3),
                "end": round(word.end, 3),
                "probability": round(word.probability, 4),
                **({"speaker": word.speaker} if diarized else {}),
            }
            for segment in transcript.segments
            for word in segment.words
        ]
    if diarized:
        body["speakers"] = [
            {"speaker": t.speaker, "start": round(t.start, 3), "end": round(t.end, 3)}
            for t in transcript.turns
        ]
    body["usage"] = usage(transcript)
    body["stats"] = transcript.stats
    body["warnings"] = list(transcript.warnings)
    return body


class _Origins:
    """Finds the decoded window (and the tokens) a transcript segment came from.

    A decoded segment is known by its text and either of its times: merging speakers may move
    its start to where the speaker's turn starts (`diarize.merge.starts_in_speech`), and a
    segment split between speakers has another text, and no tokens of its own."""

    def __init__(self, windows: list[DecidedWindow]) -> None:
        self.windows = sorted(windows, key=lambda w: w.seek)
        self.tokens = {
            key: tokens
            for window in windows
            for segment, tokens in zip(window.segments, window.tokens, strict=True)
            for key in _keys(segment)
        }

    def window(self, segment: Segment) -> DecidedWindow | None:
        frame = round(segment.start * 100)
        found = None
        for window in self.windows:
            if window.seek <= frame:
                found = window
        return found

    def tokens_of(self, segment: Segment) -> tuple[int, ...]:
        found = (self.tokens.get(key) for key in _keys(segment))
        return next((tokens for tokens in found if tokens is not None), ())


def _keys(segment: Segment) -> tuple[tuple[str, str, float], ...]:
    return (("start", segment.text, segment.start), ("end", segment.text, segment.end))


def _segment(
    index: int, segment: Segment, origins: _Origins, diarized: bool, multilingual: bool
) -> dict[str, Any]:
    """OpenAI's segment fields, and specscribe's: the speaker when diarized, and with
    `multilingual` the segment's own language (its English name, and its code)."""
    window = origins.window(segment)
    language = segment.language or ""
    return {
        "id": index,
        "seek": window.seek if window else 0,
        "start": round(segment.start, 3),
        "end": round(segment.end, 3),
        "text": segment.text,
        "tokens": list(origins.tokens_of(segment)),
        "temperature": window.temperature if window else 0.0,
        "avg_logprob": round(segment.avg_logprob, 6),
        "compression_ratio": round(window.compression_ratio, 6) if window else 0.0,
        "no_speech_prob": round(segment.no_speech_prob, 6),
        **({"speaker": segment.speaker} if diarized else {}),
        **(
            {"language": LANGUAGES.get(language, language), "language_code": segment.language}
            if multilingual
            else {}
        ),
    }

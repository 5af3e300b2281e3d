"""ServiceOptions: what one transcription request asks for, checked once, the same for every front.

The CLI (transcribe, submit), the web UI, the Inference Endpoint handler, the OpenAI-compatible
API and the job store all build this one pydantic model; whatever it holds has passed every
rule below, so no later stage checks a request again (only what depends on the loaded model:
`asr.transcribe.TranscribeOptions.validate`). One rule for each question:

- a language is a Whisper code; a code, an English name ("German") or a token ("<|de|>") is
  turned into the code, and "", "auto" or None mean: detect it;
- speaker counts ask for speakers: given without `diarize`, they turn diarization on; given with
  `diarize=False`, the request contradicts itself and is refused;
- an audio stream is an index counted from 0 (a number or its digits) or a language, spelled
  as a language is; empty text means the one a player would play;
- empty text means none (prompt, hotwords, clip ranges), and a repetition n-gram of 0 turns
  the repetition guard off; the fallback's thresholds and increment are turned off by None or
  "off" / "none" (and the increment by 0);
- numbers in range, VAD settings, clip ranges, guard settings and speaker counts are checked
  by the objects that use them (`asr.vad.VadOptions`, `asr.speech_timeline`,
  `asr.transcribe.TranscribeOptions`, `diarize.pipeline.DiarizeOptions`), at construction.

A bad request raises ValueError naming the field; fronts turn that into their own errors
(exit status 2, HTTP 400/422, a message in the page).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from asr.types import MAX_BATCH_SIZE

MAX_PROMPT_CHARACTERS = 4000  # a sanity bound: a longer prompt is a mistake, not a prompt

# The temperature fallback's settings (OpenAI's names): None, or one of OFF_WORDS, turns one off.
FALLBACK_SETTINGS = (
    "temperature_increment_on_fallback",
    "compression_ratio_threshold",
    "logprob_threshold",
    "no_speech_threshold",
)
OFF_WORDS = ("off", "none", "null")
# Channels by name (`ServiceOptions.channel`): a stereo file's, as players name them.
CHANNEL_NAMES = {"left": 0, "right": 1}
# The smallest step of the fallback's schedule: at most 21 temperatures from 0 to 1.
MIN_FALLBACK_INCREMENT = 0.05

# ServiceOptions fields every front takes under the same names (CLI flags, endpoint
# parameters, API form fields): `decoding_choices` copies them from a front's request.
DECODING_CHOICES = (
    "audio_stream",
    "channel",
    "multilingual",
    "hotwords",
    "clip_timestamps",
    "vad",
    "vad_threshold",
    "vad_min_speech_duration",
    "vad_min_silence_duration",
    "vad_speech_pad",
    "passage_pause",
    "repetition_ngram",
    "hallucination_silence_threshold",
    *FALLBACK_SETTINGS,
    "beam_size",
    "patience",
    "best_of",
)

SPEAKER_COUNTS = ("num_speakers", "min_speakers", "max_speakers")


def language_code(value: str | None) -> str | None:
    """Whisper's language code for a code ("de", or ISO 639-2/3's "deu" and "ger"), a locale's
    tag ("pt-BR", "en_US", "deu-DE": its language, as Whisper has no regions), an English name
    ("German") or a token ("<|de|>"); None, "" and "auto" mean: detect it. Unknown values pass
    through, for ServiceOptions to refuse."""
    if value is None:
        return None
    from asr.languages import LANGUAGES, OTHER_CODES, TO_LANGUAGE_CODE

    text = value.strip().lower().removeprefix("<|").removesuffix("|>")
    if text in ("", "auto"):
        return None
    if text in LANGUAGES or text in TO_LANGUAGE_CODE:
        return TO_LANGUAGE_CODE.get(text, text)
    if text.replace("_", "-") == "zh-yue":  # Cantonese, not Chinese
        return "yue"
    # A POSIX locale's encoding and modifier ("en_US.UTF-8", "sr_RS@latin") name no language.
    text = text.partition(".")[0].partition("@")[0] or text
    language, _, region = text.replace("_", "-").partition("-")
    language = OTHER_CODES.get(language, language)
    if language in LANGUAGES and (region or language != text):
        return language
    return text


def check_formats(formats: tuple[str, ...] | list[str], diarize: bool) -> None:
    """Output formats a request may ask for (files written by the CLI and the job worker):
    known names, at least one, and rttm only with speakers (it holds the diarizer's turns)."""
    from asr.writers import WRITERS

    if not formats:
        raise ValueError("formats is empty: name at least one output format")
    unknown = [name for name in formats if name not in WRITERS]
    if unknown:
        raise ValueError(f"unknown format {', '.join(unknown)}; choose from {', '.join(WRITERS)}")
    if "rttm" in formats and not diarize:
        raise ValueError(
            "format rttm needs speakers (--diarize; diarize=true in a request): RTTM holds the "
            "diarizer's speaker turns"
        )


def off_is_none(value: Any) -> Any:
    """A setting given as "off" / "none" / "null" (any case; form text and CLI words) -> None,
    which turns it off; anything else unchanged."""
    if isinstance(value, str) and value.strip().lower() in OFF_WORDS:
        return None
    return value


def decoding_choices(request: object) -> dict:
    """The DECODING_CHOICES of a front's request (an argparse namespace, a pydantic model), as
    ServiceOptions keyword arguments."""
    return {name: getattr(request, name) for name in DECODING_CHOICES}


class ServiceOptions(BaseModel):
    """What one request asks for (module docstring); constructing one checks it."""

    # nan or infinite seconds, probabilities and temperatures mean nothing: refused as such
    # ("temperature: input should be a finite number", not "... less than or equal to 1")
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # Which audio stream of a file with several (a film's languages, a second microphone):
    # its index among them, counted from 0 as ffmpeg's -map 0:a:N counts, or the first tagged
    # with this language (a code, as `language`); None: the one a player would play
    # (asr.audio.AudioStream).
    audio_stream: int | str | None = None
    # One channel of it alone, counted from 0 (0: left, 1: right; "left" and "right" are
    # read as those): a call with each side on its own channel; None: every channel mixed
    # (asr.audio.AudioChannel).
    channel: int | None = None
    language: str | None = None  # None: detected
    # Each window's language detected from the window (recordings that change language);
    # without it the first window's language holds. Not with `language`.
    multilingual: bool = False
    task: Literal["transcribe", "translate"] = "transcribe"
    word_timestamps: bool = False
    use_assistant: bool = True  # draft with the service's assistant, when it has one
    diarize: bool = False  # also on when a speaker count is given
    # Ranges and consistency: diarize.pipeline.DiarizeOptions (1..MAX_SPEAKERS, min <= max).
    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None
    batch_size: int = Field(
        1, ge=1, le=MAX_BATCH_SIZE
    )  # >1: windows cut at silences, decoded together
    # Text the first window is prompted with (spellings, names, style); every window with
    # batch_size > 1, whose windows have no text before them.
    initial_prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARACTERS)
    # Each window prompted with the text before it (OpenAI's default); off, a window that went
    # wrong cannot lead the next into repeating it. Always off with batch_size > 1.
    condition_on_previous_text: bool = True
    # The first decoding temperature (OpenAI's `temperature`): 0 decodes greedily and falls
    # back to sampling where the text fails the quality checks; t > 0 samples from the start,
    # then hotter by `temperature_increment_on_fallback` (openai-whisper's --temperature).
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    # Words carried into every window's prompt (names, jargon): faster-whisper's hotwords.
    hotwords: str | None = Field(None, max_length=MAX_PROMPT_CHARACTERS)
    # Voice activity detection (`asr.vad`): decode only the speech regions it finds.
    vad: bool = True
    vad_threshold: float = 0.4  # chosen on the development speech (docs/vad.md)
    vad_min_speech_duration: float = 0.25  # s: shorter speech is ignored
    vad_min_silence_duration: float = 2.0  # s: shorter pauses stay inside a region
    vad_speech_pad: float = 0.4  # s: added on both sides of every region
    # Speech resuming after a cut-out pause (VAD, clip ranges) this long (s) decodes as its own
    # passage, side by side with the others, unprompted by their text (asr.passages). None: off.
    passage_pause: float | None = 5.0
    # Only these ranges of the file: "start,end,..." seconds or "10:00-20:00,..." (OpenAI's
    # --clip_timestamps); None: all of it.
    clip_timestamps: str | None = None
    # Hallucination guards (asr.guards): a segment repeating earlier text has its window
    # decoded again without the previous-text prompt, whose text then stands (None: off);
    # with word timestamps, anomalous words alone between pauses longer than
    # this many seconds are dropped (None: off).
    repetition_ngram: int | None = 6
    hallucination_silence_threshold: float | None = None
    # Temperature fallback (OpenAI's): a window whose text repeats itself (gzip compression
    # ratio above the threshold) or is improbable (average log-probability below it) is
    # decoded again, `temperature_increment_on_fallback` hotter each time up to 1.0; a window
    # whose no-speech probability is above that threshold while its text is improbable is
    # skipped as silence. None (or 0 for the increment): off.
    temperature_increment_on_fallback: float | None = Field(0.2, ge=0.0, le=1.0)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    # Temperature 0 as beam search of this many hypotheses (decoding.beam), without the
    # draft; 1: greedy, which the draft speeds up. patience: ended hypotheses collected before
    # a window stops, as a multiple of beam_size (OpenAI's).
    beam_size: int = Field(1, ge=1, le=16)
    patience: float = Field(1.0, gt=0)
    # Samples drawn for a window at each temperature above 0, the most probable per token kept.
    best_of: int = Field(1, ge=1, le=16)

    def __init__(self, **fields: Any) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as error:  # one line per problem, in the request's own terms
            raise ValueError(describe(error)) from None

    @classmethod
    def from_json(cls, text: str) -> ServiceOptions:
        """Options stored by `to_json` (the job store)."""
        import json

        return cls(**json.loads(text))

    def to_json(self) -> str:
        import json

        return json.dumps(self.model_dump(), sort_keys=True)

    def replace(self, **changes: Any) -> ServiceOptions:
        """A copy with these fields changed, checked as a new request is."""
        return ServiceOptions(**{**self.model_dump(), **changes})

    # -- the rules (module docstring) --------------------------------------------------

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        code = language_code(value)
        from asr.languages import LANGUAGES

        # Every Whisper's languages are among these codes; a model's own list is checked when
        # it is loaded (English-only models take "en" alone).
        if code is not None and code not in LANGUAGES:
            raise ValueError(
                f"language {echoed(value)} is not a Whisper language code: "
                f"{', '.join(sorted(LANGUAGES))}"
                " (or an English name, an ISO 639-2/3 code or a locale of one: German, deu, de-AT)"
            )
        return code

    @field_validator("audio_stream", mode="before")
    @classmethod
    def _audio_stream(cls, value: Any) -> Any:
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        text = value.strip() if isinstance(value, str) else None
        if text == "":
            return None
        if text is not None and text.isascii() and text.isdigit():
            return int(text)
        code = language_code(text) if text is not None else None
        from asr.languages import LANGUAGES

        if code not in LANGUAGES:
            raise ValueError(
                f"audio_stream {echoed(value)} is neither a stream's index (0, 1, ...: they "
                "count from 0) nor a language (eng, de, German)"
            )
        return code

    @field_validator("channel", mode="before")
    @classmethod
    def _channel(cls, value: Any) -> Any:
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        text = value.strip().lower() if isinstance(value, str) else None
        if text in ("", "mix", "all"):
            return None
        if text in CHANNEL_NAMES:
            return CHANNEL_NAMES[text]
        if text is not None and text.isascii() and text.isdigit():
            return int(text)
        raise ValueError(
            f"channel {echoed(value)} is none of a channel's index (0, 1, ...: they count "
            "from 0), left, right or mix"
        )

    @field_validator("initial_prompt", "hotwords", "clip_timestamps", mode="before")
    @classmethod
    def _empty_text_is_none(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("clip_timestamps")
    @classmethod
    def _clip_ranges_in_one_spelling(cls, value: str | None) -> str | None:
        """Checks the ranges and spells them one way (`asr.speech_timeline.clip_ranges_text`),
        so that "2-4.5,7-" and "2,4.5,7" make the same output record and a rerun skips."""
        if value is None:
            return None
        from asr.speech_timeline import clip_ranges_text, parse_clip_ranges

        return clip_ranges_text(parse_clip_ranges(value))

    @field_validator("repetition_ngram", "passage_pause", mode="before")
    @classmethod
    def _zero_is_off(cls, value: Any) -> Any:
        return None if value == 0 else value

    @field_validator(*FALLBACK_SETTINGS, mode="before")
    @classmethod
    def _off_is_none(cls, value: Any) -> Any:
        return off_is_none(value)

    @field_validator("temperature_increment_on_fallback")
    @classmethod
    def _no_increment_is_off(cls, value: float | None) -> float | None:
        if value == 0:
            return None
        if value is not None and value < MIN_FALLBACK_INCREMENT:
            raise ValueError(
                f"temperature_increment_on_fallback must be 0 (no fallback) or at least "
                f"{MIN_FALLBACK_INCREMENT} (each step decodes a failing window again), not {value}"
            )
        return value

    @field_validator("passage_pause")
    @classmethod
    def _a_pause_is_seconds(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:  # not finite: refused by the model's config
            raise ValueError(
                f"passage_pause must be 0 (off) or a positive number of seconds, not {value}"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _counts_ask_for_speakers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        given = [name for name in SPEAKER_COUNTS if data.get(name) is not None]
        if data.get("diarize") is False and given:
            raise ValueError(f"{', '.join(given)} needs diarize=True (counts label speakers)")
        if data.get("diarize") is None:
            data = {**data, "diarize": bool(given)}
        return data

    @model_validator(mode="after")
    def _patience_is_for_beams(self) -> ServiceOptions:
        if self.patience != 1.0 and self.beam_size == 1:
            raise ValueError(
                "patience: needs beam_size > 1 (it counts the ended hypotheses of beam search)"
            )
        return self

    @model_validator(mode="after")
    def _settings_hold(self) -> ServiceOptions:
        if self.vad:
            self.vad_options()  # raises on out-of-range thresholds and durations
        self.transcribe_options()  # guard settings (ranges, word timestamps)
        if self.diarize:
            self.speaker_options()  # raises on inconsistent counts
        return self

    # -- what the stages take ----------------------------------------------------------

    def vad_options(self):
        from asr.vad import VadOptions

        return VadOptions(
            threshold=self.vad_threshold,
            min_speech_duration=self.vad_min_speech_duration,
            min_silence_duration=self.vad_min_silence_duration,
            speech_pad=self.vad_speech_pad,
        ).validate()

    def clip_spans(self):
        """The clip ranges as sorted (start, end) seconds, or None for the whole file."""
        from asr.speech_timeline import parse_clip_ranges

        if self.clip_timestamps is None:
            return None
        return parse_clip_ranges(self.clip_timestamps)

    def speaker_options(self):
        from diarize.options import DiarizeOptions

        return DiarizeOptions(self.num_speakers, self.min_speakers, self.max_speakers).validate()

    def transcribe_options(self):
        from asr.transcribe import TranscribeOptions

        batched = self.batch_size > 1
        return TranscribeOptions(
            language=self.language,
            multilingual=self.multilingual,
            task=self.task,
            word_timestamps=self.word_timestamps,
            windows="silence" if batched else "seek",
            condition_on_previous_text=self.condition_on_previous_text and not batched,
            initial_prompt=self.initial_prompt,
            hotwords=self.hotwords,
            batch_size=self.batch_size,
            temperatures=self.temperatures(),
            compression_ratio_threshold=self.compression_ratio_threshold,
            logprob_threshold=self.logprob_threshold,
            no_speech_threshold=self.no_speech_threshold,
            repetition_ngram=self.repetition_ngram,
            passage_pause=self.passage_pause,
            hallucination_silence_threshold=self.hallucination_silence_threshold,
            beam_size=self.beam_size,
            patience=self.patience,
            best_of=self.best_of,
        ).checked()

    def temperatures(self) -> tuple[float, ...]:
        """The fallback schedule: `temperature`, then hotter by the increment up to 1.0
        (t, t + 0.2, ... by default); `temperature` alone when the increment is off."""
        increment = self.temperature_increment_on_fallback
        if increment is None:
            return (self.temperature,)
        count = int((1.0 - self.temperature) / increment + 1e-6) + 1
        return tuple(round(self.temperature + increment * step, 6) for step in range(count))


def describe(error: ValidationError) -> str:
    """A pydantic error as "field: what is wrong (got value)", one clause per problem; rules
    that raise ValueError themselves keep their own words."""
    clauses = []
    for problem in error.errors():
        message = problem["msg"].removeprefix("Value error, ")
        name = ".".join(str(part) for part in problem["loc"])
        if problem["type"] == "value_error":
            own_words = not name or message.startswith(name)
            clauses.append(message if own_words else f"{name}: {message}")
        elif problem["type"] == "extra_forbidden":
            clauses.append(f"{name}: unknown option")
        else:
            off = " or off" if name in FALLBACK_SETTINGS else ""  # what turns them off
            described = f"{message[:1].lower()}{message[1:]}{off}"
            clauses.append(f"{name}: {described} (got {echoed(problem['input'])})")
    return "; ".join(clauses)


def echoed(value: Any) -> str:
    """A value as an error message quotes it: whole where short, else its first characters and
    how long it is (a 13 000-character prompt was echoed, cut mid-quote; a megabyte `language`
    form field came back whole in the API's error)."""
    shown = repr(value)
    if len(shown) <= _ECHO_CHARACTERS:
        return shown
    if isinstance(value, str):
        return f"{value[:_ECHO_CHARACTERS]!r}…, {len(value)} characters"
    return f"{shown[:_ECHO_CHARACTERS]}…"


_ECHO_CHARACTERS = 60

"""TranscriptionService: the composition root every front (CLI, UI, endpoint, worker) uses.

It loads the models once, lazily (the diarizer only when a request asks for speakers), and turns
audio plus `ServiceOptions` into a `Transcript`. Requests may come from several threads (the
Gradio queue, the worker); the models are not re-entrant, so one request runs at a time.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from app.config import Settings
from asr.types import (
    DecidedWindow,
    ProgressHook,
    Segment,
    SpeakerTurn,
    Transcript,
    WindowHook,
    no_progress,
)

if TYPE_CHECKING:
    from asr.models import ModelRegistry
    from asr.vad import VoiceActivityDetector
    from asr.whisper import WhisperModel
    from asr.whisper_drafters import Assistant
    from diarize.pipeline import Diarization, DiarizeOptions, Diarizer

AudioInput = str | Path | bytes | np.ndarray
"""A path, the bytes of an audio file, or float32 16 kHz mono samples."""


def language_code(value: str | None) -> str | None:
    """Whisper's language code for a code ("de"), an English name ("German") or a token
    ("<|de|>"); None, "" and "auto" mean: detect it. Unknown values pass through, for
    ServiceOptions.validate to refuse."""
    if value is None:
        return None
    from asr.languages import TO_LANGUAGE_CODE

    text = value.strip().lower().removeprefix("<|").removesuffix("|>")
    if text in ("", "auto"):
        return None
    return TO_LANGUAGE_CODE.get(text, text)


MAX_PROMPT_CHARACTERS = 4000  # a sanity bound: a longer prompt is a mistake, not a prompt

# ServiceOptions fields every front takes under the same names (CLI flags, endpoint
# parameters, API form fields): `decoding_choices` copies them from a front's request.
DECODING_CHOICES = (
    "hotwords",
    "clip_timestamps",
    "vad",
    "vad_threshold",
    "vad_min_speech_duration",
    "vad_min_silence_duration",
    "vad_speech_pad",
    "repetition_ngram",
    "hallucination_silence_threshold",
)


def decoding_choices(request: object) -> dict:
    """The DECODING_CHOICES of a front's request (an argparse namespace, a pydantic model), as
    ServiceOptions keyword arguments: empty text means none, a repetition n-gram of 0 off."""
    choices = {name: getattr(request, name) for name in DECODING_CHOICES}
    for name in ("hotwords", "clip_timestamps"):
        choices[name] = choices[name] or None
    choices["repetition_ngram"] = choices["repetition_ngram"] or None
    return choices


@dataclass(frozen=True)
class ServiceOptions:
    """What one request asks for; `validate` names the offending field."""

    language: str | None = None  # None: detected
    task: Literal["transcribe", "translate"] = "transcribe"
    word_timestamps: bool = False
    use_assistant: bool = True  # draft with the service's assistant, when it has one
    diarize: bool = False
    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None
    batch_size: int = 1  # >1: windows cut at silences, decoded together
    # Text the first window is prompted with (spellings, names, style); every window with
    # batch_size > 1, whose windows have no text before them.
    initial_prompt: str | None = None
    # Each window prompted with the text before it (OpenAI's default); off, a window that went
    # wrong cannot lead the next into repeating it. Always off with batch_size > 1.
    condition_on_previous_text: bool = True
    # The first decoding temperature (OpenAI's `temperature`): 0 decodes greedily and falls
    # back to sampling where the text fails the quality checks; t > 0 samples from the start,
    # then t + 0.2, ... up to 1.0 (openai-whisper's --temperature with its 0.2 increment).
    temperature: float = 0.0
    # Words carried into every window's prompt (names, jargon): faster-whisper's hotwords.
    hotwords: str | None = None
    # Voice activity detection (`asr.vad`): decode only the speech regions it finds.
    vad: bool = True
    vad_threshold: float = 0.4  # chosen on the development speech (docs/vad.md)
    vad_min_speech_duration: float = 0.25  # s: shorter speech is ignored
    vad_min_silence_duration: float = 2.0  # s: shorter pauses stay inside a region
    vad_speech_pad: float = 0.4  # s: added on both sides of every region
    # Only these ranges of the file: "start,end,..." seconds or "10:00-20:00,..." (OpenAI's
    # --clip_timestamps); None: all of it.
    clip_timestamps: str | None = None
    # Hallucination guards (asr.guards): a segment repeating earlier text has its window
    # decoded again without the previous-text prompt, and is dropped if it still repeats
    # (None: off); with word timestamps, anomalous words alone between pauses longer than
    # this many seconds are dropped (None: off).
    repetition_ngram: int | None = 6
    hallucination_silence_threshold: float | None = None

    def validate(self) -> ServiceOptions:
        from asr.languages import LANGUAGES

        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', not {self.task!r}")
        # Every Whisper's languages are among these codes; a model's own list is checked when
        # it is loaded (English-only models take "en" alone).
        if self.language is not None and self.language not in LANGUAGES:
            raise ValueError(
                f"language {self.language!r} is not a Whisper language code: "
                f"{', '.join(sorted(LANGUAGES))}"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")
        if self.initial_prompt is not None and len(self.initial_prompt) > MAX_PROMPT_CHARACTERS:
            raise ValueError(
                f"initial_prompt is {len(self.initial_prompt)} characters; at most "
                f"{MAX_PROMPT_CHARACTERS} (Whisper reads only the last 223 tokens of a prompt)"
            )
        if not 0.0 <= self.temperature <= 1.0:
            raise ValueError(f"temperature must be in [0, 1], not {self.temperature}")
        if self.hotwords is not None and len(self.hotwords) > MAX_PROMPT_CHARACTERS:
            raise ValueError(
                f"hotwords is {len(self.hotwords)} characters; at most {MAX_PROMPT_CHARACTERS}"
            )
        if self.vad:
            self.vad_options()  # raises on out-of-range thresholds and durations
        if self.clip_timestamps is not None:
            self.clip_spans()  # raises on malformed ranges
        self.transcribe_options()  # guard settings (ranges, word timestamps)
        speaker_counts = {
            "num_speakers": self.num_speakers,
            "min_speakers": self.min_speakers,
            "max_speakers": self.max_speakers,
        }
        given = [name for name, value in speaker_counts.items() if value is not None]
        if given and not self.diarize:
            raise ValueError(f"{', '.join(given)} needs diarize=True")
        if self.diarize:
            self.speaker_options()  # raises on inconsistent counts
        return self

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
        from diarize.pipeline import DiarizeOptions

        return DiarizeOptions(self.num_speakers, self.min_speakers, self.max_speakers).validate()

    def transcribe_options(self):
        from asr.transcribe import TranscribeOptions

        batched = self.batch_size > 1
        return TranscribeOptions(
            language=self.language,
            task=self.task,
            word_timestamps=self.word_timestamps,
            windows="silence" if batched else "seek",
            condition_on_previous_text=self.condition_on_previous_text and not batched,
            initial_prompt=self.initial_prompt or None,
            hotwords=self.hotwords or None,
            batch_size=self.batch_size,
            **({"temperatures": self.temperatures()} if self.temperature > 0 else {}),
            repetition_ngram=self.repetition_ngram,
            hallucination_silence_threshold=self.hallucination_silence_threshold,
        ).checked()

    def temperatures(self) -> tuple[float, ...]:
        """The fallback schedule starting at `temperature` (t, t + 0.2, ... <= 1.0)."""
        count = int((1.0 - self.temperature) / 0.2 + 1e-6) + 1
        return tuple(round(self.temperature + 0.2 * step, 6) for step in range(count))


# Options and the value every output made before them was made with.
_BEFORE_RECORDED = {
    "initial_prompt": None,
    "condition_on_previous_text": True,
    "temperature": 0.0,
    "hotwords": None,
    "vad": False,
    "clip_timestamps": None,
    "repetition_ngram": None,
    "hallucination_silence_threshold": None,
}


def _choose_assistant(requested: str, asr_model: str) -> str:
    """The requested draft; for "auto", the shipped draft distilled for this ASR model when one
    is built (asr.models.SHIPPED_DRAFTS, e.g. whisper-base-draft for whisper-base), else none.
    It pays in every precision the decoder runtime offers (docs/benchmarks.md)."""
    if requested != "auto":
        return requested
    from asr.models import shipped_draft_ready

    name = f"{asr_model}-draft"
    return name if shipped_draft_ready(name) else "none"


def _file_name(path: str) -> str:
    """A file name that stands for a model path or hub id (its quantized layers' store)."""
    import hashlib

    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return f"{Path(path).name}-{digest}"


class TranscriptionService:
    """Models loaded once; `run` turns one request into a Transcript.

    asr_model / assistant_model / diarization_model: embedded names, local directories or hub
    ids (None: the settings' choice). assistant_model "none" decodes without a draft,
    "prompt-lookup" drafts from the window's own text (no model), "auto"
    (the default) with the shipped draft distilled for the ASR model, if there is one;
    diarization_model "embedded" is the offline segmentation-3.0 + CAM++ pipeline.
    precision: auto | fp32 | bf16 | fp16 | mixed | int8 (`asr.precision`) for the target and
    the draft.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        asr_model: str | None = None,
        assistant_model: str | None = None,
        diarization_model: str | None = None,
        device: str | None = None,
        precision: str | None = None,
        progress: ProgressHook = no_progress,
    ) -> None:
        from asr.models import check_model_name

        self.settings = settings or Settings.from_env()
        self.asr_model_name = asr_model or self.settings.asr_model
        check_model_name(self.asr_model_name, kind="whisper")
        self.diarization_model_name = diarization_model or self.settings.diarization_model
        from asr.precision import check_device, resolve_precision

        # Settled once, before any model loads: a device this machine lacks, or a bad
        # (device, precision) pair, fails here.
        self.device = check_device(device or self.settings.device)
        self.dtypes = resolve_precision(self.device, precision or self.settings.precision)
        self.assistant_model_name = _choose_assistant(
            assistant_model or self.settings.assistant_model, self.asr_model_name
        )
        self.dtype = self.dtypes.decoder
        self.precision = self.dtypes.name  # resolved, e.g. "bf16 encoder, int8 decoder"
        self._load_progress = progress
        self._lock = threading.Lock()
        self._registry: ModelRegistry | None = None
        self._model: WhisperModel | None = None
        self._assistant: Assistant | None = None
        self._diarizer: Diarizer | None = None
        self._vad: VoiceActivityDetector | None = None

    def output_record(self, options: ServiceOptions) -> dict:
        """What decides a request's outputs, as JSON values: the model, the precision and the
        request's options (the draft is left out: it never changes the output)."""
        request = dataclasses.asdict(options)
        del request["use_assistant"]
        # Options added after records began are recorded only when they differ from what
        # outputs were made with before them, so those outputs still count as made that way
        # (and outputs made without VAD or the repetition guard are redone with them).
        for name, before in _BEFORE_RECORDED.items():
            if request[name] == before:
                del request[name]
        if not options.vad:
            for name in [name for name in request if name.startswith("vad_")]:
                del request[name]
        # "speakers": how words get speakers; outputs labelled segment by segment (before
        # segments were split at speaker changes) are made again.
        diarizer = (
            {"diarization_model": self.diarization_model_name, "speakers": "per word"}
            if options.diarize
            else {}
        )
        return {"model": self.asr_model_name, "precision": self.precision, **request, **diarizer}

    # -- models, each loaded on first use -------------------------------------------------

    @property
    def registry(self) -> ModelRegistry:
        if self._registry is None:
            from asr.models import ModelRegistry

            self._registry = ModelRegistry(self.settings.cache_dir, progress=self._load_progress)
        return self._registry

    @property
    def model(self) -> WhisperModel:
        if self._model is None:
            from asr.whisper import WhisperModel

            path = self.registry.resolve(self.asr_model_name)
            self._model = WhisperModel.load(
                path,
                self.device,
                self.dtypes.decoder,
                encoder_dtype=self.dtypes.encoder,
                int8_decoder=self.dtypes.int8_decoder,
                int8_store=self.settings.cache_dir / "int8" / f"{_file_name(path)}.safetensors",
            )
        return self._model

    @property
    def assistant(self) -> Assistant | None:
        if self.assistant_model_name == "none":
            return None
        if self._assistant is None:
            from asr.whisper_drafters import LOOKUP, LookupAssistant, load_assistant

            if self.assistant_model_name == LOOKUP:  # no model to load
                self._assistant = LookupAssistant(self.model)
                return self._assistant
            # The draft computes in the target's dtype and device (load_assistant): a
            # shared-encoder draft reads the target's encoder output, and both see logits of
            # the same precision.
            draft_path = self.registry.resolve(self.assistant_model_name)
            self._assistant = load_assistant(self.model, draft_path)
        return self._assistant

    @property
    def diarizer(self) -> Diarizer:
        if self._diarizer is None:
            from diarize.pipeline import Diarizer

            if self.diarization_model_name == "embedded":
                self._diarizer = Diarizer.embedded(
                    self.registry.resolve("pyannote-segmentation-3.0"),
                    self.registry.resolve("campplus-sv-zh-en"),
                    device=self.device,
                )
            else:
                self._diarizer = Diarizer.from_pretrained(
                    self.diarization_model_name, token=self.settings.hf_token, device=self.device
                )
        return self._diarizer

    @property
    def vad(self) -> VoiceActivityDetector:
        if self._vad is None:
            from asr.vad import VoiceActivityDetector

            self._vad = VoiceActivityDetector(
                self.settings.cache_dir / "vad" / "silero.safetensors"
            )
        return self._vad

    def load(self, diarization: bool = False, vad: bool = False) -> TranscriptionService:
        """Loads the models now instead of at the first request (a server's start-up)."""
        _ = self.model, self.assistant
        if diarization:
            _ = self.diarizer
        if vad:
            _ = self.vad
        return self

    # -- requests -----------------------------------------------------------------------

    def run(
        self,
        audio: AudioInput,
        options: ServiceOptions = ServiceOptions(),
        progress: ProgressHook = no_progress,
        on_window: WindowHook | None = None,
    ) -> Transcript:
        """One request: audio (path, file bytes or samples) -> Transcript, with speakers when
        options.diarize. Bad audio raises asr.audio.AudioLoadError, bad options ValueError.
        on_window: each window's segments as soon as they are decided (`asr.transcribe`),
        before speakers are assigned."""
        from asr.audio import load_audio
        from asr.transcribe import transcribe

        # 1. Check everything that can be checked before any work.
        options.validate()
        transcribe_options = options.transcribe_options()
        samples = audio if isinstance(audio, np.ndarray) else load_audio(audio)
        with self._lock:
            transcribe_options.validate(self.model)
            # Speakers are assigned word by word, so that a segment is split where its speaker
            # changes: words are timed for them even when the output does not show word times.
            hidden_words = (
                options.diarize and not options.word_timestamps and bool(self.model.alignment_heads)
            )
            if hidden_words:
                transcribe_options = dataclasses.replace(transcribe_options, word_timestamps=True)
                on_window = _without_words(on_window)
            # 2. Speakers first when asked for: the VAD reads their segmentation pass.
            diarization, diarize_seconds = None, 0.0
            if options.diarize:
                started = time.perf_counter()
                diarization = self.diarizer.diarization(
                    samples, options.speaker_options(), progress=progress
                )
                diarize_seconds = time.perf_counter() - started
            # 3. Which parts to decode: the clip ranges, and where someone speaks.
            spans, vad = self._spans(samples, options, diarization)
            # 4. Transcribe, speculatively when there is a draft and the request wants it.
            assistant = self.assistant if options.use_assistant else None
            transcript = transcribe(
                self.model,
                samples,
                transcribe_options,
                progress=progress,
                assistant=assistant,
                on_window=on_window,
                spans=spans,
            )
            transcript = dataclasses.replace(transcript, stats={**transcript.stats, **vad})
            transcript = dataclasses.replace(
                transcript,
                options={
                    **transcript.options,
                    "model": self.asr_model_name,
                    "assistant": self.assistant_model_name if assistant else None,
                    "precision": self.precision,
                },
            )
            # 5. Speakers merged into the words.
            if diarization is not None:
                transcript = self._with_speakers(
                    transcript, diarization, options.speaker_options(), diarize_seconds
                )
            # 6. Word times the request did not ask for are left out, as they always were.
            if hidden_words:
                transcript = _words_removed(transcript)
        return transcript

    def _spans(
        self, samples: np.ndarray, options: ServiceOptions, diarization: Diarization | None
    ) -> tuple[tuple[tuple[float, float], ...] | None, dict]:
        """The spans to decode (None: all of it), and the VAD's statistics (source, seconds).
        With diarization, the VAD reads its segmentation pass instead of running Silero."""
        from asr.audio import SAMPLE_RATE
        from asr.speech_timeline import intersect
        from asr.vad import speech_regions

        duration = len(samples) / SAMPLE_RATE
        clips = options.clip_spans()  # transcribe() clips them to the recording
        if not options.vad:
            return clips, {}
        started = time.perf_counter()
        shared = diarization.speech if diarization is not None else None
        if shared is not None:
            regions = speech_regions(shared, duration, options.vad_options())
        else:
            regions = self.vad.regions(samples, options.vad_options())
        stats = {
            "vad": "diarization" if shared is not None else "silero",
            "vad_seconds": round(time.perf_counter() - started, 3),
        }
        return (regions if clips is None else intersect(regions, clips)), stats

    def _with_speakers(
        self,
        transcript: Transcript,
        diarization: Diarization,
        speakers: DiarizeOptions,
        seconds: float,
    ) -> Transcript:
        from diarize.merge import assign_speakers

        turns = diarization.turns
        # Words go by the exclusive turns: in overlapped speech, to the speaker most active.
        segments = assign_speakers(transcript.segments, diarization.exclusive)
        found = len({turn.speaker for turn in turns})
        holding = speakers_holding_words(segments)
        warnings = (
            speaker_count_warning(speakers, found),
            wordless_speakers_warning(turns, holding),
        )
        return dataclasses.replace(
            transcript,
            warnings=transcript.warnings + tuple(w for w in warnings if w),
            segments=segments,
            turns=turns,
            options={
                **transcript.options,
                "diarize": dataclasses.asdict(speakers),
                "diarization_model": self.diarization_model_name,
            },
            stats={
                **transcript.stats,
                "speakers": found,
                "speakers_with_words": len(holding),
                "diarize_seconds": round(seconds, 3),
            },
        )


def _without_words(on_window: WindowHook | None) -> WindowHook | None:
    """on_window fed segments without the word times that were computed for speakers only."""
    if on_window is None:
        return None

    def report(window: DecidedWindow) -> None:
        segments = tuple(dataclasses.replace(s, words=()) for s in window.segments)
        on_window(dataclasses.replace(window, segments=segments))

    return report


def _words_removed(transcript: Transcript) -> Transcript:
    """The transcript as a request without word timestamps gets it: segments (already split
    and labelled by speaker) without their words, and the options as asked."""
    return dataclasses.replace(
        transcript,
        segments=tuple(dataclasses.replace(s, words=()) for s in transcript.segments),
        options={**transcript.options, "word_timestamps": False},
    )


def speakers_holding_words(segments: tuple[Segment, ...]) -> set[str]:
    """The speakers that some word (or, without word times, some segment) was assigned to."""
    return {
        speaker
        for segment in segments
        for speaker in ([w.speaker for w in segment.words] or [segment.speaker])
        if speaker
    }


def wordless_speakers_warning(turns: tuple[SpeakerTurn, ...], holding: set[str]) -> str | None:
    """Names the speakers the diarizer found who hold no word of the transcript (a short
    back-channel, or speech only where someone else is assigned the words), with their time."""
    seconds: dict[str, float] = {}
    for turn in turns:
        seconds[turn.speaker] = seconds.get(turn.speaker, 0.0) + turn.end - turn.start
    missing = sorted(speaker for speaker in seconds if speaker not in holding)
    if not missing:
        return None
    described = ", ".join(f"{name} ({seconds[name]:.1f} s of speech)" for name in missing)
    return (
        f"{len(seconds)} speakers found in the audio, {len(holding)} hold words of the "
        f"transcript; no words for {described} (their turns are in the rttm output)"
    )


def speaker_count_warning(options: DiarizeOptions, found: int) -> str | None:
    """Why the speakers found differ from the count asked, or None when they do not.

    pyannote clusters into the count asked, but a speaker whose cluster is never the most
    active one in any frame has no turn left, and a short recording has too few speech
    windows to form many clusters, so an exact or minimum count is a wish, not a promise."""
    if options.num_speakers is not None and found != options.num_speakers:
        asked = f"exactly {options.num_speakers}"
    elif options.min_speakers is not None and found < options.min_speakers:
        asked = f"at least {options.min_speakers}"
    elif options.max_speakers is not None and found > options.max_speakers:
        asked = f"at most {options.max_speakers}"
    else:
        return None
    return f"{asked} speakers were asked for; {found} found in the audio"

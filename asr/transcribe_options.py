"""Options of a long-form transcription (`asr.transcribe`): what to decode and how, checked
against the model before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from asr.types import MAX_BATCH_SIZE
from asr.whisper import WhisperModel
from decoding import BeamOptions

Task = Literal["transcribe", "translate"]
Windows = Literal["seek", "silence"]


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None  # None: detected from the first window
    # Each window's language detected from the window itself (faster-whisper's multilingual):
    # a recording that changes language changes with it, at window (30 s) or passage
    # boundaries. Off, the first window's language holds for the whole recording.
    multilingual: bool = False
    task: Task = "transcribe"
    timestamps: bool = True
    # Per-word times from the alignment heads; with timestamps=False too (as OpenAI): each
    # window is then one segment, timed by its words.
    word_timestamps: bool = False
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None  # "silence" windows: the prompt of every chunk
    # Words in every window's prompt, before the previous text (faster-whisper's hotwords).
    hotwords: str | None = None
    # A segment of at least this many words, almost all of them in runs of this many words
    # already said in the file, is a repeat: its window is decoded again without previous
    # text, and a repeat still left is dropped (`asr.guards`). None: off.
    repetition_ngram: int | None = 6
    # With word_timestamps: an anomalous segment between pauses longer than this (s) is
    # dropped (OpenAI's hallucination_silence_threshold). None: off.
    hallucination_silence_threshold: float | None = None
    # Temperature fallback: a window whose greedy text repeats itself (compression ratio) or
    # is improbable (average log-probability) is decoded again by sampling, hotter each time.
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    # Temperature 0 as beam search of this many hypotheses (`decoding.beam`, OpenAI's rule;
    # faster-whisper's default is 5), without the draft. 1: greedy decoding, which the draft
    # speeds up. patience: ended hypotheses collected, as a multiple of beam_size.
    beam_size: int = 1
    patience: float = 1.0
    # Samples drawn for a window at each temperature above 0 (the fallback's), of which the
    # most probable per token is kept (OpenAI's best_of; faster-whisper's default is 5).
    best_of: int = 1
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    max_new_tokens: int = 224  # OpenAI's sample_len: half the text context
    seed: int = 0  # makes the sampled fallbacks repeatable
    windows: Windows = "seek"
    batch_size: int = 1  # windows decoded at once ("silence" windows only)
    # "seek" windows with `spans`: speech that resumes after at least this many seconds were
    # cut out starts a passage of its own, decoded side by side with the others and prompted
    # with its own text only (`asr.passages`). None: all spans are one passage.
    passage_pause: float | None = 5.0
    # Short passages packed, whole, into one window while they fit: fewer windows to encode,
    # but Whisper reads a packed window as one stretch of speech, so it detects the language
    # of a mix, may write an utterance said again after the pause once, and times segments
    # across the pause (docs/vad.md). False: each passage has windows of its own, as OpenAI
    # decodes clip ranges one by one.
    pack_passages: bool = False

    def checked(self) -> TranscribeOptions:
        """Checks what needs no model (the guards' settings); returns self."""
        if self.repetition_ngram is not None and not 2 <= self.repetition_ngram <= 50:
            raise ValueError(
                f"repetition_ngram must be in 2..50, or 0 to turn the guard off (None in "
                f"Python), not {self.repetition_ngram}"
            )
        threshold = self.hallucination_silence_threshold
        if threshold is not None:
            if not 0 < threshold < float("inf"):
                raise ValueError(
                    f"hallucination_silence_threshold must be a positive number of seconds, "
                    f"not {threshold}"
                )
            if not self.word_timestamps:
                raise ValueError("hallucination_silence_threshold needs word_timestamps")
        pause = self.passage_pause
        if pause is not None and not 0 < pause < float("inf"):
            raise ValueError(f"passage_pause must be a positive number of seconds, not {pause}")
        self._check_fallback()
        BeamOptions(self.beam_size, self.patience)  # refuses a bad size or patience
        if not isinstance(self.best_of, int) or not 1 <= self.best_of <= 16:
            raise ValueError(f"best_of must be an integer in 1..16, not {self.best_of!r}")
        if self.multilingual and self.language is not None:
            raise ValueError(
                f"multilingual detects every window's language: it cannot be combined with "
                f"language {self.language!r}"
            )
        return self

    @property
    def beam(self) -> BeamOptions | None:
        """The beam search temperature 0 runs, None for greedy decoding."""
        return BeamOptions(self.beam_size, self.patience) if self.beam_size > 1 else None

    def _check_fallback(self) -> None:
        """The temperature schedule and the quality checks that trigger its fallback."""
        inf = float("inf")
        if not self.temperatures or not all(0 <= t < inf for t in self.temperatures):
            raise ValueError(f"temperatures must be non-negative, not {self.temperatures}")
        ratio = self.compression_ratio_threshold
        if ratio is not None and not 0 < ratio < inf:
            raise ValueError(
                f"compression_ratio_threshold must be a positive number (or off), not {ratio}"
            )
        logprob = self.logprob_threshold
        if logprob is not None and not -inf < logprob <= 0:
            raise ValueError(
                f"logprob_threshold must be a log-probability, at most 0 (or off), not {logprob}"
            )
        no_speech = self.no_speech_threshold
        if no_speech is not None and not 0 <= no_speech <= 1:
            raise ValueError(
                f"no_speech_threshold must be a probability in 0..1 (or off), not {no_speech}"
            )

    def validate(self, model: WhisperModel) -> None:
        self.checked()
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', not {self.task!r}")
        special = model.special
        if special.multilingual and self.language not in (None, *special.language_ids):
            known = ", ".join(sorted(special.language_ids))
            named = Path(model.name).name
            raise ValueError(
                f"language {self.language!r} is not among the "
                f"{len(special.language_ids)} languages of model {named}: {known}"
            )
        if not special.multilingual:
            named = Path(model.name).name  # the model's directory, not the cache's path to it
            if self.language not in (None, "en"):
                raise ValueError(f"language {self.language!r}: model {named} is English-only")
            if self.task == "translate":
                raise ValueError(f"task 'translate': model {named} is English-only")
            if self.multilingual:
                raise ValueError(f"multilingual: model {named} is English-only")
        if not 1 <= self.max_new_tokens <= 224:
            raise ValueError(f"max_new_tokens must be in 1..224, not {self.max_new_tokens}")
        if self.word_timestamps and not model.alignment_heads:
            raise ValueError(
                f"word_timestamps: model {model.name} has no alignment_heads in its "
                "generation_config"
            )
        if self.windows not in ("seek", "silence"):
            raise ValueError(f"windows must be 'seek' or 'silence', not {self.windows!r}")
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be in 1..{MAX_BATCH_SIZE}, not {self.batch_size}")
        if self.batch_size > 1 and self.windows != "silence":
            raise ValueError(
                "batch_size > 1 needs windows='silence': seek windows depend on each other"
            )
        if self.windows == "silence" and self.condition_on_previous_text:
            raise ValueError(
                "windows='silence' needs condition_on_previous_text=False: its windows are "
                "decoded independently"
            )

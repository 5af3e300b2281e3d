"""Frozen dataclasses that flow between stages. Times are absolute float seconds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

ProgressHook = Callable[[str, int, int], None]
"""progress(stage, completed, total): the one hook that the CLI, the UI and the worker adapt."""


def no_progress(stage: str, completed: int, total: int) -> None:
    """The default hook: report nothing."""


# The "transcribe" stage's steps a second of audio: it counts log-mel frames
# (`asr.whisper.FRAMES_PER_SECOND`, which imports torch; a reader showing progress need not).
TRANSCRIBE_STEPS_PER_SECOND = 100


@dataclass(frozen=True)
class Word:
    start: float
    end: float
    text: str
    probability: float
    speaker: str | None = None


@dataclass(frozen=True)
class Segment:
    """language: the code of the language its window was decoded in (with `multilingual`,
    each window's own; otherwise the recording's). As openai-whisper's segments: seek, its
    window's first mel frame (100 per second, on the recording's timeline); tokens, its own
    tokens, timestamps included (none where its text is not theirs: a segment diarization
    split between speakers, or cut where Whisper went on past the audio); temperature, the one
    its window's text was decoded at (above 0 after a fallback); compression_ratio, of its
    window's text."""

    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    speaker: str | None = None
    language: str | None = None
    seek: int = 0
    tokens: tuple[int, ...] = ()
    temperature: float = 0.0
    compression_ratio: float = 0.0


@dataclass(frozen=True)
class DecidedWindow:
    """A window's kept segments, reported once its text is decided (before diarization).

    seek: its first mel frame (100 per second, OpenAI's `seek`); temperature: the one its text
    was decoded at (above 0 after a fallback); compression_ratio: of its whole text;
    tokens[i]: segments[i]'s tokens, timestamps included.
    """

    seek: int
    temperature: float
    compression_ratio: float
    segments: tuple[Segment, ...]
    tokens: tuple[tuple[int, ...], ...]


WindowHook = Callable[[DecidedWindow], None]
"""on_window(window): called in the decoding thread as each window is decided."""


# The most speakers a request may ask for: pyannote counts speakers per frame in 8-bit
# integers (256 crashes it), and no recording a person would diarize has more.
MAX_SPEAKERS = 100
# Windows decoded in one pass at most (`batch_size`). They hold their encoder output and
# cross-attention keys and values together (about 40 MB each for whisper-base, 0.5 GB for
# large-v3): a request's batch_size of 1000 held 2.9 GB for a 10-minute recording.
MAX_BATCH_SIZE = 64


@dataclass(frozen=True)
class SpeakerTurn:
    start: float
    end: float
    speaker: str


@dataclass(frozen=True)
class Transcript:
    segments: tuple[Segment, ...]
    language: str
    duration: float
    options: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    # What the user asked for and did not get in full (e.g. fewer speakers than requested).
    warnings: tuple[str, ...] = ()
    # The diarizer's speaker turns, overlapping speech included (RTTM writes these); empty
    # without diarization. Segments and words carry the speaker each was assigned.
    turns: tuple[SpeakerTurn, ...] = ()

    @property
    def text(self) -> str:
        """The segments' texts joined, without the space the first one leads with."""
        return "".join(segment.text for segment in self.segments).strip()

    def to_dict(self) -> dict[str, Any]:
        """JSON values; a segment leads with its "id" (its index) and a word's text is its
        "word", as openai-whisper, faster-whisper and whisperX write them, so scripts written
        for their json read it."""
        result = asdict(self)
        result["segments"] = [{"id": index, **s} for index, s in enumerate(result["segments"])]
        for segment in result["segments"]:
            segment["words"] = [{"word": word.pop("text"), **word} for word in segment["words"]]
        # Its segments' texts joined as they are, leading space included, as openai-whisper
        # writes it (`text`, for people, is stripped).
        result["text"] = "".join(segment.text for segment in self.segments)
        return result

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Transcript:
        """The Transcript `to_dict` wrote (its "text" is derived, and ignored). Raises
        KeyError or TypeError where `data` is not one."""
        segments = tuple(
            Segment(
                **{k: v for k, v in s.items() if k not in ("id", "words", "tokens")},
                words=tuple(map(_word, s["words"])),
                tokens=tuple(s.get("tokens", ())),
            )
            for s in data["segments"]
        )
        return cls(
            segments=segments,
            language=data["language"],
            duration=data["duration"],
            # an option's sequence is a tuple (the options are frozen); JSON made it a list
            options={k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()},
            stats=dict(data["stats"]),
            warnings=tuple(data["warnings"]),
            turns=tuple(SpeakerTurn(**t) for t in data["turns"]),
        )


def _word(data: dict[str, Any]) -> Word:
    """A Word from `Transcript.to_dict`'s json ("word"), or from outputs written before it
    named the text so ("text")."""
    fields = dict(data)
    if "word" in fields:
        fields["text"] = fields.pop("word")
    return Word(**fields)

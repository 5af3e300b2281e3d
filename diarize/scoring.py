"""Diarization error rate over SpeakerTurns, with pyannote.metrics (a pyannote.audio dependency).

DER = (false alarm + missed detection + speaker confusion) / total reference speech, scored over
the whole file (the UEM is [0, duration]); overlapped speech is scored, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pyannote.core import Annotation, Timeline
from pyannote.core import Segment as TimeSpan

from asr.types import SpeakerTurn


@dataclass(frozen=True)
class DERScore:
    """Seconds of each error kind and of reference speech; add scores to pool files."""

    false_alarm: float
    missed: float
    confusion: float
    total: float

    @property
    def rate(self) -> float:
        return (self.false_alarm + self.missed + self.confusion) / max(self.total, 1e-9)

    def __add__(self, other: DERScore) -> DERScore:
        return DERScore(
            self.false_alarm + other.false_alarm,
            self.missed + other.missed,
            self.confusion + other.confusion,
            self.total + other.total,
        )


def read_rttm(path: str | Path) -> tuple[SpeakerTurn, ...]:
    """SPEAKER lines of an RTTM file -> turns sorted by start (all files ids together)."""
    turns = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if fields and fields[0] == "SPEAKER":
            start, duration = float(fields[3]), float(fields[4])
            turns.append(SpeakerTurn(start, start + duration, fields[7]))
    return tuple(sorted(turns, key=lambda t: (t.start, t.end, t.speaker)))


def to_annotation(turns: Iterable[SpeakerTurn], uri: str = "audio") -> Annotation:
    annotation = Annotation(uri=uri)
    for index, turn in enumerate(turns):
        annotation[TimeSpan(turn.start, turn.end), index] = turn.speaker
    return annotation


def score(
    reference: Iterable[SpeakerTurn],
    hypothesis: Iterable[SpeakerTurn],
    duration: float,
    collar: float = 0.0,
    skip_overlap: bool = False,
) -> DERScore:
    """DER components of one file; `collar` (seconds) is the total width forgiven around each
    reference boundary (pyannote's convention: collar/2 on each side); `skip_overlap` leaves
    the reference's overlapped speech out of the score."""
    from pyannote.metrics.diarization import DiarizationErrorRate

    metric = DiarizationErrorRate(collar=collar, skip_overlap=skip_overlap)
    components = metric(
        to_annotation(reference),
        to_annotation(hypothesis),
        uem=Timeline([TimeSpan(0.0, duration)]),
        detailed=True,
    )
    return DERScore(
        components["false alarm"],
        components["missed detection"],
        components["confusion"],
        components["total"],
    )

"""What a caller says about the speakers, apart from the pipeline: checking a request's
options must not import pyannote.audio (seconds of imports: lightning, torchmetrics), which a
run that finds no speakers again never needs."""

from __future__ import annotations

from dataclasses import dataclass

from asr.types import MAX_SPEAKERS


@dataclass(frozen=True)
class DiarizeOptions:
    """What the caller knows about the speakers; None leaves it to the clustering threshold."""

    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None

    def validate(self) -> DiarizeOptions:
        for name in ("num_speakers", "min_speakers", "max_speakers"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_SPEAKERS:
                raise ValueError(f"{name} must be in 1..{MAX_SPEAKERS}, got {value}")
        if self.num_speakers is not None and (
            self.min_speakers is not None or self.max_speakers is not None
        ):
            raise ValueError("num_speakers excludes min_speakers and max_speakers")
        if (
            self.min_speakers is not None
            and self.max_speakers is not None
            and self.min_speakers > self.max_speakers
        ):
            raise ValueError(
                f"min_speakers ({self.min_speakers}) exceeds max_speakers ({self.max_speakers})"
            )
        return self

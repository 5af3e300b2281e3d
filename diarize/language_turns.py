"""Where a multilingual recording's speaker changes start passages of their own.

With `--multilingual`, Whisper detects a language per window (30 s, or a passage after a long
pause). In a conversation whose speakers use different languages a window holds several
speakers, and the first one's language is then forced on the others (a French turn inside a
German window comes out as German). With diarization the speaker turns are known before
decoding, so a long enough turn of a new speaker starts a passage, whose first window detects
the language from that speaker's own speech.

Short turns ("yes", a laugh) start none: Whisper's language detection on a second of speech is
a guess, and a passage padded to a 30 s window costs as much as a long one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from asr.types import SpeakerTurn

# A speaker's stretch (their consecutive turns, other speakers' shorter stretches between them
# ignored) must last this long to start a passage of its own.
MIN_STRETCH_SECONDS = 2.0


def speaker_change_starts(
    turns: Sequence[SpeakerTurn], min_seconds: float = MIN_STRETCH_SECONDS
) -> tuple[float, ...]:
    """Seconds where a new speaker's stretch of at least `min_seconds` starts (after the
    first), in order. turns: one speaker at a time (`Diarization.exclusive`). A change falls
    midway through the pause before the new speaker, if there is one, so that neither
    speaker's edge words are cut."""
    stretches: list[_Stretch] = []
    for turn in sorted(turns, key=lambda turn: turn.start):
        if stretches and stretches[-1].speaker == turn.speaker:
            stretches[-1].end = max(stretches[-1].end, turn.end)
        else:
            after = stretches[-1].end if stretches else turn.start
            stretches.append(_Stretch(turn.start, turn.end, turn.speaker, after))
    long = [stretch for stretch in stretches if stretch.end - stretch.start >= min_seconds]
    starts = []
    for previous, stretch in itertools.pairwise(long):
        if stretch.speaker != previous.speaker:
            pause_from = max(stretch.after, previous.end)
            middle = (pause_from + stretch.start) / 2 if pause_from < stretch.start else None
            starts.append(round(stretch.start if middle is None else middle, 3))
    return tuple(starts)


@dataclass
class _Stretch:
    """One speaker's consecutive turns: from `start` to `end`, after the turn that ended at
    `after` (another speaker's)."""

    start: float
    end: float
    speaker: str
    after: float

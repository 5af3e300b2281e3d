"""Passages: the parts of a recording that can be decoded apart from each other.

Whisper's long-form loop prompts each 30 s window with the text before it, so windows decode
one after another. Across a long pause that the VAD (or a clip range) cut out, the previous
text helps little and is what Whisper copies into the next window when it invents text; the
speech after such a pause starts a new passage. Passages decode side by side (a batch holds
one window of each), and each is decoded OpenAI's way on its own, prompted with its own text
only. Short passages may be packed together, whole, while they fit one window
(`TranscribeOptions.pack_passages`, off by default): a window of several short utterances
then costs what a window of one does, but Whisper reads it as one stretch of speech.
"""

from __future__ import annotations

from collections.abc import Sequence

from asr.whisper import N_FRAMES

FrameRange = tuple[int, int]


def plan_passages(
    resumptions: Sequence[int], total: int, window: int = N_FRAMES
) -> list[FrameRange]:
    """[start, end) frame ranges that cover frames [0, total) in order, cut only at
    `resumptions` (frames where speech resumes after a long pause, in order).

    The stretches between resumptions are packed greedily: a stretch joins the passage before
    it while the passage stays within `window` frames; a longer stretch is a passage of its own.
    """
    cuts = sorted({frame for frame in resumptions if 0 < frame < total})
    stretches = list(zip([0, *cuts], [*cuts, total], strict=True)) if total > 0 else []
    passages: list[FrameRange] = []
    for start, end in stretches:
        if passages and end - passages[-1][0] <= window:
            passages[-1] = (passages[-1][0], end)
        else:
            passages.append((start, end))
    return passages

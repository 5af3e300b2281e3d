"""A decoded window's tokens -> Segments, split at timestamp pairs (OpenAI's transcribe)."""

from __future__ import annotations

from asr.types import Segment
from asr.whisper import FRAMES_PER_SECOND, INPUT_STRIDE, TIME_PRECISION, WhisperModel
from asr.window_decoder import WindowResult


def split_segments(
    model: WhisperModel,
    result: WindowResult,
    time_offset: float,
    window_frames: int,
    duration: float,
    keep_unfinished: bool = False,
) -> tuple[list[Segment], int]:
    """Splits a window's tokens at timestamp pairs; returns segments and frames consumed.

    Text after the last complete segment is left for the next window, which starts there
    (frames consumed < window_frames), unless `keep_unfinished`: independent windows have no
    next window to finish it, so it becomes a segment that ends with the window.
    """
    begin = model.special.timestamp_begin
    tokens = list(result.tokens)
    is_timestamp = [t >= begin for t in tokens]
    # A pair of consecutive timestamps closes one segment and opens the next.
    boundaries = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]
    single_timestamp_ending = (
        len(tokens) >= 1 and is_timestamp[-1] and not (len(tokens) >= 2 and is_timestamp[-2])
    )
    window_end = time_offset + window_frames / FRAMES_PER_SECOND

    def segment(sliced: list[int], start: float, end: float) -> Segment:
        # A window near the end holds padding: no segment may run past the recording.
        return Segment(
            start=round(min(start, duration), 3),
            end=round(min(end, duration), 3),
            text=model.text_of(sliced),
            avg_logprob=result.avg_logprob,
            no_speech_prob=result.no_speech_prob,
        )

    if boundaries:
        slices = boundaries if not single_timestamp_ending else [*boundaries, len(tokens)]
        segments, last = [], 0
        for current in slices:
            sliced = tokens[last:current]
            start = time_offset + (sliced[0] - begin) * TIME_PRECISION
            end = time_offset + (sliced[-1] - begin) * TIME_PRECISION
            segments.append(segment(sliced, start, end))
            last = current
        if single_timestamp_ending:
            return segments, window_frames  # nothing left unfinished in this window
        if keep_unfinished:
            rest = tokens[last:]
            start = time_offset + (rest[0] - begin) * TIME_PRECISION
            return [*segments, segment(rest, start, window_end)], window_frames
        # Seek to the last complete segment's end; the rest is decoded again in context.
        return segments, (tokens[last - 1] - begin) * INPUT_STRIDE

    length = window_frames / FRAMES_PER_SECOND
    timestamps = [t for t in tokens if t >= begin]
    if timestamps and timestamps[-1] != begin:
        length = (timestamps[-1] - begin) * TIME_PRECISION
    text_tokens = [t for t in tokens if t < begin]
    segments = [segment(text_tokens, time_offset, time_offset + length)] if text_tokens else []
    return segments, window_frames

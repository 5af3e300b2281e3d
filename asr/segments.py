"""A decoded window's tokens -> Segments, split at timestamp pairs (OpenAI's transcribe)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from asr.types import Segment
from asr.whisper import FRAMES_PER_SECOND, INPUT_STRIDE, TIME_PRECISION, WhisperModel
from asr.window_decoder import WindowResult


@dataclass(frozen=True)
class WindowSplit:
    """A decoded window's segments, each with the tokens it came from.

    tokens[i]: segment i's tokens, timestamps included. consumed: mel frames the window used up
    (where the next sequential window starts, relative to this one). single_timestamp_ending:
    the tokens end in one timestamp, so nothing is left unfinished. time_offset: the window's
    start (s); frames: its content frames (mel frames of audio, not padding).
    timestamp_ends[i]: segment i's end as its timestamps give it (s), which word timing leaves
    as it is (the segment's own times then follow its words, which often end earlier).
    language_after: where the window's text was cut at a segment heard in another language
    than the window was decoded in (`asr.spoken_languages`), that language: the audio from
    `consumed` on is decoded in it. With no segment with text left, the window's first
    segment was that one, and the whole window is decoded again in it (`decoded_again`).
    resumed_early: `consumed` is where the text's last word ends, before its last timestamp,
    because words the text did not say lie between (`Session._resumed_before_unsaid_words`):
    the next window may hear that last word again (`Resumption.without_echo`).
    """

    segments: tuple[Segment, ...]
    tokens: tuple[tuple[int, ...], ...]
    consumed: int
    single_timestamp_ending: bool
    time_offset: float
    frames: int
    timestamp_ends: tuple[float, ...]
    language_after: str | None = None
    resumed_early: bool = False

    def before_segment(self, index: int, language: str) -> WindowSplit:
        """This window's text up to segment `index` (exclusive), and its audio up to the end
        of the last segment with text before it (`consumed` and `frames`); the audio from there
        on is decoded in `language` (`language_after`)."""
        ends = [
            end
            for segment, end in zip(self.segments[:index], self.timestamp_ends, strict=False)
            if segment.text.strip()
        ]
        cut = round((max(ends) - self.time_offset) * FRAMES_PER_SECOND) if ends else 0
        # Its words are timed in the audio before the cut: aligned over the whole window, the
        # last ones were stretched over the other language, 23 s on.
        frames = min(cut, self.frames) if ends else self.frames
        return replace(
            self,
            segments=self.segments[:index],
            tokens=self.tokens[:index],
            timestamp_ends=self.timestamp_ends[:index],
            consumed=cut,
            single_timestamp_ending=True,  # nothing unfinished: the rest is decoded again
            frames=frames,
            language_after=language,
        )

    @property
    def decoded_again(self) -> bool:
        """Whether the whole window is to be decoded again in `language_after`."""
        return self.language_after is not None and not any(
            segment.text.strip() for segment in self.segments
        )


def has_content(segment: Segment) -> bool:
    """Whether a segment has text and a duration (OpenAI clears the others)."""
    return bool(segment.text.strip()) and segment.end > segment.start


def split_segments(
    model: WhisperModel,
    result: WindowResult,
    time_offset: float,
    window_frames: int,
    duration: float,
    keep_unfinished: bool = False,
    language: str | None = None,
) -> WindowSplit:
    """Splits a window's tokens (decoded in `language`) at timestamp pairs into segments.

    Text after the last complete segment is left for the next window, which starts there
    (frames consumed < window_frames), unless `keep_unfinished`: independent windows have no
    next window to finish it, so it becomes a segment that ends with the window. An
    independent window's segments also end with its audio: Whisper can time text into the
    padding after it (an echo of the next chunk's speech), and the chunk after it, decoded
    apart, holds that audio; a segment timed to start there is dropped, not placed out of
    order as a cue of no length.
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
    # A window near the end holds padding: no segment may run past the recording.
    audio_end = min(duration, window_end) if keep_unfinished else duration

    ratio = round(result.compression_ratio, 6)  # the window's text's: once, not per segment

    def segment(sliced: list[int], start: float, end: float) -> tuple[Segment, tuple[int, ...]]:
        found = Segment(
            start=round(min(start, audio_end), 3),
            end=round(min(end, audio_end), 3),
            text=model.text_of(sliced),
            avg_logprob=result.avg_logprob,
            no_speech_prob=result.no_speech_prob,
            language=language,
            seek=round(time_offset * FRAMES_PER_SECOND),
            tokens=tuple(sliced),
            temperature=result.temperature,
            compression_ratio=ratio,
        )
        return found, tuple(sliced)

    def done(pieces: list[tuple[Segment, tuple[int, ...]]], consumed: int) -> WindowSplit:
        if keep_unfinished:
            pieces = [piece for piece in pieces if piece[0].start < round(audio_end, 3)]
        return WindowSplit(
            segments=tuple(found for found, _ in pieces),
            tokens=tuple(sliced for _, sliced in pieces),
            consumed=consumed,
            single_timestamp_ending=single_timestamp_ending,
            time_offset=time_offset,
            frames=window_frames,
            timestamp_ends=tuple(found.end for found, _ in pieces),
        )

    if boundaries:
        slices = boundaries if not single_timestamp_ending else [*boundaries, len(tokens)]
        pieces, last = [], 0
        for current in slices:
            sliced = tokens[last:current]
            start = time_offset + (sliced[0] - begin) * TIME_PRECISION
            end = time_offset + (sliced[-1] - begin) * TIME_PRECISION
            pieces.append(segment(sliced, start, end))
            last = current
        if single_timestamp_ending:
            return done(pieces, window_frames)  # nothing left unfinished in this window
        if keep_unfinished:
            rest = tokens[last:]
            start = time_offset + (rest[0] - begin) * TIME_PRECISION
            return done([*pieces, segment(rest, start, window_end)], window_frames)
        # Seek to the last complete segment's end; the rest is decoded again in context.
        return done(pieces, (tokens[last - 1] - begin) * INPUT_STRIDE)

    length = window_frames / FRAMES_PER_SECOND
    timestamps = [t for t in tokens if t >= begin]
    if timestamps and timestamps[-1] != begin:
        length = (timestamps[-1] - begin) * TIME_PRECISION
    has_text = any(t < begin for t in tokens)
    pieces = [segment(tokens, time_offset, time_offset + length)] if has_text else []
    return done(pieces, window_frames)


def without_overlaps(segments: list[Segment]) -> list[Segment]:
    """`segments` (in time order) with no segment starting before the one before it ends.

    Windows decoded apart (cut at silences, `--batch-size`) are timed apart, and word timing
    can end a window's last word a few frames past its cut, so the next window's first
    segment began 20 ms before it ended: overlapping cues, which subtitle players and
    validators refuse. The later segment then starts where the earlier one ends, its words
    with it; where that would leave it nothing, the earlier one ends where the later starts.
    """
    kept: list[Segment] = []
    for segment in segments:
        if kept and segment.start < kept[-1].end:
            if kept[-1].end < segment.end:
                segment = _from(segment, kept[-1].end)
            else:
                kept[-1] = _until(kept[-1], max(segment.start, kept[-1].start))
        kept.append(segment)
    return kept


def _from(segment: Segment, start: float) -> Segment:
    words = tuple(
        replace(word, start=max(word.start, start), end=max(word.end, start))
        for word in segment.words
    )
    return replace(segment, start=start, words=words)


def _until(segment: Segment, end: float) -> Segment:
    words = tuple(
        replace(word, start=min(word.start, end), end=min(word.end, end)) for word in segment.words
    )
    return replace(segment, end=end, words=words)

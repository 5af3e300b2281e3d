"""Decode only some spans of a recording, and report times on the recording's own timeline.

The spans (speech regions from the VAD, clip ranges the user asked for, or both intersected)
are laid end to end into one shorter recording, which is transcribed as any other; every
segment and word time is then mapped back. A word belongs to the span its midpoint falls in
(or the nearer one, if it falls in a pause left between spans) and is clipped to that span, so
no word is placed inside audio that was cut out; a segment starts at its first word (or where
its start falls) and ends at its last word.

Where audio was cut out, up to `pause` seconds of digital silence stand in for it. Laid
directly end to end, short utterances after long pauses (one word every 6 s) run together:
whisper-base then gave every word a 1 s segment regardless of where it was, and decoded the
last two words twice; with 0.5 s or more of silence between them it times each near its own
span and decodes each once.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

import numpy as np

from asr.audio import SAMPLE_RATE
from asr.types import TRANSCRIBE_STEPS_PER_SECOND, Segment, Word

Span = tuple[float, float]
# How far past a seam of the compacted audio a segment's end may fall and still belong to the
# span before it: the VAD pads each region by 0.4 s, and Whisper's end timestamps overshoot.
END_SEAM_GRACE = 0.5
# The silence laid between spans in place of a longer cut-out pause (see the module's doc).
SEAM_PAUSE = 1.0
# A passage starts on the first mel frame (10 ms) at or after its span's start.
PASSAGE_START_SLACK = 0.011


@dataclass(frozen=True)
class SpeechTimeline:
    """spans: sorted, disjoint (start, end) seconds of the original recording to decode;
    pause: at most this many seconds of silence stand between two spans in the compacted
    audio (the cut-out audio's length where it is shorter); passage_spans: the indices of the
    spans that start a passage, decoded apart from the span before (`with_passage_starts`):
    a time in the silence before one belongs to the span before it, whose windows decoded it."""

    spans: tuple[Span, ...]
    pause: float = 0.0
    passage_spans: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        previous_end = 0.0
        for start, end in self.spans:
            if not previous_end <= start < end:
                raise ValueError(f"spans must be sorted, disjoint and non-empty: {self.spans}")
            previous_end = end
        if not 0.0 <= self.pause < float("inf"):
            raise ValueError(f"pause must be a finite number of seconds >= 0: {self.pause}")

    @property
    def seconds(self) -> float:
        """Of the spans (the pauses between them not counted)."""
        return sum(end - start for start, end in self.spans)

    def _silences(self) -> list[float]:
        """The silence before each span in the compacted audio (none before the first)."""
        between = [
            min(self.pause, start - previous_end)
            for (_, previous_end), (start, _) in zip(self.spans[:-1], self.spans[1:], strict=True)
        ]
        return [0.0, *between][: len(self.spans)]

    def _sample_ranges(self, length: int) -> list[tuple[int, int, int]]:
        """(samples of silence before it, first sample, end sample) of each span in
        [0, length)."""
        ranges = []
        for (start, end), silence in zip(self.spans, self._silences(), strict=True):
            first, last = round(start * SAMPLE_RATE), min(round(end * SAMPLE_RATE), length)
            if last > first:
                ranges.append((round(silence * SAMPLE_RATE), first, last))
        return ranges

    def compact(self, samples: np.ndarray) -> np.ndarray:
        """The spans' samples, end to end, with the silences between them."""
        pieces = []
        for silence, first, last in self._sample_ranges(len(samples)):
            pieces += [np.zeros(silence, samples.dtype), samples[first:last]]
        return np.concatenate(pieces) if pieces else samples[:0]

    def resumptions(self, length: int, min_pause: float) -> list[int]:
        """Sample offsets in `compact(samples)` (len(samples) == length) where speech resumes
        after at least `min_pause` seconds of the recording were cut out."""
        offsets, clock, previous_last = [], 0, None
        for silence, first, last in self._sample_ranges(length):
            clock += silence
            if previous_last is not None and first - previous_last >= min_pause * SAMPLE_RATE:
                offsets.append(clock)
            clock += last - first
            previous_last = last
        return offsets

    def compacted_sample(self, sample: int, length: int) -> int:
        """Where sample `sample` of the recording (len(samples) == length) lies in
        `compact(samples)`: inside a span, its own place; cut out, where the next span
        starts (the end of the compacted audio after the last)."""
        clock = 0
        for silence, first, last in self._sample_ranges(length):
            clock += silence
            if sample < last:
                return clock + max(sample - first, 0)
            clock += last - first
        return clock

    def bounded(self, duration: float) -> SpeechTimeline:
        """The spans clipped to [0, duration]; spans wholly past it are dropped."""
        spans = [(start, min(end, duration)) for start, end in self.spans if start < duration]
        return SpeechTimeline(tuple((s, e) for s, e in spans if e > s), self.pause)

    def _offsets(self) -> list[float]:
        """Where each span starts in the compacted audio."""
        offsets, clock = [], 0.0
        for (start, end), silence in zip(self.spans, self._silences(), strict=True):
            clock += silence
            offsets.append(clock)
            clock += end - start
        return offsets

    def seam_silences(self) -> tuple[Span, ...]:
        """The (start, end) seconds of each silence laid between spans in the compacted audio:
        where a pause was cut out."""
        offsets = self._offsets()
        return tuple(
            (offset - silence, offset)
            for offset, silence in zip(offsets, self._silences(), strict=True)
            if silence > 0
        )

    def with_passage_starts(self, starts: list[float]) -> SpeechTimeline:
        """This timeline, told that passages start at `starts` (seconds of the compacted audio,
        each on the first 10 ms frame at or after its span's start)."""
        offsets = self._offsets()
        passage_spans = frozenset(
            index
            for index in range(1, len(offsets))
            if any(0 <= start - offsets[index] < PASSAGE_START_SLACK for start in starts)
        )
        return replace(self, passage_spans=passage_spans)

    def _span_at(self, compact_time: float, offsets: list[float]) -> int:
        """The span whose start is the last at or before `compact_time`."""
        return max(0, bisect.bisect_right(offsets, compact_time) - 1)

    def _seam(self, index: int, offsets: list[float]) -> float:
        """Where span `index` ends in the compacted audio."""
        start, end = self.spans[index]
        return offsets[index] + end - start

    def _nearest_span(self, compact_time: float, offsets: list[float]) -> int:
        """The span `compact_time` falls in; in the silence between two, the nearer one."""
        index = self._span_at(compact_time, offsets)
        if index in self.passage_spans and compact_time <= offsets[index]:
            return index - 1  # the end of the window before the passage
        after_end = compact_time - self._seam(index, offsets)
        if after_end > 0 and index + 1 < len(offsets) and index + 1 not in self.passage_spans:
            return index + 1 if offsets[index + 1] - compact_time < after_end else index
        return index

    def _starting_span(self, segment: Segment, offsets: list[float]) -> int:
        """The span a segment without words starts in: the next one if it starts in the
        silence before it, or within END_SEAM_GRACE of its seam and ends past it (Whisper's
        start timestamps come early by as much as its end timestamps overshoot, and the span
        before the seam closes with the VAD's padding)."""
        index = self._span_at(segment.start, offsets)
        if index in self.passage_spans and segment.start <= offsets[index]:
            # at a passage's very start: its first segment, or (no length) the window before's end
            return index if segment.end > segment.start else index - 1
        if index + 1 < len(offsets) and index + 1 not in self.passage_spans:
            seam = self._seam(index, offsets)
            if segment.start > seam or (
                segment.start >= seam - END_SEAM_GRACE and segment.end > seam + 1e-6
            ):
                return index + 1
        return index

    def original(self, compact_time: float, span: int | None = None) -> float:
        """A time of the compacted audio on the original timeline, inside `span` (default: the
        span it falls in, or the one before the silence it falls in), clipped to that span."""
        offsets = self._offsets()
        return self._mapped(
            compact_time, self._span_at(compact_time, offsets) if span is None else span, offsets
        )

    def _mapped(self, compact_time: float, span: int, offsets: list[float]) -> float:
        """`original(compact_time, span)` with the offsets computed once by the caller."""
        start, end = self.spans[span]
        return round(min(max(start + compact_time - offsets[span], start), end), 3)

    def restore(self, segments: list[Segment]) -> list[Segment]:
        """Segments timed on the compacted audio -> the same on the original timeline. A word
        is placed by its middle; a segment without words ends in the span its end falls in,
        unless that end lies within END_SEAM_GRACE of the span's start: then it ends where the
        span before ends (Whisper's end timestamps overshoot a seam by a few hundred ms, and
        the span after one opens with the VAD's padding; mapped there, a sentence ending before
        a cut-out pause of 90 s would last across it). Its start is placed the same way, in
        mirror (`_starting_span`)."""
        if not self.spans:
            return list(segments)
        offsets = self._offsets()
        restored = []
        for segment in segments:
            words = self._words(segment.words, offsets)
            if words:
                start, end = words[0].start, words[-1].end
            else:
                start_span = self._starting_span(segment, offsets)
                start = self._mapped(segment.start, start_span, offsets)
                # an end exactly at a seam belongs to the span before it
                end_span = self._span_at(max(segment.end - 1e-6, segment.start), offsets)
                if end_span > start_span and segment.end - offsets[end_span] <= END_SEAM_GRACE:
                    end_span -= 1  # an end just past a seam: the speech before it, not the pause
                end = self._mapped(segment.end, end_span, offsets)
            steps = TRANSCRIBE_STEPS_PER_SECOND  # a window's seek: its first mel frame
            seek = round(self.original(segment.seek / steps) * steps)
            restored.append(
                replace(segment, start=start, end=max(end, start), words=words, seek=seek)
            )
        return restored

    def _words(self, words: tuple[Word, ...], offsets: list[float]) -> tuple[Word, ...]:
        """A segment's words, each placed in the span its middle is nearest; but a word that
        runs past its span's seam, where the word after it is in the next span and none before
        it in its own, goes with the word after: the words that start a sentence after a
        cut-out pause, which word timing began in the silence before the seam (the 4th of one
        sentence said 4 times with 3 s between them: its "He" was timed 3 s early, over the
        end of the 3rd, and "began" stretched across the pause)."""
        spans = [self._nearest_span((w.start + w.end) / 2, offsets) for w in words]
        for index in range(len(words) - 2, -1, -1):
            span = spans[index]
            if (
                spans[index + 1] == span + 1
                and span + 1 not in self.passage_spans
                and words[index].end > self._seam(span, offsets)
                and (index == 0 or spans[index - 1] != span)
            ):
                spans[index] = span + 1
        placed = []
        for word, span in zip(words, spans, strict=True):
            start = self._mapped(word.start, span, offsets)
            end = max(self._mapped(word.end, span, offsets), start)
            placed.append(replace(word, start=start, end=end))
        return tuple(placed)


def intersect(first: tuple[Span, ...], second: tuple[Span, ...]) -> tuple[Span, ...]:
    """The spans covered by both (each sorted and disjoint)."""
    result, i, j = [], 0, 0
    while i < len(first) and j < len(second):
        start = max(first[i][0], second[j][0])
        end = min(first[i][1], second[j][1])
        if end > start:
            result.append((start, end))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return tuple(result)


def uncovered(span: Span, covered: tuple[Span, ...] | list[Span]) -> list[Span]:
    """The parts of `span` outside the sorted, disjoint `covered` spans."""
    parts, start = [], span[0]
    for other_start, other_stop in covered:
        if other_stop <= start or other_start >= span[1]:
            continue
        if other_start > start:
            parts.append((start, other_start))
        start = max(start, other_stop)
    if start < span[1]:
        parts.append((start, span[1]))
    return parts


def merged(spans: list[Span], join_touching: bool) -> tuple[Span, ...]:
    """The spans sorted, those that overlap joined, and those that touch (one ends where the
    next starts) too where `join_touching`."""
    joined: list[list[float]] = []
    for start, end in sorted(spans):
        if joined and (start < joined[-1][1] or (join_touching and start == joined[-1][1])):
            joined[-1][1] = max(joined[-1][1], end)
        else:
            joined.append([start, end])
    return tuple((start, end) for start, end in joined)


def parse_clip_ranges(text: str) -> tuple[Span, ...]:
    """OpenAI's --clip_timestamps: "start,end,start,end,..." in seconds (the last end may be
    left out: to the end of the file); also accepts "10:00-20:00" style ranges separated by
    commas (clock times as [h:]m:s; an open end runs to the end, an open start from 0).
    -> sorted spans, disjoint or touching; an open end is `inf`."""
    text = text.strip()
    if not text:
        raise ValueError("clip ranges are empty")
    if "-" in text:
        bounds = []
        for part in text.split(","):
            start, dash, end = part.strip().partition("-")
            if not dash:
                raise ValueError(
                    f"clip range {part.strip()!r} is not START-END (ranges are either all "
                    "START-END or all START,END pairs: '10-20,30-40' or '10,20,30,40')"
                )
            if (not start.strip() and not end.strip()) or "-" in end:
                raise ValueError(
                    f"clip range {part.strip()!r} is not START-END (one dash a range; times "
                    "are never negative)"
                )
            opened = _seconds(start) if start.strip() else 0.0  # "-5": from the beginning
            bounds += [opened, _seconds(end) if end.strip() else float("inf")]
    else:
        bounds = [_seconds(part) for part in text.split(",")]
        if len(bounds) % 2:
            bounds.append(float("inf"))
    spans = sorted(zip(bounds[::2], bounds[1::2], strict=True))
    for start, end in spans:
        if not 0 <= start < end:
            raise ValueError(f"clip range {start}-{end}: start must be >= 0 and before its end")
    # Overlapping ranges are merged; touching ones ("0-5,5-11") stay two, each decoded on its
    # own as OpenAI decodes each clip.
    return merged(spans, join_touching=False)


def clip_ranges_text(spans: tuple[Span, ...]) -> str:
    """`parse_clip_ranges`' spans in one spelling, "START-END,START-" in seconds (the shortest
    digits that read back as the same numbers; an open end left out), which parses back to
    the same spans: equivalent spellings ("2,4.5,7", "0:02-0:04.5,7-") become one text."""
    return ",".join(
        f"{_decimal(start)}-{'' if math.isinf(end) else _decimal(end)}" for start, end in spans
    )


def _decimal(seconds: float) -> str:
    """75.5 -> "75.5", 2.0 -> "2", 1e-05 -> "0.00001": no exponent, whose "-" reads as a range's."""
    return np.format_float_positional(seconds, trim="-")


def _seconds(value: str) -> float:
    """ "75.5", "1:15.5" or "0:01:15.5" -> 75.5."""
    parts = value.strip().split(":")
    if not 1 <= len(parts) <= 3 or not all(p.strip() for p in parts):
        raise ValueError(f"{value.strip()!r} is not a time (seconds or [h:]m:s)")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"{value.strip()!r} is not a time (seconds or [h:]m:s)") from None
    if any(not 0 <= number < 60 for number in numbers[1:]):  # "0:70" is no clock time
        raise ValueError(f"{value.strip()!r} is not a time: minutes and seconds run to 59")
    seconds = 0.0
    for number in numbers:
        seconds = seconds * 60 + number
    if not math.isfinite(seconds) or seconds < 0:  # "inf" and "nan" parse as floats
        raise ValueError(f"{value.strip()!r} is not a time (seconds or [h:]m:s)")
    return seconds

"""Hallucination guards: text that repeats what the recording already said, and improbable
words alone in silence.

Both checks read only a window's decided text and its word times, which plain and speculative
decoding share token for token, so they decide the same way with and without a draft.

- Repetition (`RepetitionGuard`): Whisper's best-known failure on long files is a window that
  copies text from earlier in the file (its prompt) instead of what is spoken. A segment of at
  least `ngram` words, at least REPEATED_SHARE of whose words lie inside `ngram`-word runs
  already said earlier in its passage (`asr.passages`: the whole file, unless a long pause was
  cut out), is a repeat; its window is decoded again without the previous-text prompt, and a
  repeat still left then is dropped (`asr.transcribe`).
- Silence around anomalous words (`is_anomalous`, OpenAI's hallucination_silence_threshold):
  with word timestamps, a segment whose first words are improbable or implausibly short or long
  is a likely hallucination; where such a segment sits alone between pauses longer than the
  threshold, it is dropped.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

from asr.types import Segment, Word

REPEATED_SHARE = 0.8
_WORD = re.compile(r"[\w']+")


def words_of(text: str) -> list[str]:
    """Lower-cased words without punctuation: what a repeat is compared on."""
    return _WORD.findall(text.lower())


class RepetitionGuard:
    """The n-grams one recording has said so far; answers whether new text repeats them."""

    def __init__(self, ngram: int) -> None:
        if ngram < 2:
            raise ValueError(f"repetition n-gram must be at least 2 words, got {ngram}")
        self.ngram = ngram
        self.seen: set[tuple[str, ...]] = set()
        self._tail: list[str] = []  # the last ngram - 1 words, to join n-grams across texts

    def repeated_share(self, text: str) -> float:
        """Share of `text`'s words that lie inside an n-gram said before (0 for short text)."""
        words = words_of(text)
        if len(words) < self.ngram:
            return 0.0
        covered = [False] * len(words)
        for first in range(len(words) - self.ngram + 1):
            if tuple(words[first : first + self.ngram]) in self.seen:
                covered[first : first + self.ngram] = [True] * self.ngram
        return sum(covered) / len(words)

    def repeats(self, segment: Segment) -> bool:
        return self.repeated_share(segment.text) >= REPEATED_SHARE

    def add(self, texts: Iterable[str]) -> None:
        """Records text as said (in order)."""
        for text in texts:
            words = self._tail + words_of(text)
            for first in range(len(words) - self.ngram + 1):
                self.seen.add(tuple(words[first : first + self.ngram]))
            self._tail = words[-(self.ngram - 1) :]


# -- OpenAI's word anomaly score (whisper/transcribe.py, hallucination_silence_threshold) --


def _word_anomaly(word: Word) -> float:
    duration = word.end - word.start
    score = 0.0
    if word.probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_anomalous(segment: Segment | None) -> bool:
    """Whether a segment's first 8 words look hallucinated (improbable, too short, too long)."""
    if segment is None or not segment.words:
        return False
    words = [w for w in segment.words if w.text.strip() not in string.punctuation][:8]
    score = sum(_word_anomaly(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def drop_isolated_anomalies(
    segments: list[Segment],
    threshold: float,
    window: tuple[float, float],
    last_speech: float,
) -> list[Segment]:
    """Segments of one window without the anomalous ones that pauses of more than `threshold`
    seconds (or the window's edges, or other anomalous segments) surround.

    window: (start, end) s of the window's audio; last_speech: where speech before the window
    ended (s)."""
    kept: list[Segment] = []
    previous_end = last_speech
    for index, segment in enumerate(segments):
        if not segment.words or not is_anomalous(segment):
            kept.append(segment)
            previous_end = segment.end
            continue
        following = next((s for s in segments[index + 1 :] if s.words), None)
        next_start = following.words[0].start if following is not None else window[1]
        silence_before = (
            segment.start - previous_end > threshold
            or segment.start < threshold
            or segment.start - window[0] < 2.0
        )
        silence_after = (
            next_start - segment.end > threshold
            or is_anomalous(following)
            or window[1] - segment.end < 2.0
        )
        if not (silence_before and silence_after):
            kept.append(segment)
            previous_end = segment.end
    return kept

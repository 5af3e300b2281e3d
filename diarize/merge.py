"""assign_speakers(segments, turns): speaker labels for a transcript, in pure Python.

Each word takes the speaker whose turns overlap it longest; a word in a gap between turns takes
the nearest turn's speaker. Ties (overlapped speech covering a word entirely, or a word midway
between two turns) keep the previous word's speaker, so a sentence is not cut for nothing, and
otherwise go to the earlier turn. A word of no duration after another word of its segment keeps
that word's speaker: it has no audio to judge by (Whisper's alignment squeezes words to zero
length at segment ends), and a speaker change there would leave a cue and an RTTM turn of 0 s.
A segment is split where its words change speaker, except inside a sentence for a fragment:
a run of at most 2 words under 2 s (`Fragment`) takes the speaker of the longer run beside it
in its sentence (see `_absorb_fragments` for why). A sentence ends at terminal punctuation; it
runs on into the next segment only where that segment begins in lower case (Whisper cuts
segments at timestamps, not at sentences: "And symbols | that you don't ..."), so a whole
sentence or a segment that begins one keeps its speaker however short ("Yes."). Every word
lands in exactly one output segment, in order. Segments without word timestamps are assigned as
a whole, by the same rule over the segment's span, and end a sentence.

starts_in_speech(segments, turns), applied before: words that start before anyone speaks
start where the diarizer's turn inside them starts.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from asr.types import Segment, SpeakerTurn, Word


@dataclass(frozen=True)
class Fragment:
    """A run of at most `words` words, spoken for under `seconds` (the words' own durations,
    pauses left out), inside one sentence beside another speaker's run of the same sentence:
    too little to take as a change of speaker. The duration is generous because Whisper's
    alignment stretches a segment's first word over the silence before it (the AMI mixture's
    "And" lasts 0.94 s from the start of the file). Measured by bench.speaker_wer and the words'
    agreement with the reference turns (docs/diarization.md)."""

    words: int = 2
    seconds: float = 2.0

    def holds(self, run: Sequence[Word]) -> bool:
        return len(run) <= self.words and _spoken(run) < self.seconds


def _spoken(run: Iterable[Word]) -> float:
    """Seconds of speech in `run`: its words' durations, without the pauses between them."""
    return sum(word.end - word.start for word in run)


# Full stops, question and exclamation marks, and the ellipsis of Latin, CJK, Indic, Arabic,
# Armenian, Ethiopic and Burmese script. Whole words, as asr.word_timing's SENTENCE_END_MARKS
# (OpenAI's list for clamping word times), would miss a mark at the end of a word.
_SENTENCE_ENDS = frozenset(".?!…。？！｡．।॥؟۔։።။")
_CLOSING = "\"'»”’)]}」』）》】"


def ends_sentence(word: Word) -> bool:
    """Whether `word` ends a sentence: its last character, before closing quotes and brackets,
    is a sentence's end mark. Abbreviations ("Mr.") end one too: a speaker change there is
    taken at its word times, as it was before sentences were read."""
    text = word.text.rstrip().rstrip(_CLOSING)
    return bool(text) and text[-1] in _SENTENCE_ENDS


def _continues_sentence(segment: Segment) -> bool:
    """Whether `segment` carries on the sentence before it: its first letter is lower case."""
    first = next((c for c in segment.text if c.isalpha()), "")
    return first.islower()


class _Turns:
    """Turns sorted by start, with the running maximum of their ends, so that the turns touching
    a span are found by bisection and a short backward scan: O(log n + overlapping turns)."""

    def __init__(self, turns: Iterable[SpeakerTurn]) -> None:
        self.turns = sorted(turns, key=lambda t: (t.start, t.end, t.speaker))
        self.starts = [t.start for t in self.turns]
        # latest[i]: index of the turn that ends last among turns[0..i]
        self.latest: list[int] = []
        for index, turn in enumerate(self.turns):
            best = self.latest[-1] if self.latest else index
            self.latest.append(index if turn.end > self.turns[best].end else best)

    def speaker(self, start: float, end: float, previous: str | None) -> str | None:
        """The speaker for the span [start, end] seconds; None when there are no turns."""
        if not self.turns:
            return None
        start, end = min(start, end), max(start, end)
        before = bisect.bisect_left(self.starts, end)  # turns[:before] start before `end`
        overlap: dict[str, float] = {}
        first_start: dict[str, float] = {}  # per speaker, its earliest overlapping turn
        index = before - 1
        while index >= 0 and self.turns[self.latest[index]].end > start:
            turn = self.turns[index]
            seconds = min(turn.end, end) - max(turn.start, start)
            if seconds > 0:
                overlap[turn.speaker] = overlap.get(turn.speaker, 0.0) + seconds
                first_start[turn.speaker] = turn.start  # the scan runs backwards
            index -= 1
        if overlap:
            longest = max(overlap.values())
            tied = [speaker for speaker, seconds in overlap.items() if seconds == longest]
            return _prefer(tied, previous, min(tied, key=first_start.__getitem__))
        # In a gap (or a zero-length span): the nearest turn before and the nearest after.
        candidates: list[tuple[float, int]] = []
        if before > 0:
            latest = self.latest[before - 1]
            candidates.append((max(0.0, start - self.turns[latest].end), latest))
        if before < len(self.turns):
            candidates.append((max(0.0, self.turns[before].start - end), before))
        nearest = min(distance for distance, _ in candidates)
        tied_turns = sorted(index for distance, index in candidates if distance == nearest)
        tied = [self.turns[index].speaker for index in tied_turns]
        return _prefer(tied, previous, tied[0])


def starts_in_speech(
    segments: Iterable[Segment], turns: Iterable[SpeakerTurn]
) -> tuple[Segment, ...]:
    """segments whose words start where someone speaks: a timed word that starts where no turn
    is, but has a turn starting before its end, starts where that turn starts, and its
    segment (when the word is the segment's first) with it.

    Whisper's alignment stretches the first word of a passage over the silence before it, and
    the passage's audio begins with the voice detector's padding (0.4 s), so a speaker's first
    "Hello." was timed 0.4 s before the diarizer heard anyone (pyannote's sample: 6.32 s, its
    turn 6.73 s, the reference 6.69 s). The diarizer's turns say where speech starts; words
    with no turn anywhere inside them, and words of no duration, keep their times. A moved
    start is rounded to the millisecond."""
    index = _Turns(turns)
    result = []
    for segment in segments:
        words = tuple(_start_in_speech(word, index) for word in segment.words)
        start = segment.start
        if words and words[0].start != segment.words[0].start:
            start = max(start, words[0].start)
        result.append(replace(segment, start=start, words=words))
    return tuple(result)


def _start_in_speech(word: Word, index: _Turns) -> Word:
    if word.end <= word.start or not index.turns:
        return word
    after = bisect.bisect_right(index.starts, word.start)  # turns[:after] start by word.start
    if after and index.turns[index.latest[after - 1]].end > word.start:
        return word  # someone speaks where it starts
    if after < len(index.turns) and index.starts[after] < word.end:
        # to the millisecond, as transcripts hold times (turns come in the diarizer's frames)
        return replace(word, start=min(round(index.starts[after], 3), word.end))
    return word


def _prefer(tied: Sequence[str], previous: str | None, otherwise: str) -> str:
    return previous if previous in tied else otherwise


def assign_speakers(
    segments: Iterable[Segment],
    turns: Iterable[SpeakerTurn],
    fragment: Fragment | None = Fragment(),
) -> tuple[Segment, ...]:
    """segments (time-ordered) + diarization turns -> new segments with `speaker` set on each
    segment and each word, split where the speaker changes between words (but never to cut off
    a `fragment` of a sentence; None: split wherever the words' speakers change).

    Inputs are never mutated. With no turns, every speaker stays None and nothing is split.
    """
    index = _Turns(turns)
    segments = list(segments)
    labelled: list[list[Word]] = []  # per segment, its words with their speakers
    wordless: list[str | None] = []  # per segment, its speaker when it has no words
    previous: str | None = None
    for segment in segments:
        words: list[Word] = []
        if not segment.words:
            previous = index.speaker(segment.start, segment.end, previous)
        wordless.append(None if segment.words else previous)
        for word in segment.words:
            if not (words and word.end <= word.start):
                previous = index.speaker(word.start, word.end, previous)
            words.append(replace(word, speaker=previous))
        labelled.append(words)
    if fragment is not None:
        labelled = _absorb_in_sentences(segments, labelled, fragment)
    result: list[Segment] = []
    for segment, words, speaker in zip(segments, labelled, wordless, strict=True):
        result.extend(_split(segment, words) if words else [replace(segment, speaker=speaker)])
    return tuple(result)


def _absorb_in_sentences(
    segments: list[Segment], labelled: list[list[Word]], fragment: Fragment
) -> list[list[Word]]:
    """`labelled` (each segment's words) with the fragments of every sentence absorbed, the
    words regrouped by segment as they came."""
    sentences: list[list[Word]] = []
    open_sentence: list[Word] = []
    for segment, words in zip(segments, labelled, strict=True):
        if open_sentence and not (words and _continues_sentence(segment)):
            sentences.append(open_sentence)
            open_sentence = []
        for word in words:
            open_sentence.append(word)
            if ends_sentence(word):
                sentences.append(open_sentence)
                open_sentence = []
    if open_sentence:
        sentences.append(open_sentence)
    relabelled = iter(
        word
        for sentence in sentences
        for run in _absorb_fragments(_runs(sentence), fragment)
        for word in run
    )
    return [[next(relabelled) for _ in words] for words in labelled]


def _split(segment: Segment, words: list[Word]) -> list[Segment]:
    """One segment per run of consecutive words with one speaker. The first and last pieces
    keep the segment's outer times; an unsplit segment keeps its text as it was."""
    runs = _runs(words)
    if len(runs) == 1:
        return [replace(segment, words=tuple(runs[0]), speaker=runs[0][0].speaker)]
    pieces = []
    for number, run in enumerate(runs):
        pieces.append(
            replace(
                segment,
                start=segment.start if number == 0 else run[0].start,
                end=segment.end if number == len(runs) - 1 else run[-1].end,
                text="".join(word.text for word in run),
                words=tuple(run),
                speaker=run[0].speaker,
                tokens=(),  # its window's tokens hold the other pieces' text too
            )
        )
    return pieces


def _runs(words: Iterable[Word]) -> list[list[Word]]:
    """Consecutive words with one speaker, grouped."""
    runs: list[list[Word]] = []
    for word in words:
        if runs and runs[-1][0].speaker == word.speaker:
            runs[-1].append(word)
        else:
            runs.append([word])
    return runs


def _absorb_fragments(runs: list[list[Word]], fragment: Fragment) -> list[list[Word]]:
    """The runs of one sentence with each fragment relabelled with the speaker of its longer
    neighbour (in seconds spoken; the earlier one on a tie) and merged into it, the fewest
    words first (then the shortest, then the earliest), until no fragment is left beside
    another speaker.

    Why: cross-attention word times can be off by a few hundred milliseconds, and a short turn
    of an exclusive diarization at a change of speaker may be overlapped speech handed to the
    more active voice, so a word or two cut off a sentence rests on the least reliable evidence
    of both, while speakers mostly take turns between sentences. On the AMI mixture the
    diarizer gives the first 1.2 s of a sentence to another speaker, and Whisper ends a segment
    after its first two words ("And symbols | that you don't necessarily understand, ..."):
    cut off, they went to the wrong speaker. A whole sentence, however short ("Yes."), is never
    relabelled here. Runs are merged in place, so a sentence of R runs costs O(R^2) steps at
    worst, not a pass over all its words per step.
    """
    speakers = [run[0].speaker for run in runs]
    runs = [list(run) for run in runs]
    while len(runs) > 1:
        fragments = [i for i, run in enumerate(runs) if fragment.holds(run)]
        if not fragments:
            break
        # The least evidence first: a one-word run must not carry off a two-word one.
        short = min(fragments, key=lambda i: (len(runs[i]), _spoken(runs[i]), i))
        before = short - 1 if short > 0 else None
        after = short + 1 if short + 1 < len(runs) else None
        into = (
            before
            if after is None
            or (before is not None and _spoken(runs[before]) >= _spoken(runs[after]))
            else after
        )
        first, last = min(short, into), max(short, into)
        runs[first : last + 1] = [runs[first] + runs[last]]
        speakers[first : last + 1] = [speakers[into]]
        # the merged run may now meet a run of its own speaker on its other side
        for left in (first - 1, first):
            if 0 <= left < len(runs) - 1 and speakers[left] == speakers[left + 1]:
                runs[left : left + 2] = [runs[left] + runs[left + 1]]
                speakers[left : left + 2] = [speakers[left]]
                break
    return [
        [word if word.speaker == speaker else replace(word, speaker=speaker) for word in run]
        for run, speaker in zip(runs, speakers, strict=True)
    ]

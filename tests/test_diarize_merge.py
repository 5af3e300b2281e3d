"""assign_speakers on synthetic turns: pure Python, fast."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import groupby, pairwise

import pytest

from asr.types import Segment, SpeakerTurn, Word
from diarize.merge import Fragment, assign_speakers, ends_sentence, starts_in_speech


def _words(*spans: tuple[float, float, str]) -> tuple[Word, ...]:
    return tuple(Word(start, end, text, 0.9) for start, end, text in spans)


def _segment(words: tuple[Word, ...], start=None, end=None) -> Segment:
    return Segment(
        start=words[0].start if start is None else start,
        end=words[-1].end if end is None else end,
        text="".join(word.text for word in words),
        words=words,
        avg_logprob=-0.2,
        no_speech_prob=0.01,
    )


def _all_words(segments) -> list[tuple[float, float, str]]:
    return [(w.start, w.end, w.text) for segment in segments for w in segment.words]


def test_split_where_the_speaker_changes_and_a_straddling_word_goes_to_the_larger_overlap():
    turns = [SpeakerTurn(0.0, 2.0, "A"), SpeakerTurn(2.0, 4.0, "B")]
    words = _words(
        (0.5, 1.0, " Hello"), (1.1, 1.6, " there."), (1.8, 2.5, " Hi"), (3.0, 3.5, " you.")
    )
    segment = _segment(words, start=0.4, end=3.6)

    result = assign_speakers([segment], turns)

    assert [s.speaker for s in result] == ["A", "B"]
    assert [s.text for s in result] == [" Hello there.", " Hi you."]
    # outer times kept, the inner boundary at the word boundary
    assert (result[0].start, result[0].end) == (0.4, 1.6)
    assert (result[1].start, result[1].end) == (1.8, 3.6)
    assert [w.speaker for s in result for w in s.words] == ["A", "A", "B", "B"]
    assert all(s.avg_logprob == -0.2 and s.no_speech_prob == 0.01 for s in result)
    assert _all_words(result) == _all_words([segment])
    assert segment.speaker is None and segment.words[0].speaker is None  # input untouched


def test_word_in_a_gap_takes_the_nearest_turn():
    turns = [SpeakerTurn(0.0, 1.0, "A"), SpeakerTurn(3.0, 4.0, "B")]
    words = _words((1.2, 1.5, " near-A"), (2.6, 2.9, " near-B"), (4.5, 4.8, " after-B"))

    result = assign_speakers([_segment(words)], turns, fragment=None)  # the per-word rule

    assert [w.speaker for s in result for w in s.words] == ["A", "B", "B"]
    assert [s.speaker for s in result] == ["A", "B"]


def test_overlapped_speech_tie_keeps_the_previous_speaker():
    # B's turn lies inside A's: a word inside both overlaps each fully.
    turns = [SpeakerTurn(1.0, 2.0, "B"), SpeakerTurn(0.0, 5.0, "A")]
    words = _words((0.2, 0.8, " one"), (1.2, 1.8, " two"), (2.5, 3.0, " three"))
    result = assign_speakers([_segment(words)], turns)
    assert [s.speaker for s in result] == ["A"] and len(result[0].words) == 3

    # Without a previous word, the speaker whose turn starts first wins the tie.
    alone = assign_speakers([_segment(_words((1.2, 1.8, " two")))], turns)
    assert alone[0].speaker == "A"

    # A starts before B's second turn, yet B, who spoke the previous word, keeps the tie.
    turns = [SpeakerTurn(0.0, 1.0, "B"), SpeakerTurn(1.5, 5.0, "A"), SpeakerTurn(2.0, 5.0, "B")]
    tied = _words((0.2, 0.8, " one"), (2.5, 3.0, " two"))
    assert [w.speaker for w in assign_speakers([_segment(tied)], turns)[0].words] == ["B", "B"]
    alone = assign_speakers([_segment(tied[1:])], turns)
    assert alone[0].speaker == "A"


def test_overlapped_speech_longer_overlap_wins():
    turns = [SpeakerTurn(0.0, 1.5, "A"), SpeakerTurn(1.0, 3.0, "B")]
    result = assign_speakers([_segment(_words((1.1, 2.0, " word")))], turns)
    assert result[0].speaker == "B"  # 0.9 s with B against 0.4 s with A


def test_one_speaker_keeps_segments_whole_and_their_text_exact():
    turns = [SpeakerTurn(0.0, 10.0, "SPEAKER_00")]
    first = _segment(_words((0.0, 0.5, " Ask"), (0.6, 0.9, " not")))
    second = Segment(
        1.0, 2.0, " what  your country", _words((1.0, 1.5, " what"), (1.6, 2.0, " your"))
    )

    result = assign_speakers([first, second], turns)

    assert len(result) == 2
    assert [s.text for s in result] == [first.text, second.text]  # not rebuilt from words
    assert {s.speaker for s in result} == {"SPEAKER_00"}
    assert {w.speaker for s in result for w in s.words} == {"SPEAKER_00"}


def test_no_speech_and_no_turns():
    assert assign_speakers([], [SpeakerTurn(0.0, 1.0, "A")]) == ()
    segment = _segment(_words((0.0, 0.5, " hello"), (0.6, 1.0, " world")))
    result = assign_speakers([segment], [])
    assert result == (segment,)


def test_segments_without_words_are_assigned_whole_by_largest_overlap():
    turns = [SpeakerTurn(0.0, 1.0, "A"), SpeakerTurn(1.0, 3.0, "B"), SpeakerTurn(6.0, 7.0, "C")]
    segments = [
        Segment(0.0, 2.5, " mostly B"),
        Segment(0.0, 0.9, " only A"),
        Segment(5.0, 5.5, " gap nearer C"),
    ]
    result = assign_speakers(segments, turns)
    assert [s.speaker for s in result] == ["B", "A", "C"]
    assert [s.text for s in result] == [s.text for s in segments]
    assert all(s.words == () for s in result)


def test_zero_length_word_inside_a_turn():
    turns = [SpeakerTurn(0.0, 1.0, "A"), SpeakerTurn(1.0, 2.0, "B")]
    result = assign_speakers([_segment(_words((1.5, 1.5, " x")))], turns)
    assert result[0].speaker == "B"


def test_a_zero_length_word_keeps_the_speaker_of_the_word_before_it():
    # As Whisper's alignment gave "back." on pyannote_sample.wav: squeezed to 0 s at the end
    # of its segment, nearer the next speaker's turn; a split there made a cue of 0 s.
    turns = [SpeakerTurn(20.0, 28.0, "A"), SpeakerTurn(28.01, 31.0, "B")]
    words = _words((27.56, 27.9, " So we'll"), (27.9, 28.02, " come"), (28.02, 28.02, " back."))
    (whole,) = assign_speakers([_segment(words)], turns)
    assert whole.speaker == "A" and {w.speaker for w in whole.words} == {"A"}


def _brute_force(word: Word, turns: list[SpeakerTurn]) -> set[str]:
    """Every speaker the rule allows for `word` (more than one on ties)."""
    overlap: dict[str, float] = {}
    for turn in turns:
        seconds = min(turn.end, word.end) - max(turn.start, word.start)
        if seconds > 0:
            overlap[turn.speaker] = overlap.get(turn.speaker, 0.0) + seconds
    if overlap:
        best = max(overlap.values())
        return {s for s, v in overlap.items() if abs(v - best) < 1e-9}
    distance = {}
    for turn in turns:
        gap = max(0.0, turn.start - word.end, word.start - turn.end)
        distance[turn.speaker] = min(distance.get(turn.speaker, gap), gap)
    best = min(distance.values())
    return {s for s, v in distance.items() if abs(v - best) < 1e-9}


def _random_transcript(
    rng: random.Random, most_words: int, sentence_end: float = 0.0
) -> tuple[list, list]:
    """Random speaker turns and segments of up to `most_words` timed words each, a word ending
    a sentence with probability `sentence_end`."""
    turns = []
    for _ in range(rng.randint(1, 12)):
        start = rng.uniform(0, 30)
        turns.append(SpeakerTurn(start, start + rng.uniform(0.1, 6), rng.choice("ABCD")))
    segments, clock = [], 0.0
    for _ in range(rng.randint(1, 6)):
        spans = []
        for _ in range(rng.randint(1, most_words)):
            start = clock + rng.uniform(0, 0.6)
            # some words squeezed to no duration, as Whisper's alignment does
            clock = start + (0.0 if rng.random() < 0.15 else rng.uniform(0.0, 0.8))
            stop = "." if rng.random() < sentence_end else ""
            spans.append((start, clock, f" w{len(spans)}{stop}"))
        segments.append(_segment(_words(*spans)))
    return turns, segments


def test_random_transcripts_keep_every_word_once_and_follow_the_rule():
    rng = random.Random(7)
    for _ in range(200):
        turns, segments = _random_transcript(rng, most_words=8)
        result = assign_speakers(segments, turns, fragment=None)  # the per-word rule

        assert _all_words(result) == _all_words(segments)
        for segment in result:
            assert segment.words and {w.speaker for w in segment.words} == {segment.speaker}
            for before, word in pairwise(segment.words):
                if word.end > word.start:
                    assert word.speaker in _brute_force(word, turns)
                else:  # no duration: the word before it in its segment decides
                    assert word.speaker == before.speaker
            assert segment.words[0].speaker in _brute_force(segment.words[0], turns)
        # each input segment becomes consecutive pieces that differ in speaker and keep its
        # outer times
        pieces = iter(result)
        for segment in segments:
            group, taken = [], 0
            while taken < len(segment.words):
                group.append(next(pieces))
                taken += len(group[-1].words)
            assert taken == len(segment.words)
            assert all(a.speaker != b.speaker for a, b in pairwise(group))
            assert (group[0].start, group[-1].end) == (segment.start, segment.end)
        assert next(pieces, None) is None


def test_a_fragment_at_a_segments_start_stays_with_its_sentence():
    # As on the AMI mixture: the diarizer gives the sentence's first 1.2 s to another speaker.
    turns = [SpeakerTurn(0.0, 1.21, "A"), SpeakerTurn(1.21, 5.7, "B")]
    words = _words(
        (0.52, 0.98, " And"), (0.98, 1.44, " symbols"), (1.44, 1.8, " that"), (1.8, 2.5, " you")
    )
    (whole,) = assign_speakers([_segment(words)], turns)
    assert whole.speaker == "B" and [w.speaker for w in whole.words] == ["B"] * 4
    assert whole.text == " And symbols that you"
    # The per-word rule alone cuts the two words off.
    split = assign_speakers([_segment(words)], turns, fragment=None)
    assert [s.text for s in split] == [" And symbols", " that you"]


def test_a_fragment_that_whisper_gave_its_own_segment_stays_with_its_sentence():
    # As on the AMI mixture now: Whisper ends a segment after the sentence's first two words.
    turns = [SpeakerTurn(0.0, 1.21, "A"), SpeakerTurn(1.21, 5.7, "B")]
    head = _segment(_words((0.0, 0.94, " And"), (0.94, 1.44, " symbols")))
    tail = _segment(_words((1.44, 1.8, " that"), (1.8, 2.5, " you"), (2.5, 3.2, " don't.")))
    labelled = assign_speakers([head, tail], turns)
    assert [(s.speaker, s.text) for s in labelled] == [("B", head.text), ("B", tail.text)]
    # The same words with the sentence ended after "symbols." are a sentence of A's.
    ended = replace(head, words=(*head.words[:1], replace(head.words[1], text=" symbols.")))
    assert [s.speaker for s in assign_speakers([ended, tail], turns)] == ["A", "B"]


def test_a_fragment_inside_a_sentence_joins_its_longer_neighbour():
    turns = [SpeakerTurn(0.0, 2.0, "A"), SpeakerTurn(2.0, 2.5, "B"), SpeakerTurn(2.5, 9.0, "C")]
    words = _words(
        (0.1, 0.9, " one"), (1.0, 1.9, " two"), (2.1, 2.4, " three"), (2.6, 3.0, " four")
    )
    five_six = _words((3.0, 3.2, " five"), (3.2, 3.4, " six"))
    # B's word sits between A (1.8 s of words) and C (0.8 s): it goes to A.
    result = assign_speakers([_segment(words + five_six)], turns)
    assert [(s.speaker, s.text) for s in result] == [
        ("A", " one two three"),
        ("C", " four five six"),
    ]
    assert [w.speaker for s in result for w in s.words] == ["A"] * 3 + ["C"] * 3
    # Without " six", C's run is a fragment too once B's joined A: one speaker for all.
    (whole,) = assign_speakers([_segment(words + five_six[:1])], turns)
    assert whole.speaker == "A" and {w.speaker for w in whole.words} == {"A"}


def test_the_fewest_words_are_absorbed_first():
    # B's one word goes before A's two: absorbed first into B, A's words would have made B a
    # three-word run that keeps B's label for words B never spoke.
    turns = [SpeakerTurn(0.0, 2.0, "A"), SpeakerTurn(2.0, 2.5, "B"), SpeakerTurn(2.5, 9.0, "C")]
    words = _words(
        (0.1, 0.9, " one"), (1.0, 1.9, " two"), (2.1, 2.4, " three"),
        (2.6, 3.5, " four"), (3.5, 4.5, " five"), (4.5, 5.5, " six"),
    )  # fmt: skip
    (whole,) = assign_speakers([_segment(words)], turns)
    assert whole.speaker == "C" and {w.speaker for w in whole.words} == {"C"}


def test_runs_of_three_words_two_seconds_or_whole_sentences_are_split_off():
    turns = [SpeakerTurn(0.0, 2.0, "A"), SpeakerTurn(2.0, 9.0, "B")]
    head = _words((0.1, 0.5, " a"), (0.5, 0.9, " b"), (0.9, 1.3, " c"))
    tail = _words((2.1, 3.0, " d"), (3.0, 4.0, " e"), (4.0, 5.0, " f"))
    three_words = assign_speakers([_segment(head + tail)], turns)
    assert [s.speaker for s in three_words] == ["A", "B"]
    # Two words of one sentence spoken for under 2 s are a fragment, pauses not counted ...
    paused = _words((0.1, 0.8, " long"), (1.2, 1.9, " words"))
    assert [s.speaker for s in assign_speakers([_segment(paused + tail)], turns)] == ["B"]
    # ... two words spoken for 2 s are not, nor a sentence of their own or of one word.
    turns = [SpeakerTurn(0.0, 2.5, "A"), SpeakerTurn(2.5, 9.0, "B")]
    spoken = _words((0.1, 1.1, " long"), (1.1, 2.1, " words"))
    ended = _words((0.1, 1.0, " Long"), (1.0, 1.8, " words."))
    for first in (spoken, ended, _words((1.5, 1.8, " Oh!"))):
        split = assign_speakers([_segment(first + tail)], turns)
        assert [s.speaker for s in split] == ["A", "B"]
    # A bigger threshold absorbs three words.
    turns = [SpeakerTurn(0.0, 2.0, "A"), SpeakerTurn(2.0, 9.0, "B")]
    wider = assign_speakers([_segment(head + tail)], turns, fragment=Fragment(3))
    assert [s.speaker for s in wider] == ["B"]


def test_a_segment_begins_a_sentence_unless_it_begins_in_lower_case():
    # A reply after an unfinished sentence, a segment of its own, keeps its speaker.
    turns = [SpeakerTurn(0.0, 3.0, "A"), SpeakerTurn(3.0, 4.8, "B"), SpeakerTurn(4.8, 9.0, "A")]
    so = _segment(_words((0.5, 1.0, " So"), (1.0, 1.5, " we"), (1.5, 2.9, " go,")))
    reply = _segment(_words((3.1, 3.6, " Yeah,"), (3.6, 4.6, " right,")))
    on = _segment(_words((5.0, 5.5, " Then"), (5.5, 6.0, " we"), (6.0, 6.5, " do.")))
    assert [s.speaker for s in assign_speakers([so, reply, on], turns)] == ["A", "B", "A"]
    # In lower case it carries on A's sentence: two words in it are a fragment.
    lower = _segment(_words((3.1, 3.6, " yeah,"), (3.6, 4.6, " right,")))
    assert [s.speaker for s in assign_speakers([so, lower, on], turns)] == ["A", "A", "A"]
    # Scripts without case never carry a sentence over.
    cjk = [
        _segment(_words((0.5, 1.5, "我们"), (1.5, 2.9, "明天去吗"))),
        _segment(_words((3.1, 4.6, "好的"))),
        _segment(_words((5.0, 6.0, "那"), (6.0, 6.5, "走吧"))),
    ]
    assert [s.speaker for s in assign_speakers(cjk, turns)] == ["A", "B", "A"]


def test_a_segment_without_words_ends_a_sentence():
    turns = [SpeakerTurn(0.0, 2.0, "A"), SpeakerTurn(2.0, 9.0, "B")]
    head = _segment(_words((0.5, 1.0, " a"), (1.0, 1.5, " b")))
    wordless = Segment(1.9, 2.9, " c", avg_logprob=-0.2, no_speech_prob=0.01)
    tail = _segment(_words((2.5, 3.0, " c"), (3.0, 3.5, " d"), (3.5, 4.0, " e")))
    assert [s.speaker for s in assign_speakers([head, tail], turns)] == ["B", "B"]
    labelled = assign_speakers([head, wordless, tail], turns)
    assert [s.speaker for s in labelled] == ["A", "B", "B"]


@pytest.mark.parametrize(
    "text, ends",
    [(" done.", True), (" what?", True), (' "stop!"', True), (" (so…)", True), (" 好。", True),
     (" well,", False), (" 3.5", False), (" x", False), (" .", True), (" Mr.", True),
     ("」", False), (" 《书》", False), (" 书。》", True)],
)  # fmt: skip
def test_what_ends_a_sentence(text, ends):
    assert ends_sentence(Word(0.0, 1.0, text, 0.9)) is ends


def test_a_whole_short_segment_is_never_relabelled():
    # A one-word reply that Whisper gave a segment of its own keeps the replier's label.
    turns = [SpeakerTurn(0.0, 3.0, "A"), SpeakerTurn(3.0, 3.5, "B"), SpeakerTurn(3.5, 9.0, "A")]
    segments = [
        _segment(_words((0.5, 1.0, " Is"), (1.0, 2.9, " it?"))),
        _segment(_words((3.1, 3.4, " Yes."))),
        _segment(_words((3.6, 4.0, " Good."))),
    ]
    assert [s.speaker for s in assign_speakers(segments, turns)] == ["A", "B", "A"]


def test_random_transcripts_with_fragments_absorbed():
    rng = random.Random(11)
    fragment = Fragment()
    for _ in range(300):
        turns, segments = _random_transcript(rng, most_words=10, sentence_end=0.2)
        result = assign_speakers(segments, turns)

        assert _all_words(result) == _all_words(segments)
        pieces = iter(result)
        for segment in segments:
            group, taken = [], 0
            while taken < len(segment.words):
                group.append(next(pieces))
                taken += len(group[-1].words)
            assert taken == len(segment.words)
            assert (group[0].start, group[-1].end) == (segment.start, segment.end)
            for piece in group:
                assert {w.speaker for w in piece.words} == {piece.speaker}
                assert piece.text == "".join(w.text for w in piece.words) or len(group) == 1
            assert all(a.speaker != b.speaker for a, b in pairwise(group))
        assert next(pieces, None) is None
        # Per sentence: one speaker, or runs that are none of them fragments, each with a
        # speaker the per-word rule gave some word of that sentence.
        labelled = [w for s in result for w in s.words]
        per_word = [w.speaker for s in assign_speakers(segments, turns, None) for w in s.words]
        start = 0
        for end, word in enumerate(labelled, 1):
            if ends_sentence(word) or end == len(labelled):
                runs = [list(run) for _, run in groupby(labelled[start:end], lambda w: w.speaker)]
                assert len(runs) == 1 or not any(fragment.holds(run) for run in runs)
                assert {w.speaker for w in labelled[start:end]} <= set(per_word[start:end])
                start = end


def test_a_word_that_starts_before_anyone_speaks_starts_with_the_turn_inside_it():
    turns = [SpeakerTurn(6.73, 7.17, "A"), SpeakerTurn(7.59, 8.32, "A"), SpeakerTurn(9.0, 9.5, "B")]
    first = _segment(_words((6.32, 6.92, " Hello."), (7.44, 7.88, " Hello.")), start=6.3)
    inside = _segment(_words((9.1, 9.3, " Yes."), (9.6, 9.6, " -")))  # in a turn; no duration
    beyond = _segment(_words((10.0, 10.5, " Hm.")))  # no turn starts inside it

    moved = starts_in_speech([first, inside, beyond], turns)

    assert _all_words(moved) == [
        (6.73, 6.92, " Hello."),
        (7.59, 7.88, " Hello."),
        (9.1, 9.3, " Yes."),
        (9.6, 9.6, " -"),
        (10.0, 10.5, " Hm."),
    ]
    assert [(s.start, s.end) for s in moved] == [(6.73, 7.88), (9.1, 9.6), (10.0, 10.5)]
    assert moved[0].text == first.text and first.words[0].start == 6.32  # inputs unchanged
    assert starts_in_speech([first], []) == (first,)  # no turns: nothing to go by
    # A turn's start in the diarizer's frames (6.730343750000001 s) moves a word to the
    # millisecond, as every time a transcript holds is written.
    framed = starts_in_speech([first], [SpeakerTurn(6.730343750000001, 7.17, "A")])
    assert (framed[0].start, framed[0].words[0].start) == (6.73, 6.73)

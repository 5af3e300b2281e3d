"""Which text a window keeps when temperatures of the fallback schedule fail the checks: every
one, or the greedy text of speech said again before a much less probable sample that passed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from asr.audio import SAMPLE_RATE, load_audio
from asr.transcribe import TranscribeOptions, transcribe
from asr.window_decoder import WindowResult
from asr.window_session import _most_probable_of_failed, _said_again_over
from tests.conftest import (
    SAMPLES,
    SHARED_SPEECH,
    needs_speech,
    reference_text,
    word_error_rate,
)

OPTIONS = TranscribeOptions()  # compression ratio at most 2.4, log-probability at least -1


def result(text: str, avg_logprob: float, temperature: float) -> WindowResult:
    return WindowResult((), text, avg_logprob, no_speech_prob=0.1, temperature=temperature)


LOOP = " you" * 40  # compresses far better than 2.4 to 1


def test_the_most_probable_text_not_too_repetitive_is_kept_not_the_hottest_sample():
    tried = [
        result(" Ask not what your country", -1.2, 0.0),
        result(" Ask knot wot yer country", -2.0, 0.5),
        result(" ミ Gothic de Radio", -5.2, 1.0),
    ]
    kept = _most_probable_of_failed(tried, OPTIONS)
    assert kept.text == " Ask not what your country" and kept.temperature == 0.0
    assert kept.fallback_exhausted_at == 1.0


def test_a_repetition_loop_is_kept_only_when_every_text_is_one():
    loop, sample = result(LOOP, -0.1, 0.0), result(" Thank you.", -1.5, 0.2)
    assert loop.compression_ratio > OPTIONS.compression_ratio_threshold
    assert _most_probable_of_failed([loop, sample], OPTIONS).text == " Thank you."
    hotter_loop = result(LOOP, -0.3, 0.2)
    assert _most_probable_of_failed([loop, hotter_loop], OPTIONS).text == LOOP
    unchecked = TranscribeOptions(compression_ratio_threshold=None)
    assert _most_probable_of_failed([loop, sample], unchecked).text == LOOP


def segments_by_bar(result: WindowResult) -> list[tuple[str, float]]:
    """A test's stand-in for a window's segments: its text cut at "|", each timed 3 s."""
    return [(text, 3.0) for text in result.text.split("|") if text.strip()]


SENTENCE = " He began a confused complaint against the wizard, who had vanished."


def test_a_sentence_said_again_and_again_is_kept_over_improbable_samples():
    said = result("|".join([SENTENCE] * 7), -0.14, 0.0)
    assert said.compression_ratio > OPTIONS.compression_ratio_threshold
    garbled = result(" He began a confused complaint, who buddhadnice behind.", -2.7, 1.0)
    kept = _most_probable_of_failed([said, garbled], OPTIONS, segments_by_bar)
    assert kept.text == said.text and kept.fallback_exhausted_at == 1.0
    # Not where its repetition is untimed (one segment) or a loop inside a segment...
    untimed = result(said.text.replace("|", ""), -0.14, 0.0)
    assert _most_probable_of_failed([untimed, garbled], OPTIONS, segments_by_bar) == replace(
        garbled, fallback_exhausted_at=1.0
    )
    looped = result(LOOP + "|" + SENTENCE, -0.1, 0.0)
    assert _most_probable_of_failed([looped, garbled], OPTIONS, segments_by_bar).text == (
        garbled.text
    )
    # ...nor where the model finds it barely probable: the most probable of the rest.
    improbable = result(said.text, -0.86, 0.0)  # within the threshold, but not clearly
    assert _most_probable_of_failed([improbable, garbled], OPTIONS, segments_by_bar).text == (
        garbled.text
    )
    # ...nor where the window may well be no speech: "Have a good day." looped every second
    # over reversed speech 40 dB down, at a no-speech probability of 0.54.
    doubtful = replace(said, no_speech_prob=0.54)
    assert _most_probable_of_failed([doubtful, garbled], OPTIONS, segments_by_bar).text == (
        garbled.text
    )


def test_a_line_said_faster_than_anyone_speaks_is_a_loop_not_speech_said_again():
    """Translating a German reading, the greedy text said an 11-word line in each second of
    the window's last 12 (compression ratio 10, -0.24 a token) and was kept as speech said
    again; a 0.2 sample at -1.09 a token passed the repetition check."""
    line = " it was also very useful and, again, to think and think about,"
    looped = result("|".join([line] * 12), -0.24, 0.0)
    sample = result(" It was also useful, and to think about it again.", -1.09, 0.2)

    def one_second_each(window: WindowResult) -> list[tuple[str, float]]:
        return [(text, 1.0) for text, _ in segments_by_bar(window)]

    kept = _most_probable_of_failed([looped, sample], OPTIONS, one_second_each)
    assert kept.temperature == 0.2
    # Said at a speaking rate, the same line is speech said again, kept.
    assert _most_probable_of_failed([looped, sample], OPTIONS, segments_by_bar).temperature == 0


def test_a_sentence_said_again_is_kept_over_a_much_less_probable_sample_that_passed():
    """The greedy text failed only for repeating itself and is speech said again; a hotter
    sample that passed (a copy dropped) is SAID_AGAIN_MARGIN or more less probable."""
    said = result("|".join([SENTENCE] * 3), -0.11, 0.0)
    dropped = result("|".join([SENTENCE] * 2), -0.50, 0.8)
    assert dropped.compression_ratio <= OPTIONS.compression_ratio_threshold
    kept = _said_again_over(
        [said, replace(said, temperature=0.2)], dropped, OPTIONS, segments_by_bar
    )
    assert kept is said
    close = replace(dropped, avg_logprob=-0.3)  # about as probable: the sample stands
    assert _said_again_over([said], close, OPTIONS, segments_by_bar) is close
    for greedy in (
        replace(said, text=said.text.replace("|", "")),  # untimed: one segment
        replace(said, no_speech_prob=0.54),  # maybe no speech
        replace(said, temperature=0.2),  # no greedy text among the failures
    ):
        assert _said_again_over([greedy], dropped, OPTIONS, segments_by_bar) is dropped
    assert _said_again_over([], dropped, OPTIONS, segments_by_bar) is dropped  # passed at once


def test_of_texts_said_again_the_one_that_repeats_least_is_kept():
    # A loop says the sentence more often than the audio does: it compresses better, and a
    # more probable loop loses to the text that repeats least (within SAME_REPETITION).
    four, loop = "|".join([SENTENCE] * 4), "|".join([SENTENCE] * 9)
    tried = [result(loop, -0.18, 0.0), result(four, -0.19, 0.6), result(four + "!", -0.25, 0.8)]
    assert _most_probable_of_failed(tried, OPTIONS, segments_by_bar).temperature == 0.6


def test_a_line_only_hotter_samples_repeat_is_a_loop_not_speech_said_again():
    """English speech decoded as Spanish: the greedy text looped "lo" inside one segment, the
    0.2 sample "así me falo americanas," in 8 timed segments, which was kept in place of the
    window's speech; the 0.6 sample, less probable, said what was spoken."""
    line = " así me falo americanas,"
    tried = [
        result(" y así mis americanos felos|" + " lo" * 60, -0.10, 0.0),
        result("|".join([line] * 8), -0.37, 0.2),
        result(" y así me améconas.| lo que el país puede hacer para ti,", -1.11, 0.6),
    ]
    kept = _most_probable_of_failed(tried, OPTIONS, segments_by_bar)
    assert kept.temperature == 0.6
    # The same line said again in the greedy text as well: speech said again, kept.
    tried[0] = result("|".join([line] * 3), -0.20, 0.0)
    assert _most_probable_of_failed(tried, OPTIONS, segments_by_bar).temperature == 0.0


def test_ties_go_to_the_coolest_temperature():
    tried = [result(" a", -1.5, 0.0), result(" b", -1.5, 0.2)]
    assert _most_probable_of_failed(tried, OPTIONS).text == " a"


def test_a_kept_text_prompts_the_next_window_only_if_the_schedule_stayed_cool():
    passed = result(" Ask not.", -0.2, 0.4)
    assert passed.prompt_temperature == 0.4  # passed the checks at 0.4: may prompt
    greedy_only = _most_probable_of_failed([result(" Ask not.", -1.2, 0.0)], OPTIONS)
    assert greedy_only.prompt_temperature == 0.0  # no fallback tried: it prompts, as before
    schedule = [result(" Ask not.", -1.2, 0.0), result(" Ask.", -1.4, 1.0)]
    assert _most_probable_of_failed(schedule, OPTIONS).prompt_temperature == 1.0  # reset


@pytest.mark.slow
def test_a_window_that_really_says_a_line_again_keeps_its_most_probable_text(whisper_base):
    """JFK's line three times, a second apart: the first 30 s window holds it almost three
    times, which compresses better than 2.4 to 1 at every temperature. The hottest sample
    (OpenAI's rule) garbled it ("fellow America's...", 6 % WER); the most probable text not
    too repetitive is the speech as said."""
    jfk = load_audio(SAMPLES / "jfk.wav")
    pause = np.zeros(SAMPLE_RATE, dtype=np.float32)
    transcript = transcribe(whisper_base, np.concatenate([jfk, pause] * 3))
    expected = " ".join([reference_text(SAMPLES / "jfk.wav")] * 3)
    assert word_error_rate(expected, transcript.text) < 0.03


@needs_speech
@pytest.mark.slow
def test_a_sentence_said_seven_times_is_transcribed_seven_times(whisper_base_int8):
    """A LibriSpeech sentence seven times over (34 s): every temperature's text fails the
    repetition check, and of them the most probable one not too repetitive was a sample at
    1.0 that garbled it ("who buddhadnice behind the curtain", average log-probability -2.7,
    against -0.14 for the greedy text, which is the speech as said)."""
    clip = SHARED_SPEECH / "en_single" / "librispeech_61-70968-0000.flac"
    transcript = transcribe(whisper_base_int8, np.tile(load_audio(clip), 7))
    expected = " ".join([reference_text(clip)] * 7)
    assert word_error_rate(expected, transcript.text) < 0.05, transcript.text


def test_a_sentence_said_three_times_in_a_row_is_transcribed_three_times(whisper_base_int8):
    """One sentence three times, half a second apart (21 s): the greedy text (three copies,
    -0.11 a token) failed the compression check, and the 0.8 sample that passed it had dropped
    a copy and misheard words (-0.50)."""
    clip = SAMPLES / "librispeech_1089-134686-0002.wav"
    sentence, pause = load_audio(clip), np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    transcript = transcribe(
        whisper_base_int8, np.concatenate([sentence, pause, sentence, pause, sentence])
    )
    expected = " ".join([reference_text(clip)] * 3)
    assert word_error_rate(expected, transcript.text) < 0.05, transcript.text


def test_a_windows_segments_are_timed_from_the_timestamp_before_to_the_one_after():
    from types import SimpleNamespace

    from asr.window_session import _segment_texts

    begin = 50364
    model = SimpleNamespace(
        special=SimpleNamespace(timestamp_begin=begin),
        text_of=lambda tokens: " ".join(str(token) for token in tokens),
    )
    at = lambda seconds: begin + round(seconds / 0.02)  # noqa: E731
    tokens = (at(0.0), 1, 2, at(3.0), at(3.0), 3, at(4.5), at(5.0), 4, 5)  # unfinished tail
    window = WindowResult(tokens, "", -0.2, no_speech_prob=0.1, temperature=0.0)
    assert _segment_texts(model, window) == [("1 2", 3.0), ("3", 1.5), ("4 5", 0.0)]

"""Which text a window keeps when every temperature of the fallback schedule fails the checks."""

from __future__ import annotations

import numpy as np
import pytest

from asr.audio import SAMPLE_RATE, load_audio
from asr.transcribe import TranscribeOptions, _most_probable_of_failed, transcribe
from asr.window_decoder import WindowResult
from tests.conftest import SAMPLES, reference_text, word_error_rate

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

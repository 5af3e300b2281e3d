"""Digital silence (zeros) is never decoded: Whisper says "you" in it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asr.audio import SAMPLE_RATE, load_audio
from asr.silence import has_no_signal
from asr.transcribe import TranscribeOptions, transcribe
from tests.conftest import SAMPLES, normalised_words


def test_a_window_with_no_signal_is_told_from_one_with_any():
    floor = torch.full((80, 300), -1.5)
    assert has_no_signal(floor, (0, 300))
    edge = floor.clone()
    edge[:, :3] += 0.4  # what the STFT carries over from sound just before the window
    assert has_no_signal(edge, (0, 300))
    faint = floor + 1e-3 * torch.rand(80, 300)  # dither: some signal, however faint
    assert not has_no_signal(faint, (0, 300))
    word = floor.clone()
    word[:, 100:130] += 1.0  # 0.3 s of sound
    assert not has_no_signal(word, (0, 300))
    assert has_no_signal(word, (0, 100)) and not has_no_signal(word, (0, 0))


@pytest.mark.slow
def test_zeros_are_not_decoded_one_window_after_another_or_side_by_side(whisper_base):
    """Without VAD (as `--no-vad` decodes), a minute and a half of zeros gave "you you you",
    and JFK, 40 s of zeros and JFK again, cut into side-by-side windows, a " you" in the
    zeros."""
    english = TranscribeOptions(language="en")
    assert transcribe(whisper_base, np.zeros(90 * SAMPLE_RATE, np.float32), english).text == ""
    jfk = load_audio(SAMPLES / "jfk.wav")
    zeros = np.zeros(40 * SAMPLE_RATE, np.float32)
    side_by_side = TranscribeOptions(
        language="en", windows="silence", condition_on_previous_text=False, batch_size=4
    )
    transcript = transcribe(whisper_base, np.concatenate([jfk, zeros, jfk]), side_by_side)
    said = (SAMPLES / "jfk.txt").read_text()
    assert normalised_words(transcript.text) == normalised_words(f"{said} {said}")

"""Digital silence (zeros) is never decoded: Whisper says "you" in it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asr.audio import SAMPLE_RATE, load_audio
from asr.silence import has_no_signal
from asr.transcribe import TranscribeOptions, transcribe
from asr.whisper import FRAMES_PER_SECOND
from tests.conftest import SAMPLES, SHARED_SPEECH, needs_speech, normalised_words


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


@pytest.mark.slow
@needs_speech
def test_silence_after_a_sentence_is_neither_decoded_nor_left_at_the_next_windows_start(
    whisper_base_int8, one_torch_thread
):
    """JFK, 25 s of zeros, a LJ Speech sentence and 3 s of zeros, decoded window after window
    (`--no-vad`). The noise of JFK's recording ending at the zeros counted as speech skipped
    after its text: the next window began there, cut the sentence 5 s in, and the window
    after said "engraved in relief" again; the sentence's last word sounding on past its
    timestamp was decoded again as "Thank you for watching." And a window that begins seconds
    before speech times its first text from its start: the sentence at 36.0 s is timed from
    within a moment of it."""
    jfk = load_audio(SAMPLES / "jfk.wav")
    sentence = load_audio(SHARED_SPEECH / "en_single" / "ljspeech" / "LJ001-0003.wav")
    zeros = np.zeros(SAMPLE_RATE, np.float32)
    audio = np.concatenate([jfk, *[zeros] * 25, sentence, *[zeros] * 3])
    transcript = transcribe(whisper_base_int8, audio, TranscribeOptions(language="en"))
    words = " ".join(normalised_words(transcript.text))
    assert words.count("in relief") == 1 and "thank" not in words and "watching" not in words
    assert "netherlands" in words
    later = [segment for segment in transcript.segments if segment.start > 12.0]
    assert later and 35.0 <= later[0].start <= 36.5, transcript.segments
    # its window began where the sentence does, not at JFK's end nor at 30 s
    assert 34 * FRAMES_PER_SECOND <= later[0].seek <= 36 * FRAMES_PER_SECOND

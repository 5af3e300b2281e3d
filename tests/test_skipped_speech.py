"""Speech Whisper skips inside a "seek" window is decoded all the same: a window whose first
segment starts seconds into it, after loud audio, has that audio decoded apart
(`Session.skipped_before_first_segment`, `asr.seek_windows`); and words between a window's
last word and a late last timestamp are decoded by the next window, which starts at that word
(`Session._resumed_before_unsaid_words`)."""

from __future__ import annotations

import re

import pytest

from asr.silence import loudness
from asr.types import Segment
from asr.whisper import FRAMES_PER_SECOND
from asr.window_session import Session
from bench import cli as bench_cli
from bench.asr_data import user_files
from tests.conftest import SHARED_SPEECH, needs_speech


class _Level:
    """What `skipped_before_first_segment` reads of a session: its loudness per frame."""

    def __init__(self, loud_from: float, frames: int) -> None:
        import torch

        level = torch.full((frames,), -1.0)
        level[round(loud_from * FRAMES_PER_SECOND) :] = 0.5
        self.level = loudness(level.expand(80, -1), frames)
        self.resumed_windows = 0


def _split(first_start: float):
    from asr.segments import WindowSplit

    segment = Segment(first_start, first_start + 8.0, " And so my fellow Americans.")
    return WindowSplit(
        segments=(segment,),
        tokens=((440, 370),),
        consumed=3000,
        single_timestamp_ending=True,
        time_offset=0.0,
        frames=3000,
        timestamp_ends=(first_start + 8.0,),
    )


@pytest.mark.parametrize(
    ("loud_from", "first_start", "skipped"),
    [
        (1.0, 18.0, 1800),  # 17 s of speech before the segment: decoded apart from there
        (1.0, 3.0, None),  # a first segment 3 s in: Whisper's own timing
        (16.5, 18.0, None),  # loud only 1.5 s before it: the start of its own speech
    ],
)
def test_a_first_segment_after_seconds_of_loud_audio_marks_them_skipped(
    loud_from, first_start, skipped
):
    session = _Level(loud_from, 3000)
    found = Session.skipped_before_first_segment(session, _split(first_start), 0, 3000)
    assert found == skipped
    assert session.resumed_windows == (skipped is not None)


@needs_speech
@pytest.mark.slow
def test_spoken_commands_before_a_sentence_are_not_skipped_in_a_long_recording(tmp_path, settings):
    """bench.cli's 59 files joined (515 s; `--joined 1`), as users transcribe them: the window
    over the spoken commands after the sonnets gave only JFK's sentence that follows them,
    timed from the window's start (its commands lost; faster-whisper kept them). That was on
    an AMD EPYC (AVX512-VNNI), where the window is split (`resumed_windows`); on an Intel Xeon
    with AMX the bfloat16 encoder's products round otherwise and Whisper says the commands
    in the window unsplit, so the user's outcome is checked, and the split by the test above."""
    from app.service import TranscriptionService

    joined = bench_cli.joined_recording(user_files(), 1.0, tmp_path / "joined")
    transcript = TranscriptionService(settings).run(joined.audio, {"language": "en"})
    words = " ".join(re.findall(r"[a-z']+", transcript.text.lower()))
    before = words[words.index("dies with thee") : words.index("and so my fellow americans")]
    assert "repeat yes start yes repeat stop yes" in before, before


def _level(*loud: tuple[float, float], frames: int = 3000):
    """Loudness of a window loud over these (start, end) seconds, quiet elsewhere."""
    import torch

    level = torch.full((frames,), -1.0)
    for start, end in loud:
        level[round(start * FRAMES_PER_SECOND) : round(end * FRAMES_PER_SECOND)] = 0.5
    return loudness(level.expand(80, -1), frames)


@pytest.mark.parametrize(
    ("loud", "stop", "resumed"),
    [
        # Words the text left out at 25.6-26.9 s, before its timestamp at 27 s: resumed at
        # its last word's end.
        (((0.0, 25.0), (25.6, 30.0)), 27.0, 2500),
        # The last word sounding on 0.15 s past its timed end: no words unsaid.
        (((0.0, 25.15),), 27.0, None),
        # A timestamp 0.3 s after the last word: too close for a word to hide there.
        (((0.0, 25.0), (25.1, 30.0)), 25.3, None),
    ],
)
def test_a_window_resumes_at_its_last_word_only_before_loud_audio_its_text_left_out(
    loud, stop, resumed
):
    from asr.segments import WindowSplit
    from asr.window_session import last_word_before_unsaid_speech

    split = WindowSplit(
        segments=(Segment(20.0, stop, " the art of printing."),),
        tokens=((262, 1523),),
        consumed=round(stop * FRAMES_PER_SECOND),
        single_timestamp_ending=False,
        time_offset=0.0,
        frames=3000,
        timestamp_ends=(stop,),
    )
    # Its last word, " printing.", was aligned to end at 25.0 s.
    assert last_word_before_unsaid_speech(split, 2500, _level(*loud), 0) == resumed


# Ten recordings back to back, no pause between them (88.6 s): JFK, five LibriSpeech
# utterances, four LJ Speech sentences.
BACK_TO_BACK = (
    "jfk.wav",
    "librispeech_1089-134686-0002.wav",
    "librispeech_1221-135766-0001.wav",
    "librispeech_1221-135766-0002.wav",
    "librispeech_1995-1837-0001.wav",
    "librispeech_61-70968-0000.flac",
    "ljspeech/LJ001-0001.wav",
    "ljspeech/LJ001-0003.wav",
    "ljspeech/LJ001-0005.wav",
    "ljspeech/LJ001-0007.wav",
)


@needs_speech
def test_words_between_a_windows_last_word_and_its_late_timestamp_are_kept(tmp_path, settings):
    """The window ending in LJ001-0005's "... the invention of the art of printing." timed
    that sentence to 81.0 s (int8 whisper-base times whole seconds), said by 79.9 s; the next
    window began at 81.0 and LJ001-0007's first words, "the earliest", were in neither
    (`Session._resumed_before_unsaid_words`)."""
    import numpy as np
    import soundfile

    from app.service import TranscriptionService
    from asr.audio import SAMPLE_RATE, load_audio

    parts = [load_audio(SHARED_SPEECH / "en_single" / name) for name in BACK_TO_BACK]
    audio = tmp_path / "back_to_back.wav"
    soundfile.write(audio, np.concatenate(parts), SAMPLE_RATE, subtype="PCM_16")
    transcript = TranscriptionService(settings).run(audio, {"language": "en"})
    words = " ".join(re.findall(r"[a-z']+", transcript.text.lower()))
    assert "art of printing the earliest book printed" in words, words

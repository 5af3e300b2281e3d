"""Independent windows for batched decoding: the recording cut at its pauses.

Sequential long-form decoding seeks to the last timestamp of each window, so a window's start
depends on the previous window's output. Windows decoded in one batch cannot wait for each
other: instead the recording is cut into chunks of at most 30 s, each cut in the last pause
between 20 and 30 s after the previous one (or at the quietest point, where that stretch has no
pause: where a word is least likely to be split), and each chunk is decoded as one window
padded with silence.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from asr.whisper import FRAMES_PER_SECOND, N_FRAMES

MIN_CHUNK_FRAMES = 20 * int(FRAMES_PER_SECOND)
SMOOTHING_FRAMES = 21  # 0.2 s: a pause, not a single quiet frame inside a word


def loudness(mel: torch.Tensor, content_frames: int) -> torch.Tensor:
    """Mean log-mel level per frame, smoothed over 0.2 s.

    mel: Tensor, shape = (n_mels, n_frames); log-mel, louder is larger -> shape (content_frames,).
    """
    level = mel[:, :content_frames].float().mean(dim=0)[None, None]
    return torch.nn.functional.avg_pool1d(
        level,
        SMOOTHING_FRAMES,
        stride=1,
        padding=SMOOTHING_FRAMES // 2,
        count_include_pad=False,
    )[0, 0]


def split_at_silence(
    mel: torch.Tensor, content_frames: int, cuts: Sequence[int] = (), fill: bool = True
) -> list[tuple[int, int]]:
    """[start, end) frame ranges that cover the first content_frames frames, each <= 30 s,
    cut at every frame of `cuts` (where speech resumes after a long pause that was cut out:
    no chunk spans such a seam) and, within a longer stretch, between 20 and 30 s after the
    chunk's start: in its last pause where `fill` (chunks as long as a window allows, so
    fewer encoder passes), else at its quietest moment (for chunks whose language is
    detected once each: the quietest moment is more often where one speaker hands over).

    mel: Tensor, shape = (n_mels, n_frames); log-mel, louder is larger.
    """
    smoothed = loudness(mel, content_frames)
    seams = sorted({frame for frame in cuts if 0 < frame < content_frames})
    chunks = []
    for start, end in zip([0, *seams], [*seams, content_frames], strict=True):
        while end - start > N_FRAMES:
            search = smoothed[start + MIN_CHUNK_FRAMES : start + N_FRAMES]
            cut = start + MIN_CHUNK_FRAMES + (_last_pause(search) if fill else int(search.argmin()))
            chunks.append((start, cut))
            start = cut
        chunks.append((start, end))
    return chunks


def _last_pause(level: torch.Tensor) -> int:
    """Where to cut within `level` (the smoothed loudness of a chunk's 20th to 30th second):
    the middle of its last pause, a run of at least MIN_PAUSE_FRAMES frames within
    PAUSE_MARGIN of its quietest level (or less, where its own level range is narrower); the
    quietest frame where no run is that long."""
    floor = level.min()
    margin = min(PAUSE_MARGIN, 0.25 * float(level.median() - floor))
    middles, at = [], 0
    for quiet, run in itertools.groupby((level <= floor + margin).tolist()):
        length = len(list(run))
        if quiet and length >= MIN_PAUSE_FRAMES:
            middles.append(at + length // 2)
        at += length
    if middles:
        return middles[-1]
    return int(level.argmin())


# A pause is within 0.1 log-mel units (4 dB) of the quietest moment near a cut, for 0.1 s of
# frames smoothed over 0.2 s: quieter than any stretch inside a word.
PAUSE_MARGIN = 0.1
MIN_PAUSE_FRAMES = 10


def chunk_window(mel: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The 30 s window of frames [start, end), padded with silence (the last frame of `mel`,
    which `WhisperModel.log_mel` computes from 30 s of appended zeros).

    mel: Tensor, shape = (n_mels, n_frames) -> Tensor, shape = (n_mels, 3000).
    """
    silence = mel[:, -1:].expand(-1, N_FRAMES - (end - start))
    return torch.cat([mel[:, start:end], silence], dim=1)


# Speech rises above the quietest part of its chunk; 0.1 in log-mel units (log10 power / 4)
# is 4 dB. Without this margin, audio of one constant level (digital silence, a steady hum)
# "reaches its median" everywhere.
MIN_RISE = 0.1


def has_no_signal(mel: torch.Tensor, window: tuple[int, int]) -> bool:
    """Whether frames [start, end) of a log-mel spectrogram hold no signal: every value at the
    window's floor, as digital silence (zeros, or a constant) leaves it, but for at most
    MAX_EDGE_FRAMES frames (what the STFT's window carries over from sound just outside it).
    Whisper shown such a window says "you" or "Thank you." at a probability its no-speech rule
    keeps; any sound inside it, however faint (dither, room noise), is not this.

    mel: Tensor, shape = (n_mels, n_frames); log-mel, as Whisper normalises it.
    """
    start, end = window
    if end <= start:
        return False
    values = mel[:, start:end].float()
    sounding = (values > values.min() + FLAT_MEL).any(dim=0)
    return int(sounding.sum()) <= MAX_EDGE_FRAMES


# Log-mel values this close count as the same (float32 rounding of one normalised floor).
FLAT_MEL = 1e-6
# 0.05 s: the frames next to sound outside a window that its STFT reaches into, shorter than
# any word.
MAX_EDGE_FRAMES = 5


def sounds_like_speech(
    level: torch.Tensor, chunk: tuple[int, int], tail_start: int, least_run: int
) -> bool:
    """Whether frames [tail_start, chunk end) hold speech the text before them did not say
    (`speech_after`): a tail without is a pause (or silence), or the text's last word ringing
    out, not words the decoder skipped.

    level: `loudness` of the whole recording.
    """
    return speech_after(level, chunk, tail_start, least_run) is not None


def speech_after(
    level: torch.Tensor, chunk: tuple[int, int], tail_start: int, least_run: int
) -> int | None:
    """The first loud frame (`first_loud_frame`) of [tail_start, chunk end) that starts sound
    the text ending at tail_start did not say, or None.

    Sound that runs on from tail_start for less than `least_run` frames and is followed by
    `least_run` frames or more at the chunk's quietest level is the text's last word
    sounding on past its timestamp (whisper-base times whole seconds: "relief"
    sounded to 40.82 s after a timestamp at 40.00), or the recording's own noise ending at
    digital silence: the search goes on after that silence. In a window of one sentence then
    silence, the silence sets the median level, so such an end counts as loud; decoding again
    from there made Whisper say "Thank you for watching." over a word's last 0.7 s and 3 s of
    silence (no-speech probability 0.91), and moved the next windows' starts so that one cut
    a sentence and the next said its last words again. Sound that goes on, to the chunk's end
    or after a shorter pause, is words (speech in another language over the text's last
    second; speech a chunk's cut clipped)."""
    whole = level[chunk[0] : chunk[1]]
    sounding = level[tail_start : chunk[1]] >= whole.min() + MIN_RISE
    run = _leading(sounding, True)
    gap = _leading(sounding[run:], False)
    if 0 < run < least_run and gap >= least_run:
        return first_loud_frame(level, chunk, tail_start + run + gap)
    return first_loud_frame(level, chunk, tail_start)


def _leading(flags: torch.Tensor, value: bool) -> int:
    """How many of `flags` from its start equal `value`."""
    other = (flags != value).nonzero()
    return int(other[0, 0]) if len(other) else len(flags)


def past_leading_silence(level: torch.Tensor, start: int, end: int, least: int) -> int:
    """Where a window from `start` should begin: where sound first rises MIN_RISE above the
    quietest level of the 30 s from `start` (at most `end`), ONSET_MARGIN_FRAMES before it,
    where that skips `least` frames or more of silence; else `start`. Whisper times a window's
    first text from 1 s at the latest, so speech after seconds of silence at a window's start
    was timed from there and its text ran on past where the window said it ended: with
    `--no-vad`, a sentence 6 s into a window was timed 30.0-37.0 for 36.1-42.6, and the next
    window said most of it again. Only the floor is skipped, so speech however quiet, above
    the stretch's quietest level, is not."""
    stretch = level[start : min(end, start + N_FRAMES)]
    if not len(stretch):
        return start
    rising = (stretch >= stretch.min() + MIN_RISE).nonzero()
    if not len(rising):  # one level throughout: silence or a steady hum, decoded as it is
        return start
    onset = start + int(rising[0, 0]) - ONSET_MARGIN_FRAMES
    return onset if onset - start >= least else start


# A window that starts at the first loud frame starts this much earlier (0.2 s), so a word's
# soft onset, quieter than the rest of it, is not cut.
ONSET_MARGIN_FRAMES = 20


def loud_frames(level: torch.Tensor, chunk: tuple[int, int], part: tuple[int, int]) -> torch.Tensor:
    """Which frames of `part` (within `chunk`) are loud: at the chunk's median level and above
    its quietest level by MIN_RISE, the mark of speech against the chunk's own floor."""
    whole = level[chunk[0] : chunk[1]]
    inside = level[part[0] : part[1]]
    return (inside >= whole.median()) & (inside >= whole.min() + MIN_RISE)


def first_loud_frame(level: torch.Tensor, chunk: tuple[int, int], tail_start: int) -> int | None:
    """The first loud frame (`loud_frames`) of [tail_start, chunk end), where words the decoder
    skipped begin, or None: a pause."""
    found = loud_frames(level, chunk, (tail_start, chunk[1])).nonzero()
    return tail_start + int(found[0, 0]) if len(found) else None

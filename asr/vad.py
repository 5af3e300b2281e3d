"""Voice activity detection: where a recording holds speech.

A speech probability per frame comes from Silero VAD (`VoiceActivityDetector`), or, when the
request diarizes too, from the diarizer's own segmentation pass (`probability_from_activity`:
pyannote segmentation-3.0 already says, frame by frame, whether anyone speaks). Regions are
then found with Silero's rules: speech starts where the probability reaches `threshold`, ends
where it falls below `threshold - 0.15`, gaps shorter than `min_silence_duration` are bridged,
regions shorter than `min_speech_duration` are dropped, and every region is padded by
`speech_pad` seconds on both sides.

Why Silero for the default: on the development and adversarial audio both detectors miss and
add about as much speech, but importing pyannote.audio costs 5 s per process (Lightning), which
a one-file run would pay whenever VAD is on; Silero loads in 0.1 s. docs/vad.md has the figures.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asr.audio import SAMPLE_RATE
from asr.speech_timeline import merged, uncovered

WINDOW_SECONDS = 10.0  # segmentation-3.0's chunk
HYSTERESIS = 0.15  # speech ends below threshold - HYSTERESIS (as Silero's neg_threshold)
# Silero hears level, Whisper does not (its log-mel is normalised to the loudest frame): jfk
# at -40 dB lost "And so" to VAD, at -50 dB half of it, at -60 dB all of it, while Whisper
# read each in full. A recording that peaks below QUIET_PEAK (-20 dBFS: a far microphone,
# whispering) is heard twice, as recorded and raised to peak at LOUD_PEAK (by at most
# MAX_GAIN, 60 dB), and a frame is as likely speech as either hearing says: raised, quiet
# speech is found (a 0.3 s "okay" of AMI's trn05 that the meeting's reference turns hold),
# and nothing heard at the recorded level is lost (raised whispering sounded less like speech
# to Silero: the end of mfa's whisper2 was dropped). Louder recordings are heard once, and
# what Whisper reads is never changed.
QUIET_PEAK = 0.1
LOUD_PEAK = 0.5
MAX_GAIN = 1000.0
# Silero's state carries from frame to frame, and after loud speech it heard whispering as
# silence: in bench.cli's 59 files joined into one recording, mfa's whisper2 (peaking at
# -32 dBFS, after mfa's whisper) reached 0.54 at most and was dropped, where heard from a
# fresh state it reached 0.97, as alone. So in a louder recording, each stretch of at least
# MIN_QUIET_STRETCH seconds whose QUIET_BLOCK-second blocks all peak below QUIET_PEAK is also
# heard on its own, as recorded, from a fresh state, and the speech found there outside the
# whole recording's regions is added where it lasts at least min_speech_duration: JFK at
# -40 dB after JFK was found from 19.8 s to 23.9 s of its 14-25 s. Slivers are not: 32 ms
# more at the end of mfa_words's region made Whisper read "Montreal Forced Aligner" as
# "Montreal for Stelliner".
QUIET_BLOCK = 0.5
MIN_QUIET_STRETCH = 2.0


@dataclass(frozen=True)
class VadOptions:
    """threshold: speech probability where a region starts (in (0, 1));
    min_speech_duration: shorter regions are dropped (s);
    min_silence_duration: shorter gaps between regions are bridged (s);
    speech_pad: seconds added on both sides of every region (the decoder needs the onset and
      the release of a word, which the detector scores low)."""

    threshold: float = 0.4
    min_speech_duration: float = 0.25
    min_silence_duration: float = 2.0
    speech_pad: float = 0.4

    def validate(self) -> VadOptions:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"vad_threshold must be in (0, 1), got {self.threshold}")
        for name in ("min_speech_duration", "min_silence_duration", "speech_pad"):
            value = getattr(self, name)
            if not 0.0 <= value <= 60.0 or math.isnan(value):
                raise ValueError(f"vad_{name} must be in [0, 60] s, got {value}")
        return self


@dataclass(frozen=True)
class SpeechProbability:
    """values[i]: the probability that someone speaks in frame i, centred at
    `offset + i * frame_step` seconds."""

    values: np.ndarray
    frame_step: float
    offset: float = 0.0


def speech_regions(
    probability: SpeechProbability, duration: float, options: VadOptions
) -> tuple[tuple[float, float], ...]:
    """Sorted, disjoint (start, end) seconds of speech, padded and clipped to [0, duration]."""
    values, step = probability.values, probability.frame_step
    half = step / 2
    raw: list[list[float]] = []
    speaking, start = False, 0.0
    for index, value in enumerate(values):
        time = probability.offset + index * step
        if not speaking and value >= options.threshold:
            speaking, start = True, time - half
        elif speaking and value < options.threshold - HYSTERESIS:
            speaking = False
            raw.append([start, time - half])
    if speaking:
        raw.append([start, probability.offset + len(values) * step - half])
    merged: list[list[float]] = []
    for start, end in raw:
        if merged and start - merged[-1][1] < options.min_silence_duration:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    # As Silero: bursts closer than min_silence_duration count together towards min_speech.
    regions = [r for r in merged if r[1] - r[0] >= options.min_speech_duration]
    padded: list[list[float]] = []
    for start, end in regions:
        start = max(0.0, start - options.speech_pad)
        end = min(duration, end + options.speech_pad)
        if padded and start <= padded[-1][1]:
            padded[-1][1] = max(padded[-1][1], end)
        elif end > start:
            padded.append([start, end])
    return tuple((round(start, 3), round(end, 3)) for start, end in padded)


class VoiceActivityDetector:
    """Silero VAD (v6, the network its wheel carries, run by `asr.silero`) over a whole
    recording at once.

    Silero reads 32 ms frames (512 samples after 64 of context) through an STFT, a small
    convolutional encoder and one LSTM cell, whose state carries from frame to frame. Its own
    `get_speech_timestamps` calls the model once per frame (2.4 s for 159 s of audio here);
    the same arithmetic runs here as one batched encoder pass over all frames and one
    `torch.nn.LSTM` over the sequence, loaded with the cell's weights: 0.15 s, with
    probabilities equal to the frame-by-frame ones within 2e-6. Not re-entrant.
    """

    FRAME = 512  # samples per frame at 16 kHz
    CONTEXT = 64  # samples of the previous frame that each frame also sees
    BLOCK = 8192  # frames per encoder pass (4.4 min of audio): bounded memory on long files

    def __init__(self, cache: Path | None = None) -> None:
        """cache: a file that keeps the network's tensors (`asr.silero.load_silero`). The model
        is small and always runs on the CPU, whatever device Whisper uses."""
        from asr.silero import load_silero

        self._network = load_silero(cache)

    def probability(self, samples: np.ndarray) -> SpeechProbability:
        """samples: float32 mono at 16 kHz, shape = (n_samples,); a quiet one is also heard
        raised (QUIET_PEAK)."""
        heard = self._probability_as_given(samples)
        peak = float(np.abs(samples).max()) if len(samples) else 0.0
        if 0.0 < peak < QUIET_PEAK:
            raised = samples * np.float32(min(LOUD_PEAK / peak, MAX_GAIN))
            louder = self._probability_as_given(raised)
            heard = dataclasses.replace(heard, values=np.maximum(heard.values, louder.values))
        return heard

    def _probability_as_given(self, samples: np.ndarray) -> SpeechProbability:
        count = math.ceil(len(samples) / self.FRAME)
        padded = np.zeros(self.CONTEXT + count * self.FRAME, dtype=np.float32)
        padded[self.CONTEXT : self.CONTEXT + len(samples)] = samples
        frames = torch.from_numpy(padded).unfold(
            0, self.CONTEXT + self.FRAME, self.FRAME
        )  # (count, 576)
        values, state = [], None
        with torch.inference_mode():
            for first in range(0, count, self.BLOCK):
                block = frames[first : first + self.BLOCK]
                features = self._network.features(block)  # (block, 128, 1)
                hidden, state = self._network.lstm(features.squeeze(-1)[:, None, :], state)
                out = self._network.probability(hidden[:, 0, :, None])  # (block, 1, 1)
                values.append(out.reshape(len(block), -1).mean(dim=1))
        probability = torch.cat(values).numpy() if values else np.zeros(0, np.float32)
        step = self.FRAME / SAMPLE_RATE
        return SpeechProbability(probability.astype(np.float32), step, step / 2)

    def regions(
        self, samples: np.ndarray, options: VadOptions = VadOptions()
    ) -> tuple[tuple[float, float], ...]:
        """Speech regions, with the speech that only a quiet stretch heard on its own finds
        (MIN_QUIET_STRETCH)."""
        duration = len(samples) / SAMPLE_RATE
        found = speech_regions(self.probability(samples), duration, options)
        peak = float(np.abs(samples).max()) if len(samples) else 0.0
        if peak < QUIET_PEAK:  # a quiet recording is heard raised instead
            return found
        added = []
        for first, end in quiet_stretches(samples):
            alone = self._probability_as_given(samples[first:end])
            offset = first / SAMPLE_RATE
            for start, stop in speech_regions(alone, (end - first) / SAMPLE_RATE, options):
                span = (round(start + offset, 3), round(stop + offset, 3))
                added += [
                    (a, b)
                    for a, b in uncovered(span, found)
                    if b - a >= options.min_speech_duration
                ]
        return merged([*found, *added], join_touching=True)


def quiet_stretches(samples: np.ndarray) -> list[tuple[int, int]]:
    """[first, end) samples of each stretch of at least MIN_QUIET_STRETCH seconds whose
    QUIET_BLOCK-second blocks all peak below QUIET_PEAK (the last block may be shorter)."""
    block = round(QUIET_BLOCK * SAMPLE_RATE)
    count = -(-len(samples) // block)
    padded = np.zeros(count * block, np.float32)
    padded[: len(samples)] = np.abs(samples)
    quiet = [*(padded.reshape(count, block).max(axis=1) < QUIET_PEAK), False]
    stretches, start = [], None
    for index, is_quiet in enumerate(quiet):
        if is_quiet and start is None:
            start = index
        elif not is_quiet and start is not None:
            if (index - start) * QUIET_BLOCK >= MIN_QUIET_STRETCH:
                stretches.append((start * block, min(index * block, len(samples))))
            start = None
    return stretches


def _overlap_average(
    per_window: np.ndarray, step: float, frame_step: float, frame_offset: float
) -> SpeechProbability:
    """(windows, frames) scores of windows `step` s apart -> one score per frame of the whole
    recording: a Hamming-weighted mean where windows overlap (frames at a window's edges have
    less context, so the window whose centre is nearer counts more)."""
    windows, frames = per_window.shape
    hop_frames = step / frame_step
    total = round((windows - 1) * hop_frames) + frames
    weights = np.hamming(frames).astype(np.float64) + 1e-3
    summed = np.zeros(total)
    weight = np.zeros(total)
    for index in range(windows):
        first = round(index * hop_frames)
        summed[first : first + frames] += per_window[index] * weights
        weight[first : first + frames] += weights
    return SpeechProbability((summed / weight).astype(np.float32), frame_step, frame_offset)


def probability_from_activity(
    activity: np.ndarray, window_starts: np.ndarray, frame_step: float, frame_offset: float
) -> SpeechProbability:
    """The diarizer's binarized speaker activity (chunks, frames, speakers) of 10 s chunks that
    start at `window_starts` (s, evenly spaced) -> speech probability (anyone active), the same
    aggregation as `VoiceActivityDetector.probability`: diarization and VAD share one pass."""
    anyone = np.nan_to_num(activity, nan=0.0).max(axis=2)
    step = float(window_starts[1] - window_starts[0]) if len(window_starts) > 1 else WINDOW_SECONDS
    averaged = _overlap_average(anyone, step, frame_step, frame_offset)
    return SpeechProbability(averaged.values, frame_step, frame_offset + float(window_starts[0]))

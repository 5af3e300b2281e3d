"""Training speech for `asr.distill`: real recordings the project may use, and synthetic speech.

Real: the recordings of ../shared/speech minus every file the project reports figures on (the
held-out ASR benchmark set, the diarization benchmark files, the samples the tests transcribe).
Synthetic: sentences written by the embedded SmolLM2 (Apache-2.0; its samples are ours to use)
and spoken by espeak-ng with varied voices and speeds. Both are packed into windows of at most
28 s, the way transcription sees speech: several utterances per 30 s window.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr.audio import SAMPLE_RATE, load_audio

MAX_WINDOW_SECONDS = 28.0

# Prefixes (relative to ../shared/speech) of every file figures are reported on or tests
# transcribe: the ASR benchmark's held-out set (JFK, LibriSpeech, LJ001-0001..0009, the
# long-form sonnets; tests/test_distill.py checks bench.asr_data against this) and the
# diarization benchmark files.
REPORTED = (
    "en_single/jfk.wav",
    "en_single/librispeech_",
    "en_single/ljspeech/LJ001-000",
    "en_longform/",
    "multi/pyannote_sample.wav",
    "multi/ami_es2004_1min_mixture.wav",
)

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


def generate_sentences(language_model, count: int, seed: int) -> list[str]:
    """`count` sentences sampled from a causal LM (app.llm.LanguageModel), prompted with topics.

    Batched through the project's own decoding core (plain sampling, seeded)."""
    from app.llm import DraftOptions, run_generation
    from decoding import SamplingOptions

    rng = random.Random(seed)
    found: list[str] = []
    round_ = 0
    while len(found) < count:
        prompts = [f"Here is a short paragraph about {rng.choice(TOPICS)}.\n\n" for _ in range(48)]
        sampling = SamplingOptions(temperature=0.9, top_p=0.95, seed=seed + round_).validate()
        result = run_generation(
            language_model, prompts, DraftOptions(), None, sampling, max_new_tokens=112
        )
        for tokens in result.tokens:
            text = language_model.tokenizer.decode(tokens, skip_special_tokens=True)
            found.extend(sentences_from_text(text))
        round_ += 1
    return found[:count]


def speak(sentence: str, voice: str, words_per_minute: int, workdir: Path) -> np.ndarray:
    """espeak-ng's rendering of one sentence, float32 16 kHz mono."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (scripts/setup.sh installs it)")
    out = workdir / "sentence.wav"
    subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(out), sentence],
        check=True,
        capture_output=True,
    )
    return load_audio(out)


def synthetic_clips(sentences: list[str], seed: int) -> list[TrainingClip]:
    """The sentences spoken with a random voice and speed each, packed into 28 s windows."""
    rng = random.Random(seed)
    items = []
    with tempfile.TemporaryDirectory(prefix="specscribe-espeak-") as workdir:
        for index, sentence in enumerate(sentences):
            voice = rng.choice(ESPEAK_VOICES)
            samples = speak(sentence, voice, rng.randint(140, 190), Path(workdir))
            items.append((f"s{index:04d}", samples))
    return list(_pack("synthetic", items, "synthetic", gap_seconds=rng.uniform(0.3, 0.8)))

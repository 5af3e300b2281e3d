"""Diarization benchmark: DER, real-time factor and cpWER of the embedded Diarizer, in one run.

Two sets of ../shared/speech/multi: "held-out", the recordings NOT used for tuning
(pyannote_sample, 30 s, 2 speakers; ami_es2004_1min_mixture, 60 s, 4 speakers), and "AMI
development", the ten 30 s AMI chunks ami_pyannote_debug/trn00..09 (far-field, overlap-heavy;
scripts/tune_diarization.py chose the embedded pipeline's parameters on them, so they flatter
ours against the stock pipeline). For each file, and summed over each set:
- DER with pyannote.metrics, collar 0 and collar 0.25 (pyannote's convention: the total width
  forgiven around each reference boundary, i.e. +-0.125 s), overlapped speech scored, and at
  collar 0 with overlapped regions left out;
- speakers found against the reference count;
- real-time factor of diarization plus assign_speakers (the merge), median of `--repeats`
  runs after one warm-up call on other audio; the cold first call is reported too;
- the same for the baseline (one run: it is slow): pyannote's stock SpeakerDiarization on the
  same weights, untuned (agglomerative threshold 0.6, min_cluster_size 12, segmentation step
  0.1, per-(chunk, speaker) CAM++ passes);
- a bound, not a configuration: our pipeline with pyannote's OracleClustering, which gives each
  (chunk, local speaker) of the segmentation the reference speaker it overlaps most. Its DER is
  what the segmentation model and the reconstruction leave when clustering makes no mistake, so
  it tells whether an error is the clustering's to fix.
On a shared machine, give --threads no more than the idle cores: oversubscribed OpenMP threads
spin, and a run can take ten times longer.
On the AMI mixture, whose per-speaker words are given, cpWER (meeteval): whisper-base
transcribes it (asr.transcribe), assign_speakers labels the segments, words are grouped by
speaker; the baseline puts every word on one speaker. Text is normalised (Whisper's English
normaliser) on both sides. The last line printed is one JSON object.

    python -m bench.diarize [--repeats 3] [--threads 2] [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

import app.config  # noqa: F401  (switches the libraries offline before they load)
from asr.audio import load_audio
from asr.models import ModelRegistry
from asr.types import Segment, SpeakerTurn
from bench import positive_int, prog
from diarize.merge import assign_speakers
from diarize.pipeline import Diarizer, EmbeddedParams, audio_file, turns_from_annotation
from diarize.scoring import read_rttm, score, to_annotation

MULTI = Path(__file__).resolve().parent.parent.parent / "shared" / "speech" / "multi"
SETS: dict[str, tuple[str, ...]] = {
    "held-out": ("pyannote_sample.wav", "ami_es2004_1min_mixture.wav"),
    "AMI development": tuple(f"ami_pyannote_debug/trn{i:02d}.flac" for i in range(10)),
}
CPWER_FILE = "ami_es2004_1min_mixture"
COLLARS = (0.0, 0.25)
ORACLE = "oracle clustering (bound)"


@dataclass(frozen=True)
class Run:
    seconds: float
    turns: tuple[SpeakerTurn, ...]
    segments: tuple[Segment, ...]


def load_diarizers(registry: ModelRegistry, baseline: bool) -> dict[str, Diarizer]:
    segmentation = registry.resolve("pyannote-segmentation-3.0")
    embedding = registry.resolve("campplus-sv-zh-en")
    diarizers = {"ours": Diarizer.embedded(segmentation, embedding)}
    if baseline:
        diarizers["pyannote stock, untuned"] = stock_diarizer(segmentation, embedding)
    return diarizers


def stock_diarizer(segmentation: Path, embedding: Path) -> Diarizer:
    """pyannote's SpeakerDiarization as it comes, on the same weights: the issue's baseline."""
    from pyannote.audio.pipelines import SpeakerDiarization

    from diarize.campplus import load_campplus
    from diarize.embedding import CamPlusPlusEmbedding
    from diarize.pipeline import NoPLDA

    pipeline = SpeakerDiarization(
        segmentation=str(segmentation),
        embedding=CamPlusPlusEmbedding(load_campplus(embedding)),
        plda=NoPLDA(),
        clustering="AgglomerativeClustering",
        embedding_batch_size=32,
        segmentation_batch_size=16,
    )
    pipeline.instantiate(
        {
            "segmentation": {"min_duration_off": 0.0},
            "clustering": {"method": "centroid", "threshold": 0.6, "min_cluster_size": 12},
        }
    )
    return Diarizer(pipeline)


def oracle_diarizer(registry: ModelRegistry) -> Diarizer:
    """The embedded pipeline with pyannote's OracleClustering in place of its own."""
    from pyannote.audio.pipelines.clustering import OracleClustering

    diarizer = Diarizer.embedded(
        registry.resolve("pyannote-segmentation-3.0"), registry.resolve("campplus-sv-zh-en")
    )
    diarizer.pipeline.clustering = OracleClustering()
    return diarizer


def oracle_turns(
    diarizer: Diarizer, samples, reference: tuple[SpeakerTurn, ...]
) -> tuple[SpeakerTurn, ...]:
    """Turns of `oracle_diarizer`, which reads the reference speakers from the file."""
    file = audio_file(samples)
    file["annotation"] = to_annotation(reference)
    output = diarizer.pipeline(file)
    return turns_from_annotation(getattr(output, "speaker_diarization", output))


def accuracy(reference, turns, duration: float) -> dict:
    """DER at each collar and the number of speakers found."""
    entry = {
        f"der_collar_{collar}": round(score(reference, turns, duration, collar).rate, 4)
        for collar in COLLARS
    }
    entry["der_no_overlap"] = round(score(reference, turns, duration, skip_overlap=True).rate, 4)
    entry["speakers_found"] = len({t.speaker for t in turns})
    return entry


def set_totals(reference_turns: dict, hypotheses: dict, durations: dict) -> dict:
    """DER over a whole set (errors and reference speech summed over its files)."""
    totals = {}
    for key, collar, skip in (
        *((f"der_collar_{c}", c, False) for c in COLLARS),
        ("der_no_overlap", 0.0, True),
    ):
        scores = [
            score(reference_turns[name], hypotheses[name], durations[name], collar, skip)
            for name in hypotheses
        ]
        totals[key] = round(sum(scores[1:], scores[0]).rate, 4)
    return totals


def timed(diarizer: Diarizer, samples, segments: tuple[Segment, ...]) -> Run:
    """Diarization plus the merge, as the service does it (words by the exclusive turns)."""
    started = time.perf_counter()
    diarization = diarizer.diarization(samples)
    labelled = assign_speakers(segments, diarization.exclusive)
    return Run(time.perf_counter() - started, diarization.turns, labelled)


def transcribe_all(registry: ModelRegistry, audio: dict) -> dict[str, tuple[Segment, ...]]:
    from asr.transcribe import transcribe
    from asr.whisper import WhisperModel

    model = WhisperModel.load(registry.resolve("whisper-base"))
    return {name: transcribe(model, samples).segments for name, samples in audio.items()}


def normalise(text: str) -> str:
    """bench.asr's normaliser, after joining AMI's spelled letters ("L_C_D_" -> "LCD")."""
    from bench.asr import normalise as normalise_english

    text = re.sub(r"\b((?:[A-Za-z]_)+)", lambda m: m.group(1).replace("_", ""), text)
    return normalise_english(text)


def ami_reference_words() -> list[str]:
    """The AMI mixture's words, one normalised text per reference speaker, in a fixed order."""
    folder = MULTI / f"{CPWER_FILE.removesuffix('_mixture')}_text"
    return [
        normalise(path.read_text(encoding="utf-8"))
        for path in sorted(folder.glob("mixture.*.words_joined.txt"))
    ]


def speaker_cpwer(
    reference: list[str], segments: tuple[Segment, ...], one_speaker: bool = False
) -> dict[str, float | int]:
    """Concatenated minimum-permutation WER of `segments` grouped by speaker label (None
    counts as one more speaker; one_speaker: all of them as one) against `reference`, one
    normalised text per reference speaker."""
    from meeteval.wer import cp_word_error_rate

    by_speaker: dict[str, list[str]] = {}
    for segment in segments:
        speaker = "all" if one_speaker else (segment.speaker or "none")
        by_speaker.setdefault(speaker, []).append(segment.text)
    hypothesis = [normalise(" ".join(texts)) for texts in by_speaker.values()]
    result = cp_word_error_rate(reference, hypothesis)
    return {
        "cpwer": round(result.error_rate, 4),
        "errors": result.errors,
        "reference_words": result.length,
        "hypothesis_speakers": len(hypothesis),
    }


def cpwer(segments: tuple[Segment, ...], one_speaker: bool) -> dict[str, float | int]:
    """`speaker_cpwer` against the AMI mixture's per-speaker reference words."""
    return speaker_cpwer(ami_reference_words(), segments, one_speaker)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("diarize"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    parser.add_argument("--no-baseline", action="store_true", help="skip pyannote stock")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)  # pyannote's chatter
    # numpy on a chunk where nobody speaks alone long enough for an embedding (trn01): the
    # result, no turns there, is scored; the 18 warnings said nothing more.
    warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
    warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)

    from app.config import Settings

    registry = ModelRegistry(Settings.from_env().cache_dir)
    paths = {Path(f).stem: MULTI / f for files in SETS.values() for f in files}
    audio = {name: load_audio(path) for name, path in paths.items()}
    references = {name: read_rttm(path.with_suffix(".rttm")) for name, path in paths.items()}
    durations = {name: len(samples) / 16_000 for name, samples in audio.items()}
    transcripts = transcribe_all(registry, audio)
    diarizers = load_diarizers(registry, baseline=not args.no_baseline)
    oracle = oracle_diarizer(registry)

    warm_up = load_audio(MULTI / "ami_pyannote_debug" / "trn00.flac")[: 15 * 16_000]
    report: dict = {
        "benchmark": "diarize",
        "threads": args.threads,
        "repeats": args.repeats,
        "params": EmbeddedParams().__dict__,
        "files": {},
        "sets": {},
    }
    for config, diarizer in diarizers.items():
        cold = timed(diarizer, warm_up, ()).seconds
        print(f"{config}: first call (15 s of audio) {cold:.2f} s", file=sys.stderr)
        report.setdefault("first_call_seconds", {})[config] = round(cold, 2)
    hypotheses: dict[str, dict[str, tuple[SpeakerTurn, ...]]] = {}
    for name, samples in audio.items():
        reference, duration = references[name], durations[name]
        row: dict = {
            "duration_s": duration,
            "reference_speakers": len({t.speaker for t in reference}),
        }
        for config, diarizer in diarizers.items():
            repeats = args.repeats if config == "ours" else 1  # the baseline is slow
            runs = [timed(diarizer, samples, transcripts[name]) for _ in range(repeats)]
            seconds = statistics.median(run.seconds for run in runs)
            entry = accuracy(reference, runs[0].turns, duration)
            entry["seconds"] = round(seconds, 3)
            entry["rtf"] = round(seconds / duration, 4)
            if name == CPWER_FILE:
                entry["cpwer"] = cpwer(runs[0].segments, one_speaker=False)
            row[config] = entry
            hypotheses.setdefault(config, {})[name] = runs[0].turns
        bound = oracle_turns(oracle, samples, reference)
        row[ORACLE] = accuracy(reference, bound, duration)
        hypotheses.setdefault(ORACLE, {})[name] = bound
        if name == CPWER_FILE:
            row["one speaker (cpWER baseline)"] = {
                "cpwer": cpwer(transcripts[name], one_speaker=True)
            }
        report["files"][name] = row
    for set_name, files in SETS.items():
        names = [Path(f).stem for f in files]
        report["sets"][set_name] = {
            config: set_totals(references, {n: hypotheses[config][n] for n in names}, durations)
            for config in hypotheses
        }
    print_table(report, list(diarizers))
    print(json.dumps(report))
    return 0


def _versus(ours: dict, entry: dict, key: str) -> str:
    """' (ours/this xR)' for a baseline row; nothing for ours or a zero baseline."""
    if entry is ours or not entry[key]:
        return ""
    return f" (ours/this x{ours[key] / entry[key]:.2f})"


def print_table(report: dict, configs: list[str]) -> None:
    for name, row in report["files"].items():
        print(f"\n{name} ({row['duration_s']:.0f} s, {row['reference_speakers']} speakers)")
        ours = row[configs[0]]
        for config in configs:
            entry = row[config]
            line = (
                f"  {config:26} DER {entry['der_collar_0.0']:.3f}"
                f"{_versus(ours, entry, 'der_collar_0.0')}"
                f" | collar 0.25 {entry['der_collar_0.25']:.3f}"
                f" | no overlap {entry['der_no_overlap']:.3f}"
                f" | speakers {entry['speakers_found']}"
                f" | RTF {entry['rtf']:.3f}{_versus(ours, entry, 'rtf')}"
            )
            if "cpwer" in entry:
                line += f" | cpWER {entry['cpwer']['cpwer']:.3f}"
            print(line)
        bound = row[ORACLE]
        print(
            f"  {ORACLE:26} DER {bound['der_collar_0.0']:.3f}"
            f" | collar 0.25 {bound['der_collar_0.25']:.3f}"
            f" | no overlap {bound['der_no_overlap']:.3f} | speakers {bound['speakers_found']}"
        )
        if "one speaker (cpWER baseline)" in row:
            baseline = row["one speaker (cpWER baseline)"]["cpwer"]["cpwer"]
            print(f"  {'one speaker':26} cpWER {baseline:.3f}")
    for set_name, totals in report["sets"].items():
        print(f"\nset {set_name} (DER over all its files)")
        for config, entry in totals.items():
            print(
                f"  {config:26} DER {entry['der_collar_0.0']:.3f}"
                f" | collar 0.25 {entry['der_collar_0.25']:.3f}"
                f" | no overlap {entry['der_no_overlap']:.3f}"
            )


if __name__ == "__main__":
    sys.exit(main())

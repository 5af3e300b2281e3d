"""Chooses the embedded Diarizer's clustering threshold, minimum cluster size and minimum
durations on the AMI development chunks trn00..09 ONLY (../shared/speech/multi/ami_pyannote_debug);
the files that bench/diarize.py reports are never read here.

The chunks are 30 s each, but several come from the same meeting (their RTTMs name the same
AMI participants). Scored alone, a 30 s chunk never tests whether a speaker keeps one label over
minutes, and pyannote's minimum cluster size is capped at 10 % of a file's embeddings, so 30 s
files barely constrain it. The chunks that share speakers are therefore joined, in name order,
into recordings of 60-120 s (labels stay consistent because they are participant ids): five
development recordings, 300 s in all.

Grid search, staged so each stage reuses cached work (pyannote's training mode keeps the
segmentation and the embeddings of each recording; only clustering and post-processing rerun):
  1. for each structure (segmentation step; embeddings with or without overlapped frames):
     threshold x min_cluster_size x min_embedding_speech, with no minimum durations;
  2. at the best of stage 1: min_duration_off x min_duration_on;
  3. the threshold again, around its stage-1 value, with the chosen durations.
The score is the pooled DER of the recordings (pyannote.metrics, collar 0, overlap scored).
Stages 2 and 3 move away from what they start from only for at least MARGIN less DER: five
minutes of far-field meeting audio, where missed speech dominates, reward filling every short
gap, and a gain of a second or so of speech is within the noise of one turn boundary. Ties go
to the first candidate, and structures are listed cheapest first.

Usage: .venv/bin/python scripts/tune_diarization.py [--data DIR] [--threads N]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from app.config import Settings  # first of the project's imports: hub calls and telemetry off
from asr.audio import load_audio
from asr.models import ModelRegistry
from asr.types import SpeakerTurn
from diarize.pipeline import Diarizer, EmbeddedParams, audio_file, turns_from_annotation
from diarize.scoring import DERScore, read_rttm, score

REPO = Path(__file__).resolve().parent.parent
# Chunks joined into one recording share AMI participants (see their RTTMs).
DEV_RECORDINGS = (
    ("trn00", "trn01", "trn02", "trn03"),
    ("trn04",),
    ("trn05",),
    ("trn06", "trn09"),
    ("trn07", "trn08"),
)
# (segmentation_step, exclude_overlap): how the embeddings are made, so each has its own cache.
STRUCTURES = ((0.2, False), (0.1, False), (0.1, True))
THRESHOLDS = np.round(np.arange(0.40, 1.101, 0.05), 3)
MIN_CLUSTER_SIZES = (1, 4, 8, 12, 16)
MIN_EMBEDDING_SPEECH = (0.5, 1.0, 1.5, 2.0)  # seconds; pyannote's fixed rule is 2.0
MIN_DURATIONS_OFF = (0.0, 0.1, 0.2, 0.3, 0.5)
MIN_DURATIONS_ON = (0.0, 0.1, 0.2, 0.3)
MARGIN = 0.005  # pooled DER, absolute: 1.5 s of the 300 s


@dataclass(frozen=True)
class DevFile:
    name: str
    samples: np.ndarray
    reference: tuple[SpeakerTurn, ...]

    @property
    def duration(self) -> float:
        return len(self.samples) / 16_000


def load_dev(folder: Path) -> list[DevFile]:
    """The chunks of each DEV_RECORDINGS group end to end, reference turns shifted to match."""
    recordings = []
    for names in DEV_RECORDINGS:
        parts, reference, offset = [], [], 0.0
        for name in names:
            samples = load_audio(folder / f"{name}.flac")
            parts.append(samples)
            reference += [
                SpeakerTurn(t.start + offset, t.end + offset, t.speaker)
                for t in read_rttm(folder / f"{name}.rttm")
            ]
            offset += len(samples) / 16_000
        recordings.append(DevFile("+".join(names), np.concatenate(parts), tuple(reference)))
    return recordings


class Evaluator:
    """Scores parameter sets for one structure; caches per file live in `self.files`."""

    def __init__(self, registry: ModelRegistry, dev: list[DevFile], params: EmbeddedParams):
        self.dev = dev
        self.diarizer = Diarizer.embedded(
            registry.resolve("pyannote-segmentation-3.0"),
            registry.resolve("campplus-sv-zh-en"),
            params,
        )
        self.diarizer.pipeline.training = True  # keep segmentations and embeddings per file
        self.files = [audio_file(item.samples, item.name) for item in dev]

    def __call__(self, params: EmbeddedParams) -> DERScore:
        total = DERScore(0.0, 0.0, 0.0, 0.0)
        for _, result, _ in self.per_recording(params):
            total += result
        return total

    def per_recording(self, params: EmbeddedParams) -> list[tuple[str, DERScore, int]]:
        """(name, DER components, speakers found) of each development recording."""
        pipeline = self.diarizer.pipeline
        pipeline.instantiate(params.pyannote_parameters())
        results = []
        for item, file in zip(self.dev, self.files, strict=True):
            annotation = pipeline(file).speaker_diarization
            turns = turns_from_annotation(annotation, params.min_duration_on)
            speakers = len({t.speaker for t in turns})
            results.append((item.name, score(item.reference, turns, item.duration), speakers))
        return results


def best_of(
    evaluate: Evaluator,
    candidates: list[EmbeddedParams],
    incumbent: tuple[EmbeddedParams, float] | None = None,
) -> tuple[EmbeddedParams, float]:
    """The candidate with the lowest DER, unless it beats `incumbent` by less than MARGIN."""
    scored = [(evaluate(params).rate, index) for index, params in enumerate(candidates)]
    rate, index = min(scored)
    if incumbent is not None and rate > incumbent[1] - MARGIN:
        return incumbent
    return candidates[index], rate


def describe(params: EmbeddedParams) -> str:
    return (
        f"step={params.segmentation_step} exclude_overlap={params.exclude_overlap} "
        f"threshold={params.threshold} min_cluster_size={params.min_cluster_size} "
        f"min_embedding_speech={params.min_embedding_speech} "
        f"min_duration_off={params.min_duration_off} min_duration_on={params.min_duration_on}"
    )


def tune_structure(
    registry: ModelRegistry, dev: list[DevFile], step: float, exclude_overlap: bool
) -> tuple[EmbeddedParams, float]:
    base = EmbeddedParams(
        segmentation_step=step,
        exclude_overlap=exclude_overlap,
        min_embedding_speech=2.0,
        min_duration_off=0.0,
        min_duration_on=0.0,
    )
    started = time.perf_counter()
    evaluate = Evaluator(registry, dev, base)
    untuned = evaluate(replace(base, threshold=0.6, min_cluster_size=12)).rate
    print(f"  untuned (threshold 0.6, min_cluster_size 12): DER {untuned:.4f}", flush=True)
    # 1. Clustering.
    grid = [
        replace(base, threshold=float(t), min_cluster_size=m, min_embedding_speech=s)
        for t, m, s in itertools.product(THRESHOLDS, MIN_CLUSTER_SIZES, MIN_EMBEDDING_SPEECH)
    ]
    best, rate = best_of(evaluate, grid)
    print(f"  stage 1: DER {rate:.4f}  {describe(best)}", flush=True)
    # 2. Minimum durations.
    grid = [
        replace(best, min_duration_off=off, min_duration_on=on)
        for off, on in itertools.product(MIN_DURATIONS_OFF, MIN_DURATIONS_ON)
    ]
    best, rate = best_of(evaluate, grid, incumbent=(best, rate))
    print(f"  stage 2: DER {rate:.4f}  {describe(best)}", flush=True)
    # 3. The threshold again, near its value, now that short turns and gaps are handled.
    near = [t for t in np.round(np.arange(-0.1, 0.101, 0.025) + best.threshold, 3) if 0 < t < 2]
    best, rate = best_of(
        evaluate, [replace(best, threshold=float(t)) for t in near], incumbent=(best, rate)
    )
    print(f"  stage 3: DER {rate:.4f}  {describe(best)}", flush=True)
    for name, result, speakers in evaluate.per_recording(best):
        print(
            f"    {name:24} DER {result.rate:.3f} (false alarm {result.false_alarm:.1f} s, "
            f"missed {result.missed:.1f} s, confusion {result.confusion:.1f} s), "
            f"{speakers} speakers found"
        )
    print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    return best, rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "speech" / "multi" / "ami_pyannote_debug",
        help="folder with trn00..09 .flac + .rttm",
    )
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="no more than idle cores"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    # pyannote.metrics warns on every call about approximated extents; the UEM is given.
    warnings.filterwarnings("ignore", category=UserWarning)

    registry = ModelRegistry(Settings.from_env().cache_dir)
    dev = load_dev(args.data)
    for item in dev:
        speakers = len({t.speaker for t in item.reference})
        print(f"development recording {item.name}: {item.duration:.0f} s, {speakers} speakers")
    results = []
    for step, exclude_overlap in STRUCTURES:
        print(f"structure: segmentation_step={step} exclude_overlap={exclude_overlap}", flush=True)
        results.append(tune_structure(registry, dev, step, exclude_overlap))
    best, rate = min(results, key=lambda result: result[1])
    print(f"chosen: {describe(best)}")
    print(f"development DER (pooled, collar 0, overlap scored): {rate:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

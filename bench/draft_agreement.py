"""How often a distilled draft's next token is the target's, on the benchmark's real speech.

Teacher forcing, as `specscribe distill` scores its held-out windows, but on the speech that
`bench.asr` reports (`bench.asr_data`, never trained on) instead of a mostly synthetic split:
the target (whisper-base, fp32) transcribes each 28 s piece greedily, as `distill` labels its
windows (with and without timestamps and previous-text prompts, seeded), and each draft predicts
every one of those tokens from the target's own context. Agreement is reported over all tokens
and by kind: the first generated token, text, timestamps, and the end token. It predicts the
tokens per target call that drafting reaches (each call accepts drafted tokens up to the first
disagreement) without timing anything, so it is not disturbed by a busy machine. With `--top K`
it also reports how often the target's token is among the draft's k best (k = 2..K): what a
tree that verifies the draft's k best tokens at a position could accept there. The last line
printed is one JSON object.

    python -m bench.draft_agreement [--draft NAME=PATH ...] [--threads N] [--top K]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

import torch

import app.config  # first: switches the libraries offline before they load
from asr.audio import SAMPLE_RATE, load_audio
from asr.distill import draft_predictions, label_windows
from asr.distill_data import MAX_WINDOW_SECONDS, TrainingClip
from asr.models import ModelRegistry
from asr.whisper import WhisperModel
from bench import positive_int, prog
from bench.asr_data import benchmark_files


def benchmark_clips() -> list[TrainingClip]:
    """The benchmark's recordings cut into pieces of at most 28 s (the last piece of a long
    file kept if it holds at least a second)."""
    piece = int(MAX_WINDOW_SECONDS * SAMPLE_RATE)  # distill's window length
    clips = []
    for item in benchmark_files():
        samples = load_audio(item.audio)
        for start in range(0, len(samples), piece):
            part = samples[start : start + piece]
            if len(part) >= SAMPLE_RATE:
                clips.append(TrainingClip(f"{item.name}@{start // SAMPLE_RATE}s", part, "real"))
    return clips


def token_kind(position: int, token: int, special) -> str:
    if token == special.eot:
        return "end"
    if token >= special.timestamp_begin:
        return "timestamp"
    return "first" if position == 0 else "text"


def named_path(spec: str) -> tuple[str, str]:
    """NAME=PATH -> (NAME, PATH); anything else is a usage error naming the expected form."""
    name, separator, path = spec.partition("=")
    if not (separator and name and path):
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {spec!r}")
    return name, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("draft_agreement"), description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--draft",
        action="append",
        type=named_path,
        metavar="NAME=PATH",
        help="a distilled draft directory (repeatable); default: whisper-base-draft",
    )
    parser.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0, help="decoding modes and prompts")
    parser.add_argument(
        "--top",
        type=positive_int,
        default=1,
        help="also report how often the label is among the draft's k best, k = 2..TOP",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    registry = ModelRegistry(app.config.Settings.from_env().cache_dir)
    drafts = dict(args.draft or [])
    if not drafts:
        drafts = {"whisper-base-draft": registry.resolve("whisper-base-draft")}
    target = WhisperModel.load(registry.resolve("whisper-base"), "cpu", torch.float32)
    drafted = {name: WhisperModel.load_draft(path, target) for name, path in drafts.items()}
    loaded = {
        name: (draft.model, draft.output_vocabulary, draft.cross_from_target)
        for name, draft in drafted.items()
    }
    layer_sets = {layers for _, _, layers in loaded.values()}
    clips = benchmark_clips()
    started = time.perf_counter()
    # The labelled windows keep the cross-attention of the layers a draft reads; drafts made
    # from other target layers need their own labelling (same seed: the same transcriptions).
    windows_of = {
        layers: label_windows(target, clips, layers, seed=args.seed) for layers in layer_sets
    }
    label_seconds = time.perf_counter() - started

    report = {
        "benchmark": "draft_agreement",
        "target": "whisper-base",
        "pieces": len(clips),
        "label_seconds": round(label_seconds, 1),
        "drafts": {},
    }
    for name, (module, vocabulary, layers) in loaded.items():
        windows = windows_of[layers]
        predicted = draft_predictions(
            module.eval(), target, windows, vocabulary, top=max(args.top, 2)
        )
        agree, count = Counter(), Counter()
        covered = {k: Counter() for k in range(2, args.top + 1)}  # label among the best k
        for window, guesses in zip(windows, predicted, strict=True):
            for position, (label, best) in enumerate(
                zip(window.labels, guesses.tolist(), strict=True)
            ):
                kind = token_kind(position, label, target.special)
                count[kind] += 1
                agree[kind] += int(label == best[0])
                for k, hits in covered.items():
                    hits[kind] += int(label in best[:k])
        report["drafts"][name] = {
            "path": str(drafts[name]),
            "tokens": sum(count.values()),
            "agreement": round(sum(agree.values()) / max(sum(count.values()), 1), 4),
            "by_kind": {
                kind: {"agreement": round(agree[kind] / count[kind], 4), "tokens": count[kind]}
                for kind in sorted(count)
            },
        }
        # What a tree of the draft's k best tokens at one position could accept there.
        for k, hits in covered.items():
            report["drafts"][name][f"top{k}"] = {
                "all": round(sum(hits.values()) / max(sum(count.values()), 1), 4),
                **{kind: round(hits[kind] / count[kind], 4) for kind in sorted(count)},
            }
        print(f"{name}: agreement {report['drafts'][name]['agreement']:.3f}", flush=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

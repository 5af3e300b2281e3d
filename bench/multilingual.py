"""Recordings that switch language: how much of each clip comes out in its own language.

Clips of real speech in four languages (../shared/speech: LibriSpeech and JFK in English, the
leopard sentences in Spanish, French and German) joined in two fixed orders with PAUSE seconds
of digital silence between clips, for several pauses: speakers who switch language after a
short pause, so that one 30 s window holds two or three languages. Each recording is
transcribed as the CLI's `--multilingual` does (TranscriptionService, default settings), one
window at a time and with `--batch-size` chunks. A clip's text is the segments whose middle
falls inside it; it counts as in its language when every one of them is tagged with it. WER is
over all clips (jiwer, whisper-normalizer's basic normaliser, for every language). The last
line printed is one JSON object.

    python -m bench.multilingual [--pauses 0.3 0.7 1.5 3] [--batch-sizes 1 8] [--threads 2]
        [--save]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import torch

import app.config  # noqa: F401  (switches the libraries offline before they load)
from bench import positive_int, prog
from bench.asr_data import SPEECH

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
ORDERS = {
    "en-es-en-fr-en": (
        ("en", SPEECH / "en_single" / "librispeech_1221-135766-0001.wav"),
        ("es", SPEECH / "non_en" / "leopard_test_es.wav"),
        ("en", SAMPLES / "jfk.wav"),
        ("fr", SPEECH / "non_en" / "leopard_test_fr.wav"),
        ("en", SPEECH / "en_single" / "librispeech_1089-134686-0002.wav"),
    ),
    "de-en-es-fr-en": (
        ("de", SPEECH / "non_en" / "leopard_test_de.wav"),
        ("en", SAMPLES / "jfk.wav"),
        ("es", SPEECH / "non_en" / "leopard_test_es.wav"),
        ("fr", SPEECH / "non_en" / "leopard_test_fr.wav"),
        ("en", SPEECH / "en_single" / "librispeech_1995-1837-0001.wav"),
    ),
}


def joined(clips: tuple[tuple[str, Path], ...], pause: float) -> tuple[np.ndarray, list]:
    """The clips one after another, `pause` seconds of silence between them: (samples, each
    clip's (language, reference text, start s, end s))."""
    from asr.audio import SAMPLE_RATE, load_audio

    pieces, spans, clock = [], [], 0.0
    for language, path in clips:
        if pieces:
            pieces.append(np.zeros(round(pause * SAMPLE_RATE), np.float32))
            clock += pause
        samples = load_audio(path)
        pieces.append(samples)
        reference = path.with_suffix(".txt").read_text(encoding="utf-8").strip()
        spans.append((language, reference, clock, clock + len(samples) / SAMPLE_RATE))
        clock += len(samples) / SAMPLE_RATE
    return np.concatenate(pieces), spans


def scored(transcript, spans: list) -> dict:
    """Per clip: the text of the segments whose middle falls inside it, and whether they are
    all tagged with its language."""
    from whisper_normalizer.basic import BasicTextNormalizer

    basic = BasicTextNormalizer()

    def normalise(text: str) -> str:
        return " ".join(basic(text).split())

    clips = []
    for language, reference, start, end in spans:
        inside = [s for s in transcript.segments if start <= (s.start + s.end) / 2 < end]
        clips.append(
            {
                "language": language,
                "tagged": sorted({s.language for s in inside}),
                "in_its_language": bool(inside) and all(s.language == language for s in inside),
                "reference": normalise(reference),
                "text": normalise(" ".join(s.text for s in inside)),
            }
        )
    return {"clips": clips, "language_switches": transcript.stats.get("language_switches")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("multilingual"), description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pauses", type=float, nargs="+", default=[0.3, 0.7, 1.5, 3.0])
    parser.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    parser.add_argument("--save", action="store_true", help="also write it to bench/results")
    args = parser.parse_args(argv)
    if any(not 0 <= pause < 30 for pause in args.pauses):
        parser.error("--pauses: seconds from 0 to 30")
    torch.set_num_threads(args.threads)

    import jiwer

    from app.service import ServiceOptions, TranscriptionService

    service = TranscriptionService()
    runs, totals = [], {}
    for batch_size in args.batch_sizes:
        options = ServiceOptions(multilingual=True, batch_size=batch_size)
        clips: list[dict] = []
        for order, pieces in ORDERS.items():
            for pause in args.pauses:
                samples, spans = joined(pieces, pause)
                result = scored(service.run(samples, options), spans)
                clips += result["clips"]
                right = sum(clip["in_its_language"] for clip in result["clips"])
                runs.append(
                    {"order": order, "pause": pause, "batch_size": batch_size}
                    | {"clips_in_their_language": right, "clips": len(result["clips"])}
                    | {"language_switches": result["language_switches"]}
                )
                print(json.dumps(runs[-1]), file=sys.stderr)
        totals[f"batch_size {batch_size}"] = {
            "clips_in_their_language": sum(clip["in_its_language"] for clip in clips),
            "clips": len(clips),
            "wer": round(jiwer.wer([c["reference"] for c in clips], [c["text"] for c in clips]), 4),
            "wer_by_language": {
                language: round(
                    jiwer.wer(
                        [c["reference"] for c in clips if c["language"] == language],
                        [c["text"] for c in clips if c["language"] == language],
                    ),
                    4,
                )
                for language in sorted({c["language"] for c in clips})
            },
        }
    from bench.cli import publish

    date = datetime.date.today().isoformat()
    report = {"benchmark": "bench.multilingual", "date": date, "threads": args.threads}
    publish(report | {"runs": runs, "totals": totals}, f"multilingual-{date}.json", args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())

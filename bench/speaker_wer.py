"""Speaker-attributed WER of the whole service: cpWER (meeteval) of `specscribe transcribe
--diarize` on the multi-speaker recordings whose per-speaker words are given.

The TranscriptionService runs as the CLI runs it (default settings: whisper-base, VAD read from
the diarizer's segmentation pass, words assigned by pyannote's exclusive turns); its segments
are grouped by speaker label and scored with meeteval's concatenated minimum-permutation WER
against the reference words of each speaker. Text is normalised (Whisper's English normaliser,
as bench.diarize does) on both sides. Files:
- ami_es2004_1min_mixture (60 s, 4 speakers): references ami_es2004_1min_text/mixture.*.txt;
- pyannote_sample (30 s, 2 speakers): reference pyannote_sample.stm, words grouped by speaker.
`--word-timestamps` asks for word times in the output as the CLI flag does. The last line
printed is one JSON object.

    python -m bench.speaker_wer [--word-timestamps] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import app.config  # noqa: F401  (switches the libraries offline before they load)
from asr.types import Segment
from bench import positive_int
from bench.diarize import CPWER_FILE, MULTI, ami_reference_words, normalise, speaker_cpwer

FILES = (CPWER_FILE, "pyannote_sample")


def reference_words(name: str) -> list[str]:
    """One normalised text per reference speaker, in a fixed order."""
    if name == CPWER_FILE:
        return ami_reference_words()
    by_speaker: dict[str, list[str]] = {}
    for line in (MULTI / f"{name}.stm").read_text(encoding="utf-8").splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6:
            by_speaker.setdefault(fields[2], []).append(fields[5])
    return [normalise(" ".join(texts)) for _, texts in sorted(by_speaker.items())]


def cpwer(reference: list[str], segments: tuple[Segment, ...]) -> dict[str, float | int]:
    """cpWER of `segments`, grouped by their speaker label (None counts as one more speaker)."""
    return speaker_cpwer(reference, segments)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.speaker_wer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--word-timestamps", action="store_true")
    parser.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    parser.add_argument("--files", nargs="+", choices=FILES, default=list(FILES))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from app.service import ServiceOptions, TranscriptionService

    service = TranscriptionService()
    options = ServiceOptions(diarize=True, word_timestamps=args.word_timestamps)
    report: dict = {"benchmark": "speaker_wer", "word_timestamps": args.word_timestamps}
    for name in args.files:
        transcript = service.run(str(MULTI / f"{name}.wav"), options)
        entry = cpwer(reference_words(name), transcript.segments)
        entry["segments"] = len(transcript.segments)
        report[name] = entry
        print(f"{name}: cpWER {entry['cpwer']:.4f} ({entry['errors']} errors)", file=sys.stderr)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

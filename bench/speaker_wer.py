"""Speaker-attributed WER of the whole service: cpWER (meeteval) of `specscribe transcribe
--diarize` on the multi-speaker recordings whose per-speaker words are given.

The TranscriptionService runs as the CLI runs it (default settings: whisper-base, VAD read from
the diarizer's segmentation pass, words assigned by pyannote's exclusive turns); its segments
are grouped by speaker label and scored with meeteval's concatenated minimum-permutation WER
against the reference words of each speaker. Text is normalised (Whisper's English normaliser,
as bench.diarize does) on both sides. Files:
- ami_es2004_1min_mixture (60 s, 4 speakers): references ami_es2004_1min_text/mixture.*.txt;
- pyannote_sample (30 s, 2 speakers): reference pyannote_sample.stm, words grouped by speaker.
On those and on the ten AMI development chunks (ami_pyannote_debug/trn00..09, reference turns
only) it also counts the words whose speaker speaks at their middle in the reference RTTM
(hypothesis labels mapped to reference speakers by pyannote's optimal mapping of the turns;
words whose middle no reference speaker covers are not counted): the attribution of words
without a word-level reference. `--word-timestamps` asks for word times in the output as the
CLI flag does. The last line printed is one JSON object.

    python -m bench.speaker_wer [--word-timestamps] [--threads 2] [--files NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import app.config  # noqa: F401  (switches the libraries offline before they load)
from asr.types import Segment, SpeakerTurn
from bench import positive_int, prog
from bench.diarize import (
    CPWER_FILE,
    MULTI,
    SETS,
    ami_reference_words,
    normalise,
    speaker_cpwer,
)
from diarize.scoring import read_rttm, to_annotation

CPWER_FILES = (CPWER_FILE, "pyannote_sample")
FILES = (*CPWER_FILES, *(name.removesuffix(".flac") for name in SETS["AMI development"]))


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


def _audio(name: str) -> Path:
    for path in (MULTI / f"{name}.wav", MULTI / f"{name}.flac"):
        if path.exists():
            return path
    raise FileNotFoundError(f"no {name}.wav or .flac in {MULTI} (see ../shared/speech/README)")


def words_at_their_speaker(
    segments: tuple[Segment, ...],
    turns: tuple[SpeakerTurn, ...],
    reference: tuple[SpeakerTurn, ...],
) -> dict[str, int]:
    """How many words' speakers (mapped to the reference's by the turns' optimal mapping)
    speak at the words' middles, of the words whose middle some reference speaker covers."""
    from pyannote.metrics.diarization import DiarizationErrorRate

    mapping = DiarizationErrorRate().optimal_mapping(to_annotation(reference), to_annotation(turns))
    right = counted = 0
    for word in (w for segment in segments for w in segment.words):
        middle = (word.start + word.end) / 2
        speaking = {t.speaker for t in reference if t.start <= middle <= t.end}
        if speaking:
            counted += 1
            right += mapping.get(word.speaker) in speaking
    return {"words_at_their_speaker": right, "words_counted": counted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("speaker_wer"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--word-timestamps", action="store_true")
    parser.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    parser.add_argument("--files", nargs="+", choices=FILES, default=list(FILES))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from app.service import ServiceOptions, TranscriptionService

    service = TranscriptionService()
    options = ServiceOptions(diarize=True, word_timestamps=args.word_timestamps)
    # Words are always timed under --diarize; word_timestamps only decides whether the output
    # keeps them, so the attribution is read from a run that keeps them.
    timed = ServiceOptions(diarize=True, word_timestamps=True)
    report: dict = {"benchmark": "speaker_wer", "word_timestamps": args.word_timestamps}
    totals = {"words_at_their_speaker": 0, "words_counted": 0}
    for name in args.files:
        audio = _audio(name)
        entry: dict = {}
        if name in CPWER_FILES:
            transcript = service.run(str(audio), options)
            entry |= cpwer(reference_words(name), transcript.segments)
            print(f"{name}: cpWER {entry['cpwer']:.4f} ({entry['errors']} errors)", file=sys.stderr)
        if name not in CPWER_FILES or not args.word_timestamps:
            transcript = service.run(str(audio), timed)
        entry["segments"] = len(transcript.segments)
        reference = read_rttm(MULTI / f"{name}.rttm")
        words = words_at_their_speaker(transcript.segments, transcript.turns, reference)
        for key, value in words.items():
            totals[key] += value
        entry |= words
        report[name] = entry
        print(f"{name}: words at their speaker {words}", file=sys.stderr)
    report["words_at_their_speaker"] = totals
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

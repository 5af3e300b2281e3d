"""faster-whisper over a folder, as a user's script would run it: one process that loads the
model and transcribes every file, writing one JSON per file. The baseline of `bench.cli`.

    python -m bench.faster_whisper_folder MODEL_DIR FOLDER OUT_DIR [--compute-type int8]
        [--threads 2] [--language en] [--vad] [--batch-size N] [--beam-size N]

MODEL_DIR is a CTranslate2 Whisper directory (`ModelRegistry.pull_ct2`). Each OUT_DIR/STEM.json
holds {"text", "segments": [{"start", "end", "text"}], "generated_tokens"}. Beam 1 (`--beam-size`
N: N, faster-whisper's default being 5), temperature
fallback and thresholds as faster-whisper defaults them (OpenAI's values), timestamps on and
previous text as prompt: the same decoding `specscribe transcribe` does. `--vad` turns on
faster-whisper's own Silero VAD filter (`vad_filter=True`, its default parameters);
`--batch-size N` runs its BatchedInferencePipeline instead, which always cuts at the VAD's
pauses and decodes N pieces side by side, each without timestamps or previous text (its
defaults).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# asr.audio.AUDIO_EXTENSIONS, written out: importing the project here would time its imports
# as faster-whisper's start-up.
AUDIO_EXTENSIONS = {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".mp4", ".webm", ".aac"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.faster_whisper_folder")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("folder", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--language", default="en")
    parser.add_argument("--vad", action="store_true", help="faster-whisper's vad_filter")
    parser.add_argument("--batch-size", type=int, help="BatchedInferencePipeline, N pieces")
    parser.add_argument("--beam-size", type=int, default=1, help="beam search of N hypotheses")
    args = parser.parse_args(argv)

    from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(
        str(args.model_dir), device="cpu", compute_type=args.compute_type, cpu_threads=args.threads
    )
    options = {"language": args.language, "beam_size": args.beam_size}
    if args.batch_size:
        model = BatchedInferencePipeline(model)
        options["batch_size"] = args.batch_size
    elif args.vad:
        options["vad_filter"] = True
    args.out_dir.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in args.folder.rglob("*") if p.suffix.lower() in AUDIO_EXTENSIONS)
    for path in files:
        segments, _ = model.transcribe(str(path), **options)
        segments = list(segments)  # a generator: decoding happens here
        result = {
            "text": "".join(s.text for s in segments).strip(),
            "segments": [{"start": s.start, "end": s.end, "text": s.text} for s in segments],
            "generated_tokens": sum(len(s.tokens) for s in segments),
        }
        (args.out_dir / f"{path.stem}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""specscribe command line: `specscribe transcribe | models`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from app.config import Settings


def _print_progress(stage: str, completed: int, total: int) -> None:
    print(f"specscribe: {stage}: {completed}/{total}", file=sys.stderr, flush=True)


def _cmd_models(args: argparse.Namespace, settings: Settings) -> int:
    from asr.models import EMBEDDED, ModelRegistry

    registry = ModelRegistry(settings.cache_dir, progress=_print_progress)
    if args.action == "list":
        print(f"cache: {settings.cache_dir}")
        for name, model in EMBEDDED.items():
            state = "ready" if registry.is_ready(name) else "not fetched"
            print(f"{name:28} {model.kind:18} {state:12} {model.description} [{model.licence}]")
        return 0
    names = args.names or list(EMBEDDED)
    failed = []
    for name in names:
        path = registry.pull(name, force=args.force)
        bad = registry.verify(name)
        if bad:
            failed.append(name)
            print(f"{name}: checksum mismatch in {', '.join(bad)} (run with --force)")
        else:
            print(f"{name}: ready at {path}")
    return 1 if failed else 0


def _cmd_transcribe(args: argparse.Namespace, settings: Settings) -> int:
    from asr.audio import AudioLoadError, find_audio_files, load_audio
    from asr.models import ModelRegistry
    from asr.transcribe import TranscribeOptions, transcribe
    from asr.whisper import WhisperModel

    files = find_audio_files([Path(p) for p in args.paths])
    if not files:
        print("specscribe: no audio files found", file=sys.stderr)
        return 2
    options = TranscribeOptions(language=args.language, task=args.task)
    registry = ModelRegistry(settings.cache_dir, progress=_print_progress)
    model = WhisperModel.load(registry.resolve(args.model or settings.asr_model), settings.device)
    options.validate(model)
    failures: list[tuple[Path, str]] = []
    for path in files:
        try:
            transcript = transcribe(model, load_audio(path), options)
        except AudioLoadError as error:
            failures.append((path, str(error)))
            print(f"specscribe: skipped {error}", file=sys.stderr)
            continue
        print(f"== {path}")
        print(transcript.text, flush=True)
    print(
        f"specscribe: {len(files) - len(failures)} transcribed, {len(failures)} failed",
        file=sys.stderr,
    )
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specscribe", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    transcribe = commands.add_parser("transcribe", help="transcribe audio files and folders")
    transcribe.add_argument(
        "paths", nargs="+", help="audio files or folders (searched recursively)"
    )
    transcribe.add_argument("--model", help="embedded name, local directory or hub id")
    transcribe.add_argument("--language", help="language code (default: detected)")
    transcribe.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    transcribe.set_defaults(run=_cmd_transcribe)

    models = commands.add_parser("models", help="list or fetch the embedded models")
    models.add_argument("action", choices=("list", "pull"))
    models.add_argument("names", nargs="*", help="models to pull (default: all)")
    models.add_argument("--force", action="store_true", help="fetch and convert again")
    models.set_defaults(run=_cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    try:
        return args.run(args, settings)
    except (ValueError, RuntimeError) as error:
        print(f"specscribe: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

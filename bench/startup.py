"""One-file start-up: whole `specscribe transcribe FILE` processes against faster-whisper loading
the same whisper-base weights (int8, beam 1) in a fresh Python process and transcribing FILE.

    python -m bench.startup [FILE] [--repeats 5] [--language en] [--baseline-tree DIR]

Each round runs every command once, in turn (alternating, so a busy shared machine slows them
alike); the report gives each command's median wall-clock seconds and its ratio to
faster-whisper's. --baseline-tree DIR adds the same `specscribe transcribe` run from another
checkout (an earlier commit: `git worktree add DIR COMMIT`), for before/after figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _specscribe(tree: Path, audio: Path, out: Path, language: str | None) -> list[str]:
    """This checkout's `specscribe transcribe` as users start it; another checkout's through
    its own `app.cli.main` (run with its folder first on PYTHONPATH), since `specscribe` names
    the installed package, which is this checkout's."""
    if tree == ROOT:
        command = [sys.executable, "-m", "specscribe.cli"]
    else:
        command = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())"]
    command += ["transcribe", str(audio.resolve()), "--output-dir", str(out), "--overwrite"]
    return command + (["--language", language] if language else [])


def _faster_whisper(model_dir: Path, audio: Path, out: Path, language: str) -> list[str]:
    folder = out / "input"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / audio.name
    if not link.exists():
        link.symlink_to(audio.resolve())
    script = [sys.executable, "-m", "bench.faster_whisper_folder"]
    return [*script, str(model_dir), str(folder), str(out / "fw"), "--language", language]


def _seconds(command: list[str], tree: Path) -> float:
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    subprocess.run(command, cwd=tree, env=environment, check=True, capture_output=True)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("audio", nargs="?", type=Path, default=ROOT / "samples" / "jfk.wav")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--language", help="given to specscribe (faster-whisper: en)")
    parser.add_argument("--baseline-tree", type=Path, help="another checkout to time as well")
    args = parser.parse_args(argv)

    from app.config import Settings

    model_dir = Settings.from_env().cache_dir / "whisper-base.ct2"
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    commands = {"specscribe": (_specscribe(ROOT, args.audio, work / "new", args.language), ROOT)}
    if args.baseline_tree:
        tree = args.baseline_tree.resolve()
        command = _specscribe(tree, args.audio, work / "baseline", args.language)
        commands["specscribe (baseline tree)"] = (command, tree)
    fw_command = _faster_whisper(model_dir, args.audio, work, args.language or "en")
    commands["faster-whisper int8"] = (fw_command, ROOT)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, (command, tree) in commands.items():
            times[name].append(_seconds(command, tree))
    reference = statistics.median(times["faster-whisper int8"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        runs = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"{name:28} median {median:.2f} s  {median / reference:.2f}x  [{runs}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())

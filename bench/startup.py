"""One-file start-up: whole `specscribe transcribe FILE` processes against faster-whisper loading
the same whisper-base weights (int8, beam 1) in a fresh Python process and transcribing FILE.

    python -m bench.startup [FILE] [--repeats 5] [--threads 2] [--language en]
        [--baseline-tree DIR] [--save]

Each round runs every command once, in turn (alternating, so a busy shared machine slows them
alike); the report gives each command's median wall-clock seconds and its time as a multiple
of faster-whisper's (above 1: slower), and its last line is one JSON object (`--save` also
writes it to bench/results/startup-DATE-cpuN.json). Both sides get `--threads` threads.
--baseline-tree DIR adds the same `specscribe transcribe` run from another
checkout (an earlier commit: `git worktree add DIR COMMIT`), for before/after figures.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.config import users_environment
from bench import positive_int, prog

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "faster-whisper int8"


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


def _faster_whisper(
    model_dir: Path, audio: Path, out: Path, language: str, threads: int
) -> list[str]:
    folder = out / "input"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / audio.name
    if not link.exists():
        link.symlink_to(audio.resolve())
    script = [sys.executable, "-m", "bench.faster_whisper_folder"]
    options = ["--language", language, "--threads", str(threads)]
    return [*script, str(model_dir), str(folder), str(out / "fw"), *options]


def _seconds(command: list[str], tree: Path, threads: int) -> float:
    """The command's wall-clock seconds; RuntimeError with its stderr where it fails."""
    environment = {**users_environment(), "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        failed = f"{' '.join(command)} failed ({done.returncode})"
        raise RuntimeError(f"{failed}:\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("startup"), description=__doc__.split("\n\n")[0])
    parser.add_argument("audio", nargs="?", type=Path, default=ROOT / "samples" / "jfk.wav")
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--language", help="given to specscribe (faster-whisper: en)")
    parser.add_argument("--baseline-tree", type=Path, help="another checkout to time as well")
    parser.add_argument("--save", action="store_true", help="also write bench/results/")
    args = parser.parse_args(argv)
    if not args.audio.is_file():
        parser.error(f"not a file: {args.audio}")
    if args.baseline_tree and not (args.baseline_tree / "app" / "cli.py").is_file():
        parser.error(f"not a specscribe checkout: {args.baseline_tree}")

    from app.config import Settings
    from asr.models import ModelRegistry
    from bench.cli import publish

    model_dir = ModelRegistry(Settings.from_env().cache_dir).pull_ct2("whisper-base")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
        work = Path(folder)
        new = _specscribe(ROOT, args.audio, work / "new", args.language)
        commands = {"specscribe": (new, ROOT)}
        if args.baseline_tree:
            tree = args.baseline_tree.resolve()
            command = _specscribe(tree, args.audio, work / "baseline", args.language)
            commands["specscribe (baseline tree)"] = (command, tree)
        language = args.language or "en"
        fw_command = _faster_whisper(model_dir, args.audio, work, language, args.threads)
        commands[BASELINE] = (fw_command, ROOT)
        times: dict[str, list[float]] = {name: [] for name in commands}
        try:
            for _ in range(args.repeats):
                for name, (command, tree) in commands.items():
                    times[name].append(_seconds(command, tree, args.threads))
        except RuntimeError as error:
            print(f"bench.startup: {error}", file=sys.stderr)
            return 1
    reference = statistics.median(times[BASELINE])
    rows = {}
    for name, seconds in times.items():
        median = statistics.median(seconds)
        rows[name] = {
            "seconds": round(median, 3),
            "runs": [round(s, 3) for s in seconds],
            "time_vs_faster_whisper_int8": round(median / reference, 3),  # above 1: slower
        }
        runs = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"{name:28} median {median:.2f} s  {median / reference:.2f}x its time  [{runs}]")
    report = {
        "benchmark": "bench.startup",
        "date": datetime.date.today().isoformat(),
        "audio": args.audio.name,
        "repeats": args.repeats,
        "threads": args.threads,
        "configs": rows,
    }
    publish(report, f"startup-{report['date']}-cpu{args.threads}.json", args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())

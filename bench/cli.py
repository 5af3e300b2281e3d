"""User-level benchmark: whole `specscribe transcribe FOLDER` processes, as users run them.

Each configuration is one process per pass over a folder of real speech (`bench.asr_data.
user_files`: 59 English recordings no shipped draft trained on, short utterances and one 159 s
reading), model loading, audio decoding and output writing included, with `--language en` and
json output. The baseline is faster-whisper int8 on the same whisper-base weights, beam 1, in a
process of its own that loads the model once and transcribes every file
(`bench.faster_whisper_folder`). Passes are interleaved (every configuration once, in a rotated
order, then again); each configuration's seconds, and the timings from its decode
statistics, are medians over passes.

Per configuration: seconds, the process's peak resident memory, speed against each
faster-whisper configuration run, WER (whisper-normalizer's English normaliser, jiwer, over
every file), files whose transcript (segment times and text) equals the plain configuration of
the same precision, tokens per target call (every row of a call counted: files side by side
raise it), and two cost ratios from the decode statistics every output records: a
verification call against a plain decoder step (verify seconds per target call, drafted over
plain) and a draft step against a plain step. A plain step's price includes each window's first
call, which scores its prompt. The last line printed is one JSON object; `--save` also writes
it to bench/results.

    python -m bench.cli [--repeats 3] [--threads 2] [--configs default,plain,...]
        [--speech DIR] [--max-files N] [--joined PAUSE] [--busy-cores N] [--save]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from app.config import users_environment
from app.stop_signals import raising_on
from bench import positive_int, prog
from bench.asr_data import SPEECH, Utterance, user_files

CHECKOUT = Path(__file__).resolve().parents[1]  # the folder that holds bench/
LAUNCHER = Path(__file__).resolve().with_name("launcher.py")
RESULTS = CHECKOUT / "bench" / "results"
BASELINE = "faster-whisper int8"  # the baseline every row's `vs_faster_whisper_int8` is against
DRAFT = "whisper-base-draft"  # the draft `--assistant auto` picks for whisper-base
EAGER_STEPS = (("SPECSCRIBE_TRACED_STEPS", "0"),)
ENDINGS = (signal.SIGTERM, signal.SIGHUP)  # besides Ctrl-C, what ends a benchmark


@dataclass(frozen=True)
class Config:
    name: str
    options: tuple[str, ...]  # `specscribe transcribe` options (bench.faster_whisper_folder's)
    plain: str | None = None  # the configuration whose output this one must equal
    environment: tuple[tuple[str, str], ...] = ()  # variables set for its process


CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config("default", (), "default --assistant none"),
        Config("default --assistant none", ("--assistant", "none")),
        Config("default --no-vad", ("--no-vad",)),
        # Free heap pages kept by the process instead of handed back (app.malloc)
        Config("default (no heap trim)", (), None, (("SPECSCRIBE_HEAP_TRIM_SECONDS", "0"),)),
        # Threads that spin at every barrier whatever else runs (libgomp's default spin count,
        # which outranks the OpenMP wait policy app.cpu_load chooses beside busy cores).
        Config("default (threads spin)", (), None, (("GOMP_SPINCOUNT", "300000"),)),
        Config("plain fp32", ("--precision", "fp32", "--assistant", "none")),
        Config("draft fp32", ("--precision", "fp32", "--assistant", DRAFT), "plain fp32"),
        Config("plain int8", ("--precision", "int8", "--assistant", "none")),
        Config("draft int8", ("--precision", "int8", "--assistant", DRAFT), "plain int8"),
        *(
            Config(
                f"tree{n} int8",  # the draft's n best first tokens, each drafted on
                ("--precision", "int8", "--assistant", DRAFT, "--draft-branches", str(n)),
                "plain int8",
            )
            for n in (2, 3)
        ),
        Config(  # the second chain from prompt lookup where the window's text repeats
            "tree2+lookup int8",
            (
                "--precision",
                "int8",
                "--assistant",
                DRAFT,
                "--draft-branches",
                "2",
                "--lookup-branch",
            ),
            "plain int8",
        ),
        *(
            Config(f"{name} one file at a time", (*options, "--batch-files", "1"), plain)
            for name, options, plain in (
                ("default", (), None),
                ("plain int8", ("--precision", "int8", "--assistant", "none"), None),
                (
                    "draft int8",
                    ("--precision", "int8", "--assistant", DRAFT),
                    "plain int8 one file at a time",
                ),
            )
        ),
        # Decoder steps run eagerly rather than traced (asr.traced_step): what tracing gains.
        *(
            Config(f"{name} (eager steps)", options, plain, EAGER_STEPS)
            for name, options, plain in (
                ("default", (), None),
                (
                    "plain int8 one file at a time",
                    ("--precision", "int8", "--assistant", "none", "--batch-files", "1"),
                    None,
                ),
                ("draft fp32", ("--precision", "fp32", "--assistant", DRAFT), "plain fp32"),
                (
                    "draft int8 one file at a time",
                    ("--precision", "int8", "--assistant", DRAFT, "--batch-files", "1"),
                    "plain int8 one file at a time",
                ),
            )
        ),
        Config(BASELINE, ()),
        # As faster-whisper's users may run it: with its own Silero VAD, and batched (its
        # BatchedInferencePipeline, which cuts each file at the VAD's pauses and decodes the
        # pieces side by side, without timestamps, as its transcribe defaults to).
        Config(f"{BASELINE} vad", ("--vad",)),
        Config(f"{BASELINE} batched", ("--batch-size", "8")),
        # Ours the same way: a file's windows cut at silences, 8 decoded side by side, without
        # the previous text's prompt (for long recordings; not the default's output).
        Config("default --batch-size 8", ("--batch-size", "8")),
        # faster-whisper's default decoding, both sides: beam search of 5, and where a window
        # falls back to sampling, the best of 5 samples (its transcribe's best_of=5 default;
        # its beam-1 rows above sample 5 too).
        Config("beam5", ("--beam-size", "5", "--best-of", "5")),
        Config("default --best-of 5", ("--best-of", "5"), "default --assistant none"),
        Config(f"{BASELINE} beam5", ("--beam-size", "5")),
    )
}
# Trees, eager steps, faster-whisper's default decoding (beams, best of 5), our windows
# batched and threads that always spin run when named.
DEFAULT_CONFIGS = tuple(
    name
    for name in CONFIGS
    if not name.startswith("tree")
    and not any(
        w in name for w in ("eager", "beam", "best-of", "default --batch-size", "threads spin")
    )
)


def is_baseline(config: Config) -> bool:
    return config.name.startswith(BASELINE)


def _specscribe() -> list[str]:
    """The installed command, or the module when run from a checkout without one."""
    script = Path(sys.executable).with_name("specscribe")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "specscribe.cli"]


def _command(
    config: Config, folder: Path, out: Path, ct2_dir: Path | None, threads: int
) -> list[str]:
    if is_baseline(config):
        return [
            sys.executable,
            "-m",
            "bench.faster_whisper_folder",
            str(ct2_dir),
            str(folder),
            str(out),
            "--threads",
            str(threads),
            *config.options,
        ]
    return [
        *_specscribe(),
        "transcribe",
        str(folder),
        "--output-dir",
        str(out),
        "--format",
        "json",
        "--language",
        "en",
        *config.options,
    ]


@dataclass(frozen=True)
class Pass:
    """One process's wall-clock seconds and peak memory."""

    seconds: float
    peak_rss_mb: float  # its largest resident set, children included (wait4's ru_maxrss)


def _run(command: list[str], threads: int, environment: tuple[tuple[str, str], ...] = ()) -> Pass:
    """Runs the command through `bench/launcher.py`, which times it and reads its peak memory
    (this process's own memory would otherwise count as the command's: see there). It runs
    in the user's environment, without the OpenMP wait policy that importing app.config may
    have chosen for this process: a specscribe process chooses its own as it starts, and
    faster-whisper runs as its users run it."""
    # The baseline runs as `python -m bench.faster_whisper_folder`: the checkout holding bench/
    # goes first on its path, as `specscribe bench` runs from any folder.
    path = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))
    env = {
        **users_environment(),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": path,
        **dict(environment),
    }
    launched = [sys.executable, "-I", "-S", str(LAUNCHER), *command]
    with tempfile.TemporaryFile("w+") as stderr:
        # A session of its own: an interrupted benchmark ends the launcher and its command.
        process = subprocess.Popen(
            launched, env=env, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True
        )
        try:
            out, _ = process.communicate()
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        if process.returncode != 0:
            stderr.seek(0)
            raise RuntimeError(
                f"{' '.join(command)} failed ({process.returncode}):\n{stderr.read()[-2000:]}"
            )
    report = json.loads(out.decode().strip().splitlines()[-1])
    return Pass(report["seconds"], report["peak_rss_kb"] / 1024)  # kilobytes on Linux


def _outputs(out: Path, files: list[Utterance]) -> dict[str, dict]:
    """stem -> the json each file got (its transcript dict)."""
    return {u.name: json.loads((out / f"{u.name}.json").read_text()) for u in files}


def _segments(output: dict) -> tuple:
    return tuple((s["start"], s["end"], s["text"]) for s in output["segments"])


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


# Stats of files decoded side by side (`--batch-files`) that are their batch's, not theirs.
BATCH_STATS = ("target_calls", "draft_calls", "generated_tokens", "draft_seconds", "verify_seconds")


def _totals(stats: list[dict]) -> dict[str, float]:
    """Each numeric stat summed over the files; a batch's decoding stats (BATCH_STATS, which
    every file of a batch reports, with the batch's files in `decoded_with`) once per batch."""
    batches = set()
    total: dict[str, float] = {}
    for file_stats in stats:
        batch = tuple(file_stats.get("decoded_with", ()))
        repeated = bool(batch) and batch in batches
        batches.add(batch)
        for key, value in file_stats.items():
            if isinstance(value, int | float) and not (repeated and key in BATCH_STATS):
                total[key] = total.get(key, 0) + value
    return total


def summarise(
    configs: list[Config], files: list[Utterance], seconds: dict, outputs: dict, peaks: dict
) -> dict:
    """One row per configuration (see the module docstring). outputs[name]: per pass, stem ->
    the json each file got. Timings from the decode statistics (decoder, encoder, per call and
    per step) are medians over passes, as seconds are, with `decoder_passes` beside them: one
    disturbed pass must not make a ratio. WER is the last pass's; a drafted file counts as
    identical to plain only when it equals its plain twin's output in every pass."""
    from bench.asr import word_error_rate

    references = [u.reference for u in files]
    rows: dict[str, dict] = {}
    step_price: dict[str, float] = {}
    decoder_seconds: dict[str, float] = {}
    for config in configs:
        passes = outputs[config.name]
        row = {
            "seconds": round(median(seconds[config.name]), 2),
            "passes": [round(s, 2) for s in seconds[config.name]],
            "peak_rss_mb": round(median(peaks[config.name])),
            "wer": round(
                100 * word_error_rate(references, [passes[-1][u.name]["text"] for u in files]), 2
            ),
        }
        if not is_baseline(config):
            totals = [_totals([output[u.name]["stats"] for u in files]) for output in passes]
            row["tokens_per_target_call"] = _ratio(
                median([t["generated_tokens"] for t in totals]),
                median([t["target_calls"] for t in totals]),
            )
            row["verify_ms_per_call"] = round(
                1e3 * median([t["verify_seconds"] / t["target_calls"] for t in totals]), 2
            )
            drafted = [t for t in totals if t["draft_calls"]]
            row["draft_ms_per_step"] = (
                round(1e3 * median([t["draft_seconds"] / t["draft_calls"] for t in drafted]), 2)
                if drafted
                else None
            )
            row["encoder_seconds"] = round(median([t["encoder_seconds"] for t in totals]), 2)
            decoder = [t["verify_seconds"] + t["draft_seconds"] for t in totals]
            decoder_seconds[config.name] = median(decoder)
            row["decoder_seconds"] = round(decoder_seconds[config.name], 2)
            row["decoder_passes"] = [round(d, 2) for d in decoder]
            if not drafted:
                step_price[config.name] = row["verify_ms_per_call"]
        rows[config.name] = row
    for config in configs:
        row, plain = rows[config.name], config.plain
        if plain in rows:
            pairs = list(zip(outputs[config.name], outputs[plain], strict=False))
            same = sum(
                all(_segments(ours[u.name]) == _segments(theirs[u.name]) for ours, theirs in pairs)
                for u in files
            )
            row["identical_to_plain"] = f"{same} of {len(files)}"
            price = step_price.get(plain)
            row["verify_vs_plain_step"] = _ratio(row["verify_ms_per_call"], price)
            row["draft_step_vs_plain_step"] = _ratio(row["draft_ms_per_step"] or 0, price)
            row["decoder_speedup_vs_plain"] = _ratio(
                decoder_seconds[plain], decoder_seconds[config.name]
            )
    for baseline in (c.name for c in configs if is_baseline(c)):
        key = "vs_" + baseline.replace("-", "_").replace(" ", "_")  # vs_faster_whisper_int8...
        for row in rows.values():
            row[key] = _ratio(rows[baseline]["seconds"], row["seconds"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("cli"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help=f"comma-separated, of: {', '.join(CONFIGS)}",
    )
    parser.add_argument(
        "--speech",
        type=Path,
        default=SPEECH,
        help="a folder laid out as ../shared/speech: en_single/ and en_longform/, each audio "
        "file with its reference text beside it (NAME.txt)",
    )
    parser.add_argument(
        "--max-files", type=positive_int, help="the first N files only, in path order"
    )
    parser.add_argument(
        "--joined",
        type=float,
        metavar="PAUSE",
        help="long-form: the files joined into one recording, PAUSE seconds of silence after "
        "each (under 5 s keeps it one passage), transcribed as one file",
    )
    parser.add_argument(
        "--busy-cores",
        type=int,
        default=0,
        metavar="N",
        help="N other processes, each keeping a core busy, run beside every pass (a machine "
        "doing other work)",
    )
    parser.add_argument("--save", action="store_true", help="also write bench/results/cli-*.json")
    args = parser.parse_args(argv)
    if args.busy_cores < 0:
        parser.error(f"--busy-cores: 0 or more, not {args.busy_cores}")
    if args.joined is not None and not 0 <= args.joined < float("inf"):
        parser.error(f"--joined: a pause of 0 seconds or more, not {args.joined}")
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    if not names:
        parser.error(f"--configs names no configuration; known: {', '.join(CONFIGS)}")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    configs = [CONFIGS[n] for n in names]
    for config in list(configs):  # a drafted row needs its plain twin
        if config.plain and config.plain not in names:
            configs.append(CONFIGS[config.plain])
            names.append(config.plain)

    import app.config  # noqa: F401  (offline before anything loads)
    from app.config import Settings
    from asr.models import ModelRegistry

    try:
        files = user_files(args.speech)[: args.max_files]
        missing = [u.audio.with_suffix(".txt") for u in files if not u.has_reference]
    except OSError as error:
        parser.error(str(error))
    if missing:  # found now, not after every pass has run
        parser.error(f"no reference text for {len(missing)} files, e.g. {missing[0]}")
    # faster-whisper's files are fetched (a download, where pip has not cached them) only for
    # a run that has faster-whisper in it.
    ct2_dir = None
    if any(is_baseline(config) for config in configs):
        import importlib.util

        if importlib.util.find_spec("faster_whisper") is None:
            parser.error(
                "faster-whisper is not installed: pip install -e '.[bench]' "
                "(or leave its configurations out of --configs)"
            )
        ct2_dir = ModelRegistry(Settings.from_env().cache_dir).pull_ct2("whisper-base")
    seconds: dict[str, list[float]] = {c.name: [] for c in configs}
    peaks: dict[str, list[float]] = {c.name: [] for c in configs}
    outputs: dict[str, list[dict]] = {c.name: [] for c in configs}  # per pass
    # SIGTERM and SIGHUP end a benchmark as Ctrl-C does: the running command (in a session of
    # its own, which the terminal's signals never reach) is killed and the folder removed.
    ending_as_by_ctrl_c = raising_on(
        ENDINGS, lambda number: KeyboardInterrupt(signal.Signals(number).name)
    )
    with (
        ending_as_by_ctrl_c,
        tempfile.TemporaryDirectory(prefix="specscribe-bench-cli-") as work,
        busy_cores(args.busy_cores),
    ):
        folder = Path(work) / "speech"
        folder.mkdir()
        if args.joined is not None:
            files = [joined_recording(files, args.joined, Path(work) / "joined")]
        for utterance in files:
            (folder / utterance.audio.name).symlink_to(utterance.audio)
        audio_seconds = sum(audio_duration(u.audio) for u in files)
        for index in range(args.repeats):
            order = configs[index % len(configs) :] + configs[: index % len(configs)]
            for config in order:
                out = Path(work) / f"out-{index}-{config.name.replace(' ', '_')}"
                command = _command(config, folder, out, ct2_dir, args.threads)
                done = _run(command, args.threads, config.environment)
                seconds[config.name].append(done.seconds)
                peaks[config.name].append(done.peak_rss_mb)
                outputs[config.name].append(_outputs(out, files))
                print(f"pass {index + 1}: {config.name}: {seconds[config.name][-1]:.2f} s",
                      file=sys.stderr)  # fmt: skip
        rows = summarise(configs, files, seconds, outputs, peaks)  # references read in `work`
    for name, row in rows.items():
        shown = (k for k in row if k not in ("passes", "decoder_passes"))
        print(f"{name:22} " + "  ".join(f"{k}={row[k]}" for k in shown))
    report = {
        "benchmark": "bench.cli",
        "date": datetime.date.today().isoformat(),
        "files": len(files),
        "audio_seconds": round(audio_seconds, 1),
        "repeats": args.repeats,
        "threads": args.threads,
        **({"joined_pause_seconds": args.joined} if args.joined is not None else {}),
        **({"busy_cores": args.busy_cores} if args.busy_cores else {}),
        "configs": rows,
    }
    busy = f"-busy{args.busy_cores}" if args.busy_cores else ""
    publish(report, f"cli-{report['date']}-cpu{args.threads}{busy}.json", args.save)
    return 0


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """`count` processes, each spinning in a Python loop (a core's worth of other work), for
    the block's duration; killed as it ends, however it ends."""
    spinners = [
        subprocess.Popen([sys.executable, "-I", "-S", "-c", "while True: pass"])
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def joined_recording(files: list[Utterance], pause: float, folder: Path) -> Utterance:
    """`files` as one recording in `folder` (16 kHz mono 16-bit WAV, as decoded by
    asr.audio, `pause` seconds of digital silence after each) with their references joined
    beside it: a long-form recording whose words are all known."""
    import numpy as np
    import soundfile

    from asr.audio import SAMPLE_RATE, load_audio

    folder.mkdir()
    silence = np.zeros(round(pause * SAMPLE_RATE), dtype=np.float32)
    parts = [part for u in files for part in (load_audio(u.audio), silence)]
    audio = folder / "joined.wav"
    soundfile.write(audio, np.concatenate(parts), SAMPLE_RATE, subtype="PCM_16")
    audio.with_suffix(".txt").write_text(" ".join(u.reference for u in files) + "\n")
    return Utterance("joined", audio, True)


def audio_duration(path: Path) -> float:
    """Seconds of audio, from the container (ffprobe, as asr.audio asks it), whichever
    configurations ran."""
    import ffmpeg

    return float(ffmpeg.probe(str(path), cmd="ffprobe")["format"]["duration"])


def publish(report: dict, file_name: str, save: bool) -> None:
    """Prints the report as one JSON line, last; with `save`, also to bench/results/file_name.
    The report gains the machine it ran on (`bench.machine`)."""
    from bench.machine import describe_cpu

    line = json.dumps({**report, "machine": describe_cpu()})
    if save:
        RESULTS.mkdir(exist_ok=True)
        path = unused_path(RESULTS / file_name)
        path.write_text(line + "\n")
        print(f"saved {path}", file=sys.stderr)
    print(line)


def unused_path(path: Path) -> Path:
    """`path`, or NAME-2.json, NAME-3.json, ... beside it: a run never overwrites an earlier
    run's saved results (two runs on one day share a name)."""
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
    return candidate


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM / SIGHUP (ENDINGS)
        ending = str(stop) or "SIGINT"
        print(f"bench.cli: interrupted ({ending}); nothing saved", file=sys.stderr)
        sys.exit(128 + signal.Signals[ending].value)

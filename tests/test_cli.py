"""The specscribe command line, run in-process on real samples."""

from __future__ import annotations

import shutil

import pytest

from app.cli import main
from asr.models import EMBEDDED
from tests.conftest import SAMPLES, reference_text, word_error_rate


def test_models_list_shows_every_embedded_model(capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in EMBEDDED:
        assert name in out


def test_unknown_model_is_a_clear_error(capsys, tmp_path):
    shutil.copy(SAMPLES / "jfk.wav", tmp_path)
    assert main(["transcribe", str(tmp_path), "--model", "whisper-huge"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'whisper-huge'" in err and "whisper-base" in err


@pytest.mark.slow
def test_transcribe_prints_the_transcript(capsys):
    assert main(["transcribe", str(SAMPLES / "jfk.wav")]) == 0
    out = capsys.readouterr().out
    assert word_error_rate(reference_text(SAMPLES / "jfk.wav"), out.split("\n", 1)[1]) == 0.0


@pytest.mark.slow
def test_folder_with_a_corrupt_file_goes_on_and_exits_non_zero(capsys, tmp_path):
    shutil.copy(SAMPLES / "jfk.wav", tmp_path / "a_good.wav")
    (tmp_path / "b_corrupt.mp3").write_bytes(b"\xff\xfb" + b"\x00garbage" * 100)
    shutil.copy(SAMPLES / "librispeech_61-70968-0000.flac", tmp_path / "c_good.flac")

    assert main(["transcribe", str(tmp_path)]) == 1

    captured = capsys.readouterr()
    assert "ask not what your country can do for you" in captured.out
    assert "c_good.flac" in captured.out
    assert "b_corrupt.mp3" in captured.err
    assert "2 transcribed, 1 failed" in captured.err

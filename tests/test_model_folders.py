"""Models named by folder: faster-whisper (CTranslate2) folders, damaged or incomplete
checkpoints, weights replaced in place, drafts named as the model, empty names."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.config import Settings
from app.service import TranscriptionService
from asr.ct2_folders import is_ct2_whisper
from asr.int8_store import fingerprint
from asr.models import (
    ModelNotFoundError,
    ModelRegistry,
    _remove_abandoned_staging,
    check_model_name,
)
from asr.whisper import WhisperModel
from asr.whisper_checkpoint import read_checkpoint, weight_files


def _linked_copy(source: Path, destination: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """A folder of symbolic links to `source`'s files (no copy of the weights)."""
    destination.mkdir()
    for file in source.iterdir():
        if file.is_file() and file.name not in leave_out:
            (destination / file.name).symlink_to(file)
    return destination


def test_a_draft_or_an_empty_name_is_refused_as_the_model():
    with pytest.raises(ModelNotFoundError, match="whisper-base-draft is a draft"):
        check_model_name("whisper-base-draft", kind="whisper")
    check_model_name("whisper-base-draft")  # as an assistant it is fine
    for empty in ("", "  "):
        with pytest.raises(ModelNotFoundError, match="must not be empty"):
            check_model_name(empty)
    with pytest.raises(ModelNotFoundError) as unknown:
        check_model_name("whisper-huge", kind="whisper")
    assert "whisper-base" in str(unknown.value) and "gemma" not in str(unknown.value)


@pytest.mark.parametrize("argument", ["asr_model", "assistant_model", "device", "precision"])
def test_an_empty_model_device_or_precision_is_an_error_not_the_default(tmp_path, argument):
    settings = Settings(tmp_path, "whisper-base", "auto", "embedded", "smollm2-135m", "cpu")
    with pytest.raises(ValueError, match="must not be empty"):
        TranscriptionService(settings, **{argument: ""})


def test_weights_replaced_in_place_change_the_fingerprint(tmp_path):
    """The int8 layers' store is keyed by the weights' files, whatever their format: weights
    rewritten under the same name are quantized again, not read back stale."""
    assert weight_files(tmp_path) == []
    weights = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(2)}, weights)
    assert weight_files(tmp_path) == [weights]
    before = fingerprint(*weight_files(tmp_path))
    torch.save({"w": torch.ones(3)}, weights)
    assert fingerprint(*weight_files(tmp_path)) != before
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert weight_files(tmp_path) == [tmp_path / "model.safetensors"]  # safetensors first


def test_a_checkpoint_without_weights_or_with_cut_weights_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    with pytest.raises(ValueError, match="holds no weights"):
        read_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(ValueError, match=r"model\.safetensors cannot be read"):
        read_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json cannot be read"):
        read_checkpoint(tmp_path)


def test_a_pull_killed_midway_leaves_nothing_behind_for_long(tmp_path):
    """A staging folder whose process is gone (SIGKILL) is removed by the next pull on this
    host; one whose process still runs is left alone."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    host = socket.gethostname()
    abandoned = tmp_path / f".whisper-base-{host}.{gone.stdout.strip()}-x1y2"
    running = tmp_path / f".whisper-base-{host}.{os.getpid()}-a1b2"
    other_model = tmp_path / f".whisper-tiny.en-{host}.{gone.stdout.strip()}-c3d4"
    for folder in (abandoned, running, other_model):
        (folder / "wheels").mkdir(parents=True)
    _remove_abandoned_staging(tmp_path, "whisper-base")
    assert not abandoned.exists()
    assert running.exists() and other_model.exists()


def test_only_a_ctranslate2_whisper_folder_is_taken_for_one(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"")
    (tmp_path / "config.json").write_text(json.dumps({"lang_ids": [1], "suppress_ids": []}))
    assert is_ct2_whisper(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    assert not is_ct2_whisper(tmp_path)  # a transformers checkpoint with a stray model.bin
    (tmp_path / "config.json").write_text("[]")
    assert not is_ct2_whisper(tmp_path)


def test_a_faster_whisper_folder_missing_its_weights_is_named_as_such(tmp_path):
    """It was told it "holds no transformers config.json ... not a model checkpoint"."""
    (tmp_path / "config.json").write_text(json.dumps({"lang_ids": [1], "suppress_ids": []}))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(
        ValueError, match=r"CTranslate2 \(faster-whisper\) folder without model\.bin"
    ):
        ModelRegistry(tmp_path / "cache").resolve(str(tmp_path))


@pytest.mark.slow
def test_a_faster_whisper_folder_is_converted_once_into_the_cache(tmp_path, registry):
    """`--model FOLDER` on a faster-whisper model: converted into `<cache>/converted` on first
    use, to the same tensors as the embedded conversion of those files; read back after; made
    again (and the old conversion dropped) once a file of the folder is replaced."""
    folder = _linked_copy(registry.pull_ct2("whisper-base"), tmp_path / "faster-whisper-base")
    cache = ModelRegistry(tmp_path / "cache")
    steps = []
    cache.progress = lambda stage, done, total: steps.append((stage, done))
    converted = Path(cache.resolve(str(folder)))
    assert converted.parent == tmp_path / "cache" / "converted"
    assert len(steps) == 2
    ours = read_checkpoint(converted).tensors
    embedded = read_checkpoint(registry.resolve("whisper-base")).tensors
    assert ours.keys() == embedded.keys()
    assert all(torch.equal(ours[name], embedded[name]) for name in ours)

    assert Path(cache.resolve(str(folder))) == converted and len(steps) == 2  # read back

    config = folder / "config.json"
    text = config.read_text()
    config.unlink()
    config.write_text(text)  # the same content, a new file
    again = Path(cache.resolve(str(folder)))
    assert again != converted and len(steps) == 4
    assert not converted.exists()

    # Another project's folder of the same name keeps its conversion beside this one (each
    # had removed the other's, so both were converted at every run).
    (tmp_path / "other-project").mkdir()
    other = _linked_copy(folder, tmp_path / "other-project" / "faster-whisper-base")
    theirs = Path(cache.resolve(str(other)))
    assert theirs != again and len(steps) == 6
    assert Path(cache.resolve(str(folder))) == again and again.exists() and len(steps) == 6

    # A conversion cut short since it was made is made again, not loaded as garbage.
    weights = again / "model.safetensors"
    with open(weights, "r+b") as stream:
        stream.truncate(weights.stat().st_size // 2)
    assert Path(cache.resolve(str(folder))) == again and len(steps) == 9
    assert read_checkpoint(again).tensors.keys() == embedded.keys()


def test_a_quantized_ctranslate2_folder_gets_a_clear_error(tmp_path):
    import numpy as np

    from tests.test_ct2_reader import _write_model

    folder = tmp_path / "faster-whisper-int8"
    folder.mkdir()
    _write_model(
        folder / "model.bin",
        {
            "decoder/embeddings/weight": np.zeros((4, 2), dtype=np.int8),
            "decoder/embeddings/weight_scale": np.ones(4, dtype=np.float32),
        },
        {},
    )
    (folder / "config.json").write_text(json.dumps({"lang_ids": [], "suppress_ids": []}))
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="quantized"):
        ModelRegistry(tmp_path / "cache").resolve(str(folder))
    assert not list((tmp_path / "cache" / "converted").iterdir())  # nothing half-made


@pytest.mark.slow
def test_a_multilingual_checkpoint_without_its_generation_config_is_still_multilingual(
    tmp_path, registry, whisper_base
):
    """No generation_config.json: the vocabulary's size says multilingual (as OpenAI's code
    decides), and the language tokens come from the tokenizer."""
    folder = _linked_copy(
        Path(registry.resolve("whisper-base")), tmp_path / "base", ("generation_config.json",)
    )
    model = WhisperModel.load(folder)
    assert model.special == whisper_base.special
    assert model.special.language_ids["de"] == whisper_base.special.language_ids["de"]


@pytest.mark.slow
def test_a_tokenizer_from_another_model_is_named_as_not_fitting(tmp_path, registry):
    """whisper-base's weights with tiny.en's tokenizer.json: "the tokenizer has no <|nospeech|>
    token" named neither the folder nor the mismatch."""
    from asr.whisper import WhisperModel

    folder = _linked_copy(
        registry.pull_ct2("whisper-base"), tmp_path / "mixed", leave_out=("tokenizer.json",)
    )
    (folder / "tokenizer.json").symlink_to(
        Path(registry.resolve("whisper-tiny.en")) / "tokenizer.json"
    )
    converted = ModelRegistry(tmp_path / "cache").resolve(str(folder))
    with pytest.raises(ValueError, match=r"tokenizer\.json does not fit its weights") as raised:
        WhisperModel.load(converted)
    assert "mixed-" in str(raised.value) and "51865 tokens" in str(raised.value)

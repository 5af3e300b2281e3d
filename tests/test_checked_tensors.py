"""Tensor files the project makes in its cache are checked as they are read."""

from __future__ import annotations

import os

import torch

from asr.int8_store import Int8Store


def _damage(path) -> None:
    """Rewrites bytes in the middle of the file in place, as a disk or an interrupted copy
    may (hunt: dd over the int8 layers gave a transcript of 'lliraintsraints...ORYORY')."""
    with open(path, "r+b") as stream:
        stream.seek(os.path.getsize(path) // 2)
        stream.write(os.urandom(4096))


def test_damaged_int8_layers_are_quantized_again_rather_than_read(tmp_path):
    torch.manual_seed(0)
    weight = torch.randn(512, 384)
    path = tmp_path / "int8" / "model.safetensors"
    first = Int8Store(path, "source-1")
    made = first.linear(weight)
    first.save()
    assert (tmp_path / "int8" / ".model.safetensors.checked").is_file()

    again = Int8Store(path, "source-1").linear(weight)  # unchanged: read back
    assert torch.equal(again.weight_int8, made.weight_int8)

    _damage(path)
    store = Int8Store(path, "source-1")
    layer = store.linear(weight)
    assert torch.equal(layer.weight_int8, made.weight_int8)  # quantized again, not the damage
    store.save()  # and written again, intact
    assert torch.equal(Int8Store(path, "source-1").linear(weight).weight_int8, made.weight_int8)


def test_a_damaged_vad_network_is_made_again_from_its_archive(tmp_path):
    from asr.silero import load_silero

    path = tmp_path / "vad" / "silero.safetensors"
    made = load_silero(path).tensors()
    assert path.is_file()
    _damage(path)
    loaded = load_silero(path).tensors()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in made.items())

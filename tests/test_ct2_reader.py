"""The CTranslate2 reader on a small file written here in the documented layout."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from asr.ct2_reader import read_ct2_model


def _string(text: str) -> bytes:
    data = text.encode() + b"\0"
    return struct.pack("<H", len(data)) + data


def _write_model(path, variables: dict[str, np.ndarray], aliases: dict[str, str], version=6):
    dtype_ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.float16): 4}
    blob = struct.pack("<I", version) + _string("WhisperSpec") + struct.pack("<I", 3)
    blob += struct.pack("<I", len(variables))
    for name, array in variables.items():
        blob += _string(name) + struct.pack("<B", array.ndim)
        blob += struct.pack(f"<{array.ndim}I", *array.shape)
        raw = array.tobytes()
        blob += struct.pack("<B", dtype_ids[array.dtype]) + struct.pack("<I", len(raw)) + raw
    blob += struct.pack("<I", len(aliases))
    for alias, target in aliases.items():
        blob += _string(alias) + _string(target)
    path.write_bytes(blob)


def test_reads_variables_scalars_and_aliases(tmp_path):
    weight = np.arange(12, dtype=np.float16).reshape(3, 4)
    variables = {
        "decoder/embeddings/weight": weight,
        "decoder/num_heads": np.array(8, dtype=np.int8),
        "encoder/bias": np.array([0.5, -1.5], dtype=np.float32),
    }
    path = tmp_path / "model.bin"
    _write_model(path, variables, {"decoder/projection/weight": "decoder/embeddings/weight"})

    spec, tensors = read_ct2_model(path)

    assert spec == "WhisperSpec"
    assert tensors["decoder/embeddings/weight"].shape == (3, 4)
    assert tensors["decoder/embeddings/weight"].numpy().tolist() == weight.tolist()
    assert int(tensors["decoder/num_heads"]) == 8
    assert tensors["encoder/bias"].tolist() == [0.5, -1.5]
    assert tensors["decoder/projection/weight"] is tensors["decoder/embeddings/weight"]


def test_rejects_other_versions_and_truncation(tmp_path):
    path = tmp_path / "model.bin"
    _write_model(path, {"x": np.zeros(2, np.float32)}, {}, version=5)
    with pytest.raises(ValueError, match="version 5"):
        read_ct2_model(path)
    _write_model(path, {"x": np.zeros(2, np.float32)}, {})
    path.write_bytes(path.read_bytes()[:-6])
    with pytest.raises(ValueError, match="truncated"):
        read_ct2_model(path)

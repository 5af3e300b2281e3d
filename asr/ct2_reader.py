"""Reads CTranslate2 `model.bin` files without the ctranslate2 runtime.

Binary format (version 6, little endian): u32 version, string spec name, u32 revision,
u32 variable count, then per variable: string name, u8 rank, u32 dims[rank], u8 dtype id,
u32 byte count, raw bytes; then u32 alias count and (alias, target) string pairs.
A string is a u16 length (including a trailing NUL) followed by its bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

# CTranslate2's DataType enum.
_DTYPES = {
    0: np.float32,
    1: np.int8,
    2: np.int16,
    3: np.int32,
    4: np.float16,
}
SUPPORTED_VERSION = 6


def _read(stream: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize(fmt)
    data = stream.read(size)
    if len(data) != size:
        raise ValueError(
            f"{getattr(stream, 'name', 'model file')}: truncated CTranslate2 model file"
        )
    return struct.unpack(fmt, data)


def _read_string(stream: BinaryIO) -> str:
    (length,) = _read(stream, "<H")
    return stream.read(length)[:-1].decode("utf-8")


def read_ct2_model(path: Path) -> tuple[str, dict[str, torch.Tensor]]:
    """Returns (spec name, variables by name); aliases resolve to the same tensor."""
    variables: dict[str, torch.Tensor] = {}
    with open(path, "rb") as stream:
        (version,) = _read(stream, "<I")
        if version != SUPPORTED_VERSION:
            raise ValueError(f"{path}: CTranslate2 format version {version} is not supported")
        spec = _read_string(stream)
        _read(stream, "<I")  # spec revision
        (count,) = _read(stream, "<I")
        for _ in range(count):
            name = _read_string(stream)
            (rank,) = _read(stream, "<B")
            dims = _read(stream, f"<{rank}I") if rank else ()
            (dtype_id,) = _read(stream, "<B")
            (num_bytes,) = _read(stream, "<I")
            if dtype_id not in _DTYPES:
                raise ValueError(f"{path}: variable {name} has unsupported dtype id {dtype_id}")
            raw = stream.read(num_bytes)
            if len(raw) != num_bytes:
                raise ValueError(f"{path}: truncated CTranslate2 model file")
            array = np.frombuffer(raw, dtype=_DTYPES[dtype_id]).reshape(dims)
            variables[name] = torch.from_numpy(array.copy())
        (alias_count,) = _read(stream, "<I")
        for _ in range(alias_count):
            alias = _read_string(stream)
            variables[alias] = variables[_read_string(stream)]
    return spec, variables

"""Tensor files the project makes in its cache (int8 layers, the VAD's network), checked as
they are read: a file damaged since it was written (a copy cut short, a disk that lost a
write, an edit) is made again rather than loaded as garbage.

Each file carries the digest of its tensors in its safetensors metadata (`DIGEST`); a stamp
beside it (`.NAME.checked`) records its size and modification time when the digest last
matched, so that an unchanged file costs a stat, not a hash, at each load.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from asr.file_stamps import read_stamp, stamp_of, write_stamp

DIGEST = "digest"  # the metadata key


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of the tensors' names, dtypes, shapes and bytes."""
    digest = hashlib.blake2b(digest_size=20)
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def intact(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bool:
    """Whether `tensors`, read from `path` with `metadata`, are what was written there: the
    file is unchanged since its last check, or its tensors' digest is the one it was written
    with (then recorded as checked). A file without a digest (made before one was kept) is
    not intact."""
    expected = metadata.get(DIGEST)
    if expected is None:
        return False
    stamp = stamp_of(path)
    if stamp is not None and stamp == read_stamp(_stamp_file(path)):
        return True
    if tensors_digest(tensors) != expected:
        return False
    record_checked(path)
    return True


def record_checked(path: Path) -> None:
    """Records `path` as checked now."""
    if (stamp := stamp_of(path)) is not None:
        write_stamp(_stamp_file(path), stamp)


def _stamp_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.checked")

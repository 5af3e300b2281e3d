"""Quantize once: the int8 precision's layers saved beside the model and read back next time.

Quantizing whisper-base's decoder and head (asr.int8.Int8Linear) takes a few tenths of a second,
which every `specscribe transcribe` run would otherwise pay before its first token. A store
hands out layers in the order a model makes them (always the same: `WhisperModel.runtime` makes
the decoder's layers, then the head); layers found in its file (same order and shapes, made
from the same checkpoint file by the same quantization) are read back, the others quantized,
and the file is written again, atomically, when anything was new.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import torch

from asr.checked_tensors import DIGEST, intact, record_checked, tensors_digest
from asr.int8 import Int8Linear

# Part of every file's fingerprint: change it whenever Int8Linear quantizes differently.
FORMAT = "int8-rows-2"


def fingerprint(*weights: Path) -> str:
    """Names the checkpoint files a store was made from (each one's size and modification
    time), so that weights replaced in place are quantized again, whatever their format."""
    parts = []
    for path in weights:
        status = path.stat()
        parts.append(f"{path.name}:{status.st_size}:{status.st_mtime_ns}")
    return f"{FORMAT}:{';'.join(parts)}"


class Int8Store:
    """A LinearFactory of Int8Linear layers backed by one safetensors file."""

    def __init__(self, path: Path | None, source: str) -> None:
        """path: the store's file (None: quantize every time); source: `fingerprint(...)`."""
        self.path, self.source = path, source
        self._saved: dict[str, torch.Tensor] = {}
        if path is not None and path.is_file():
            from safetensors import SafetensorError, safe_open

            unreadable = contextlib.suppress(OSError, ValueError, RuntimeError, SafetensorError)
            with unreadable, safe_open(str(path), "pt") as stored:
                metadata = stored.metadata() or {}
                if metadata.get("source") == source:
                    saved = {name: stored.get_tensor(name) for name in stored.keys()}  # noqa: SIM118
                    # damaged since it was written: quantized again (and written again)
                    self._saved = saved if intact(path, saved, metadata) else {}
        self._made: dict[str, torch.Tensor] = {}
        self._count = 0
        self._new = False

    def linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, input_passes: int = 1
    ) -> Int8Linear:
        """Int8Linear(weight, bias, input_passes), read back when this store has it."""
        key = f"{self._count}."
        self._count += 1
        found = self._saved.get(f"{key}weight_int8")
        if found is not None and found.shape == weight.shape:
            layer = Int8Linear.from_quantized(
                found.to(weight.device),
                self._saved[f"{key}weight_scale"].to(weight.device),
                None if bias is None else bias.detach().float().clone(),
                input_passes,
            )
        else:
            layer = Int8Linear(weight, bias, input_passes)
            self._new = True
        self._made[f"{key}weight_int8"] = layer.weight_int8
        self._made[f"{key}weight_scale"] = layer.weight_scale
        return layer

    def save(self) -> None:
        """Writes the layers made so far, when some were quantized anew (best effort: a
        read-only cache only costs the next run the quantizing)."""
        if self.path is None or not self._new:
            return
        from safetensors.torch import save_file

        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, staged = tempfile.mkstemp(prefix=f".{self.path.name}-", dir=self.path.parent)
            os.close(handle)
            try:
                tensors = {k: v.contiguous().cpu() for k, v in self._made.items()}
                metadata = {"source": self.source, DIGEST: tensors_digest(tensors)}
                save_file(tensors, staged, metadata=metadata)
                os.replace(staged, self.path)
                record_checked(self.path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(staged)
        self._new = False

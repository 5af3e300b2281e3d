"""Silero VAD's 16 kHz network as plain tensor operations, its weights kept in the model cache.

The silero-vad wheel carries the network as a TorchScript archive. Loading it (`torch.jit.load`
after importing the package) and the TorchScript interpreter's first, profiling run of each
scripted part cost a one-file `specscribe transcribe` about as much as the detection itself
(on the 2-core CPU, 1 thread: 0.17-0.20 s for the first encoder call against 0.05-0.10 s
eagerly). So the archive is read once, its tensors are saved beside the other cached models,
and the same operations run eagerly: the same aten kernels on the same tensors, so the
probabilities are the same bits (`tests/test_vad.py` checks them against the archive's modules).
The wheel's own silero_vad_16k.safetensors holds other weights than its archive, so it is not
used.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from asr.checked_tensors import DIGEST, intact, record_checked, tensors_digest

# The archive's STFT: a 256-point real transform as a convolution, hop 128, the frame's last
# 64 samples reflected on its right.
FILTER_LENGTH = 256
HOP_LENGTH = 128
REFLECT = 64
ENCODER_STRIDES = (1, 2, 2, 1)  # its four convolutions' (kernel 3, padding 1)
FORMAT = "silero-16k-1"  # part of a saved file's fingerprint: change with what is saved


@dataclass(frozen=True)
class SileroNetwork:
    """stft_basis: (258, 1, 256); convolutions: four (weight, bias); lstm: the decoder's cell as
    a one-layer nn.LSTM (one call over a whole sequence); head: the final 1x1 convolution."""

    stft_basis: torch.Tensor
    convolutions: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    lstm: torch.nn.LSTM
    head: tuple[torch.Tensor, torch.Tensor]

    @classmethod
    def of_tensors(cls, tensors: dict[str, torch.Tensor]) -> SileroNetwork:
        """tensors: named as `tensors()` names them."""
        cell = [
            tensors[f"lstm.{name}"] for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ]
        lstm = torch.nn.LSTM(cell[0].shape[1], cell[1].shape[1])
        with torch.no_grad():
            for parameter, value in zip(lstm.parameters(), cell, strict=True):
                parameter.copy_(value)
        return cls(
            tensors["stft_basis"],
            tuple((tensors[f"conv{i}.weight"], tensors[f"conv{i}.bias"]) for i in range(4)),
            lstm.eval(),
            (tensors["head.weight"], tensors["head.bias"]),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        cell = dict(zip(names, self.lstm.parameters(), strict=True))
        return {
            "stft_basis": self.stft_basis,
            **{f"conv{i}.weight": weight for i, (weight, _) in enumerate(self.convolutions)},
            **{f"conv{i}.bias": bias for i, (_, bias) in enumerate(self.convolutions)},
            **{f"lstm.{name}": value.detach() for name, value in cell.items()},
            "head.weight": self.head[0],
            "head.bias": self.head[1],
        }

    def features(self, frames: torch.Tensor) -> torch.Tensor:
        """frames: Tensor, shape = (n, 576), float32 -> Tensor, shape = (n, 128, 1): the
        archive's `encoder(stft(frames))`."""
        padded = F.pad(frames, [0, REFLECT], "reflect").unsqueeze(1)
        transform = F.conv1d(padded, self.stft_basis, None, [HOP_LENGTH], [0])
        cutoff = FILTER_LENGTH // 2 + 1
        real, imaginary = transform[:, :cutoff], transform[:, cutoff:]
        states = torch.sqrt(real.pow(2) + imaginary.pow(2))
        for (weight, bias), stride in zip(self.convolutions, ENCODER_STRIDES, strict=True):
            states = F.relu(F.conv1d(states, weight, bias, stride, 1))
        return states

    def probability(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: Tensor, shape = (n, 128, 1), the LSTM's states -> Tensor, shape = (n, 1, 1):
        the archive's `decoder.decoder` (dropout is the identity in inference)."""
        return torch.sigmoid(F.conv1d(F.relu(hidden), *self.head))


def load_silero(cache: Path | None = None) -> SileroNetwork:
    """The network, from `cache` when it holds the tensors of the installed wheel's archive,
    otherwise from the archive (then saved to `cache`, best effort)."""
    archive = _archive()
    source = f"{FORMAT}:{archive.stat().st_size}:{archive.stat().st_mtime_ns}"
    if cache is not None and cache.is_file():
        from safetensors import SafetensorError, safe_open

        unreadable = contextlib.suppress(OSError, ValueError, RuntimeError, SafetensorError)
        with unreadable, safe_open(str(cache), "pt") as stored:
            metadata = stored.metadata() or {}
            if metadata.get("source") == source:
                tensors = {k: stored.get_tensor(k) for k in stored.keys()}  # noqa: SIM118
                if intact(cache, tensors, metadata):  # else damaged: made again
                    return SileroNetwork.of_tensors(tensors)
    network = _of_archive()
    if cache is not None:
        _save(network, cache, source)
    return network


def _archive() -> Path:
    """The wheel's TorchScript file, found without importing silero_vad (its import sets
    torch's thread count to 1)."""
    from importlib.util import find_spec

    spec = find_spec("silero_vad")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("silero-vad is not installed: pip install silero-vad")
    return Path(spec.origin).parent / "data" / "silero_vad.jit"


def _of_archive() -> SileroNetwork:
    import warnings

    threads = torch.get_num_threads()
    try:
        from silero_vad import load_silero_vad  # its import sets torch.set_num_threads(1)

        with warnings.catch_warnings():  # its loader's deprecated importlib and jit calls
            warnings.simplefilter("ignore", DeprecationWarning)
            model = load_silero_vad(onnx=False)._model  # the 16 kHz network
    finally:
        torch.set_num_threads(threads)
    convolutions = [getattr(model.encoder, str(i)).reparam_conv for i in range(4)]
    if [c.stride[0] for c in convolutions] != list(ENCODER_STRIDES) or (
        model.stft.hop_length,
        model.stft.filter_length,
    ) != (HOP_LENGTH, FILTER_LENGTH):
        raise ValueError("this silero-vad's network differs from the one asr.silero runs")
    cell, head = model.decoder.rnn, getattr(model.decoder.decoder, "2")
    tensors = {
        "stft_basis": model.stft.forward_basis_buffer,
        **{f"conv{i}.weight": c.weight for i, c in enumerate(convolutions)},
        **{f"conv{i}.bias": c.bias for i, c in enumerate(convolutions)},
        **{f"lstm.{name}": getattr(cell, name) for name in ("weight_ih", "weight_hh")},
        **{f"lstm.{name}": getattr(cell, name) for name in ("bias_ih", "bias_hh")},
        "head.weight": head.weight,
        "head.bias": head.bias,
    }
    return SileroNetwork.of_tensors({k: v.detach().clone() for k, v in tensors.items()})


def _save(network: SileroNetwork, path: Path, source: str) -> None:
    """Writes the tensors atomically; a read-only cache only costs the next run the archive."""
    from safetensors.torch import save_file

    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staged = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        os.close(handle)
        try:
            tensors = {k: v.contiguous() for k, v in network.tensors().items()}
            save_file(tensors, staged, metadata={"source": source, DIGEST: tensors_digest(tensors)})
            os.replace(staged, path)
            record_checked(path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)

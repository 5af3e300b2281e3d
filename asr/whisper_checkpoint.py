"""A Whisper checkpoint directory read as plain tensors, without transformers.

Transcription needs a checkpoint's configuration, its tensors, its tokenizer and the mel filters
of its feature extractor. transformers builds all four through machinery that costs a
`specscribe transcribe` run seconds of imports, so they are read here from the files a
transformers checkpoint holds (config.json, generation_config.json, model.safetensors,
tokenizer.json). A checkpoint without a safetensors file (an old `pytorch_model.bin`) is read
through transformers instead; hub ids are fetched into the hub cache first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from asr.audio import SAMPLE_RATE

N_FFT = 400

# transformers' WhisperConfig defaults for the fields transcription reads, for config.json
# files that leave some out.
_CONFIG_DEFAULTS = {
    "vocab_size": 51865,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "activation_function": "gelu",
    "scale_embedding": False,
    "architectures": None,
}


class Tensors(dict):
    """name -> Tensor, of which some may be released: dropped from memory where no runtime
    reads them (a quantized decoder's float32 weights, a packed encoder's unpacked ones) and
    read back from the checkpoint's file, converted as they were, when asked for again.

    Any whole view (iteration, keys, items, values, len) reads every released tensor back
    first, so code that builds something from all the tensors (a runtime of another kind,
    transformers' module) sees the checkpoint whole; a released tensor asked for by name is
    read back alone. What is read back must be what was released (a checksum of its bits):
    a model file changed since raises ValueError rather than mixing two models' weights. A
    checkpoint without a `reload` releases nothing."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        reload: Callable[[list[str]], dict[str, torch.Tensor]] | None = None,
    ) -> None:
        super().__init__(tensors)
        self._reload = reload
        self._released: dict[str, int] = {}  # name -> checksum of what was released

    def release(self, names: Iterable[str]) -> int:
        """Drops these tensors (those held), to be read back on use; the bytes dropped."""
        if self._reload is None:
            return 0
        dropped = 0
        for name in names:
            tensor = dict.pop(self, name, None)
            if tensor is not None:
                self._released[name] = checksum(tensor)
                dropped += tensor.numel() * tensor.element_size()
        return dropped

    @property
    def released(self) -> frozenset[str]:
        return frozenset(self._released)

    def names(self) -> set[str]:
        """Every tensor's name, released or not (reading none back)."""
        return set(dict.keys(self)) | set(self._released)

    def restore(self, names: Iterable[str] | None = None) -> None:
        """Reads these released tensors back (None: all of them)."""
        wanted = set(self._released) if names is None else set(self._released) & set(names)
        if not wanted or self._reload is None:
            return
        read = self._reload(sorted(wanted))
        changed = sorted(name for name in wanted if checksum(read[name]) != self._released[name])
        if changed:
            raise ValueError(
                f"the model's weights on disk changed since it was loaded ({changed[0]}): "
                "load the model again"
            )
        dict.update(self, read)
        for name in wanted:
            del self._released[name]

    def __missing__(self, name: str) -> torch.Tensor:
        if name not in self._released:
            raise KeyError(name)
        self.restore([name])
        return dict.__getitem__(self, name)

    def __iter__(self):
        self.restore()
        return super().__iter__()

    def __len__(self) -> int:
        self.restore()
        return super().__len__()

    def __contains__(self, name: object) -> bool:
        return name in self._released or super().__contains__(name)

    def keys(self):
        self.restore()
        return super().keys()

    def items(self):
        self.restore()
        return super().items()

    def values(self):
        self.restore()
        return super().values()

    def get(self, name, default=None):
        try:
            return self[name]  # a released one read back
        except KeyError:
            return default


def checksum(tensor: torch.Tensor) -> int:
    """A sum of a sample of a tensor's bit patterns (every CHECKSUM_STRIDE-th, and the last):
    other weights (another model's file) change it. A sample, as it is taken at every load:
    all of whisper-base's released weights cost 29 ms in full, about 4 ms sampled."""
    integers = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    bits = tensor.detach().reshape(-1).view(integers[tensor.element_size()])
    if not len(bits):
        return 0
    return int(bits[::CHECKSUM_STRIDE].sum(dtype=torch.int64)) + int(bits[-1])


CHECKSUM_STRIDE = 251


def file_reader(
    file: Path, convert: Callable[[str, torch.Tensor], torch.Tensor]
) -> Callable[[list[str]], dict[str, torch.Tensor]]:
    """Reads named tensors from one safetensors file, each through convert(name, tensor) (the
    device and dtype they were loaded in). ValueError where the file is gone or unreadable."""

    def read(names: list[str]) -> dict[str, torch.Tensor]:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(file), "pt") as stored:
                return {name: convert(name, stored.get_tensor(name)) for name in names}
        except (OSError, SafetensorError) as error:
            raise ValueError(
                f"{file}: the model's weights cannot be read back ({error}): load the model again"
            ) from None

    return read


@dataclass(frozen=True)
class Checkpoint:
    """config: config.json's fields as attributes; generation: generation_config.json;
    tensors: name -> Tensor, transformers' names ("model.decoder.layers.0.fc1.weight"), in
    the dtypes asked for (`read_checkpoint`); `Tensors` where some may be released."""

    path: Path
    config: SimpleNamespace
    generation: dict
    tensors: dict[str, torch.Tensor]

    def release(self, names: Iterable[str]) -> int:
        """Drops these tensors from memory until asked for again (`Tensors.release`); the
        bytes dropped (none where the tensors cannot be read back)."""
        if not isinstance(self.tensors, Tensors):
            return 0
        return self.tensors.release(names)

    @property
    def released(self) -> frozenset[str]:
        """The names of the tensors released (`release`) and not read back since."""
        tensors = self.tensors
        return tensors.released if isinstance(tensors, Tensors) else frozenset()

    def names(self) -> set[str]:
        """Every tensor's name, reading none that was released back."""
        tensors = self.tensors
        return tensors.names() if isinstance(tensors, Tensors) else set(tensors)

    @property
    def has_encoder(self) -> bool:
        return "model.encoder.conv1.weight" in self.tensors

    def with_prefix(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors under `prefix` ("model.decoder."), named without it (released ones
        under it read back, the others left released)."""
        names = sorted(name for name in self.names() if name.startswith(prefix))
        return {name[len(prefix) :]: self.tensors[name] for name in names}

    @property
    def output_weight(self) -> torch.Tensor:
        """The output head, Tensor, shape = (vocab, d_model): tied to the token embeddings."""
        return self.tensors.get(
            "proj_out.weight", self.tensors["model.decoder.embed_tokens.weight"]
        )


def config_namespace(fields: dict) -> SimpleNamespace:
    return SimpleNamespace(**{**_CONFIG_DEFAULTS, **fields})


def local_directory(path: str | Path) -> Path:
    """`path` itself when it is a directory; otherwise a hub id, resolved through the hub
    cache (HF_HUB_OFFLINE decides whether it may download). Raises ValueError for a hub id
    that cannot be had: not cached while offline, not found, gated, or the network down."""
    if Path(path).is_dir():
        return Path(path)
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model"]
    try:
        directory = Path(snapshot_download(str(path), allow_patterns=patterns))
        if not weight_files(directory):  # an older checkpoint: PyTorch pickles only
            directory = Path(snapshot_download(str(path), allow_patterns=["pytorch_model*.bin"]))
        return directory
    except (OSError, ValueError) as error:  # the hub's errors are both kinds
        from huggingface_hub import constants

        hint = (
            "it is not in the hub cache and the hub is off (HF_HUB_OFFLINE=0 allows downloads)"
            if constants.HF_HUB_OFFLINE
            else f"the hub could not be reached or has no such model ({type(error).__name__})"
        )
        raise ValueError(f"{path} is neither a folder nor a model to be had: {hint}") from error


# A checkpoint's weights, in the order they are looked for: one safetensors file, safetensors
# shards, then PyTorch's pickles (older fine-tunes), whole or sharded.
_WEIGHT_PATTERNS = (
    "model.safetensors",
    "model-*-of-*.safetensors",
    "pytorch_model.bin",
    "pytorch_model-*-of-*.bin",
)


def weight_files(directory: Path) -> list[Path]:
    """The files that hold a checkpoint directory's weights (the first format found); empty
    when it holds none."""
    for pattern in _WEIGHT_PATTERNS:
        if found := sorted(directory.glob(pattern)):
            return found
    return []


def read_checkpoint(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    encoder_dtype: torch.dtype | None = None,
) -> Checkpoint:
    """A checkpoint's tensors on `device` in `dtype` (the encoder's in encoder_dtype).
    Raises ValueError, naming the file, where a file is missing or cannot be read."""
    directory = local_directory(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} holds no config.json: not a transformers checkpoint")
    config = read_json(config_file)
    generation_file = directory / "generation_config.json"
    generation = read_json(generation_file) if generation_file.is_file() else {}
    weights = weight_files(directory)
    if not weights:
        raise ValueError(
            f"{path} holds no weights: neither model.safetensors nor pytorch_model.bin"
        )
    if weights == [directory / "model.safetensors"]:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            stored = load_file(str(weights[0]))
        except (SafetensorError, OSError) as error:
            damaged = f"{weights[0]} cannot be read ({error}): damaged or cut short"
            raise ValueError(damaged) from None
    else:
        stored = _tensors_through_transformers(directory)
    encoder_dtype = encoder_dtype or dtype

    def convert(name: str, tensor: torch.Tensor) -> torch.Tensor:
        kind = encoder_dtype if name.startswith("model.encoder.") else dtype
        return tensor.to(device=device, dtype=kind)

    tensors = Tensors(
        {name: convert(name, tensor) for name, tensor in stored.items()},
        file_reader(weights[0], convert) if weights == [directory / "model.safetensors"] else None,
    )
    return Checkpoint(directory, config_namespace(config), generation, tensors)


def read_json(path: Path) -> dict:
    """A checkpoint's JSON file as a dict; ValueError, naming the file, if it is no JSON object."""
    try:
        read = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} cannot be read: {error}") from None
    if not isinstance(read, dict):
        raise ValueError(f"{path} holds no JSON object")
    return read


def _tensors_through_transformers(directory: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForSpeechSeq2Seq

    try:
        model = AutoModelForSpeechSeq2Seq.from_pretrained(str(directory))
    except (OSError, RuntimeError, ValueError) as error:  # a pickle or shard that fails to load
        raise ValueError(f"{directory}: its weights cannot be read: {error}") from None
    return dict(model.state_dict())


def mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> torch.Tensor:
    """The Slaney-style mel filter bank Whisper's feature extractor uses (librosa's
    `filters.mel(htk=False, norm="slaney")`, as OpenAI's mel_filters.npz holds it).

    Returns Tensor, shape = (n_mels, n_fft // 2 + 1), float32.
    """
    frequencies = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    mels = np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2)
    edges = np.array([_mel_to_hz(m) for m in mels])
    widths = np.diff(edges)
    ramps = edges[:, None] - frequencies[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]  # equal area per filter
    return torch.from_numpy(weights.astype(np.float32))


# Slaney's mel scale: linear below 1 kHz, logarithmic above.
_LINEAR_HZ_PER_MEL = 200.0 / 3
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _LINEAR_HZ_PER_MEL
_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz < _LOG_START_HZ:
        return hz / _LINEAR_HZ_PER_MEL
    return _LOG_START_MEL + math.log(hz / _LOG_START_HZ) / _LOG_STEP


def _mel_to_hz(mel: float) -> float:
    if mel < _LOG_START_MEL:
        return mel * _LINEAR_HZ_PER_MEL
    return _LOG_START_HZ * math.exp(_LOG_STEP * (mel - _LOG_START_MEL))

"""Precision settled in one place: (device, precision name) -> the torch dtype models load in.

- "auto": "int8" on CPUs that have oneDNN's int8 kernels (x86), float32 on other CPUs, "mixed"
  on CUDA: drafting is lossless in all three, and each is the fastest lossless choice measured
  where it applies (docs/decoder-runtime.md#precisions). Where the CPU lacks native bfloat16
  the int8 precision's encoder stays in float32 (emulated bfloat16 is slower than float32).
- "fp32": everywhere.
- "bf16": CPU (fast where the CPU has AVX512-BF16 or AMX; emulated, and slower, elsewhere) and
  CUDA devices that support it (Ampere and later).
- "mixed": the encoder in half precision (bf16 on CPU, fp16 on CUDA), the decoder in float32:
  the encoder, most of the work for short files, gains the most from half precision, and a
  float32 decoder keeps speculative decoding token-for-token lossless.
- "int8": CPU only. The encoder in bf16 (fp32 where the CPU lacks native bf16), the decoder's
  linear layers and output head in int8 (`asr.int8`: a scale per weight row, the input
  quantized per row, as faster-whisper's int8 does), run by `asr.static_decoder`, whose every
  output row is computed the same way whatever else the call holds, so drafting and batching
  stay token-for-token lossless against plain int8 decoding.
- "fp16": CUDA only; refused on CPU, where x86 CPUs without AVX512-FP16/AMX-FP16 have no fp16
  arithmetic (bfloat16 is the CPU's half format).

Logits always leave the model in at least float32 (`asr.whisper.WhisperModel.logits`), so the
logit rules, verification and log-probabilities never run in half precision.

Contract on losslessness: drafted greedy output equals plain greedy output in "fp32", "int8"
and "mixed". In "bf16" and "fp16" decoders a position's logits depend on how many tokens the
call scores (kernels accumulate in another order for another block width), so where two tokens
are nearly tied the drafted output can differ from plain greedy; `bench.asr` counts the files
where it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Precision = Literal["auto", "fp32", "bf16", "fp16", "mixed", "int8"]
PRECISIONS: tuple[Precision, ...] = ("auto", "fp32", "bf16", "fp16", "mixed", "int8")
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class Dtypes:
    """The dtypes a Whisper runs its encoder and its decoder in; int8_decoder: the decoder's
    linear layers and head in int8 (activations in `decoder`'s dtype)."""

    encoder: torch.dtype
    decoder: torch.dtype
    int8_decoder: bool = False

    @property
    def name(self) -> str:
        decoder = "int8" if self.int8_decoder else precision_name(self.decoder)
        if self.encoder == self.decoder and not self.int8_decoder:
            return decoder
        return f"{precision_name(self.encoder)} encoder, {decoder} decoder"


def resolve_precision(device: str | torch.device, precision: str = "auto") -> Dtypes:
    """The encoder's and the decoder's dtype on `device` for a precision name."""
    if precision == "auto":
        if _kind(device) == "cuda":
            precision = "mixed"
        elif cpu_has_int8_kernels():
            precision = "int8"
    if precision == "mixed":
        half = resolve_dtype(device, "fp16" if _kind(device) == "cuda" else "bf16")
        return Dtypes(encoder=half, decoder=torch.float32)
    if precision == "int8":
        resolve_dtype(device, "int8")  # refuses CUDA
        encoder = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
        return Dtypes(encoder=encoder, decoder=torch.float32, int8_decoder=True)
    dtype = resolve_dtype(device, precision)
    return Dtypes(encoder=dtype, decoder=dtype)


def cpu_has_int8_kernels() -> bool:
    """Whether this CPU runs `asr.int8`'s kernels (oneDNN's quantized linear, x86 only)."""
    return "onednn" in torch.backends.quantized.supported_engines


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bfloat16 arithmetic (AVX512-BF16 or AMX); elsewhere oneDNN emulates
    it, slower than float32."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def check_device(device: str) -> str:
    """`device` when torch knows it and this machine has it (cpu, or cuda[:N] with a GPU there);
    ValueError otherwise, before any model is sent to it."""
    kind = _kind(device)
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: expected cpu or cuda[:N]")
    if kind == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = torch.device(device).index or 0
        if index >= available:
            raise ValueError(
                f"device {device!r}: torch sees {available} CUDA device(s) here "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda or 'not built in'})"
            )
    return device


def _kind(device: str | torch.device) -> str:
    try:
        return torch.device(device).type
    except RuntimeError:  # torch's message lists twenty device types none of which runs here
        raise ValueError(f"unknown device {device!r}: expected cpu or cuda[:N]") from None


def resolve_dtype(device: str | torch.device, precision: str = "auto") -> torch.dtype:
    """The dtype for weights and activations of a model on `device` ("cpu", "cuda", "cuda:1");
    for "mixed" (and "auto" on CUDA, which is "mixed"), the decoder's: float32.

    Raises ValueError naming the device and precision when the pair is unknown or unsupported.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    kind = _kind(device)
    if precision == "int8" and kind != "cpu":
        raise ValueError(
            f"precision int8 on device {device} is not supported: its int8 decoder runs on "
            "CPU (torch._int_mm); use fp16 or mixed on CUDA"
        )
    if precision in ("auto", "mixed", "int8"):
        return torch.float32
    if kind == "cpu" and precision == "fp16":
        raise ValueError(
            "precision fp16 on device cpu is not supported: CPUs without AVX512-FP16/AMX-FP16 "
            "have no fp16 arithmetic, so it runs slower than fp32; use bf16 (or fp32) on CPU"
        )
    if kind == "cuda" and precision == "bf16" and not _cuda_supports_bf16(device):
        raise ValueError(
            f"precision bf16 on device {device}: this GPU has no bfloat16 support "
            "(needs compute capability 8.0 or later); use fp16"
        )
    return DTYPES[precision]


def precision_name(dtype: torch.dtype) -> str:
    """The name ("fp32", "bf16", "fp16") of a dtype `resolve_dtype` returns; others: str(dtype)."""
    return next((name for name, known in DTYPES.items() if known == dtype), str(dtype))


def _cuda_supports_bf16(device: str | torch.device) -> bool:
    if not torch.cuda.is_available():
        return True  # loading will fail with CUDA's own, clearer error
    with torch.cuda.device(torch.device(device)):
        return torch.cuda.is_bf16_supported()


def int8_draft_supported(draft) -> bool:
    """Whether `quantize_draft` can run this draft: fbgemm's int8 kernels take float32 on CPU,
    so a draft in a half-precision target's dtype (it borrows the target's embeddings) cannot."""
    return draft.dtype == torch.float32 and draft.device.type == "cpu"


def quantize_draft(draft) -> None:
    """Runs a draft Whisper (an `asr.whisper.WhisperModel`) in int8 on CPU: its decoder layers
    and its output head (`asr.int8.dynamic_int8_linear`, fbgemm).

    Verification makes any draft lossless, whatever its precision, so a draft may trade a little
    agreement with the target for speed. A draft step on this CPU is bound by reading weights,
    and int8 reads a quarter of the bytes. The embeddings stay as they are (the target's); so do
    the cross-attention keys and values (the target's, computed once per window).
    """
    if not int8_draft_supported(draft):
        raise ValueError(
            f"an int8 draft needs a float32 decoder on CPU, not {precision_name(draft.dtype)} "
            f"on {draft.device}"
        )
    draft.use_linear_kind("dynamic-int8")

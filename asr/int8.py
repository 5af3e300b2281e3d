"""Int8 linear layers whose every output row depends on its own input row alone.

A decoder step on this CPU is bound by reading weights: whisper-base's decoder reads 88 MB of
float32 layer weights and a 106 MB output head per call. Int8 weights read a quarter of that,
and `torch._int_mm` multiplies int8 by int8 into int32 several times faster than float32 GEMM
for the handful of rows a decoder call scores (whisper-base, 2 threads, caches flushed: the
51865 x 512 head, 1 row, 0.9 ms against 3.9 ms; a 2048 x 512 layer 50-130 us against 350-415).

The layout is what CTranslate2 (faster-whisper's int8) uses: one scale per weight row, and the
input quantized per row on the fly. That second choice is what makes it usable for speculative
decoding. torch.ao's dynamic quantization scales the whole input block with one number, so a
row's output would change with the other rows in the call, and a position would score
differently alone than in a drafted block. Here a row's scale comes from that row, and integer
sums are exact in any order, so a row's output is the same bits in a call of 1 row or of 17:
verification sees exactly what plain decoding sees.
"""

from __future__ import annotations

import torch

_LEVELS = 127  # symmetric int8: -127..127 (no -128, so negation stays exact)
_TINY = 1e-12  # an all-zero row gets this scale instead of dividing by zero


def _quantize_rows(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values: Tensor, shape = (rows, n), float -> int8 values and float32 scales (rows, 1)."""
    scales = values.abs().amax(dim=1, keepdim=True).float().clamp(min=_TINY) / _LEVELS
    quantized = (values.float() / scales).round_().clamp_(-_LEVELS, _LEVELS).to(torch.int8)
    return quantized, scales


class Int8Linear(torch.nn.Module):
    """x @ weight.T + bias with the weight in int8 (a scale per output feature) and x quantized
    to int8 per row; float32 out. CPU only (`torch._int_mm`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        quantized, scales = _quantize_rows(weight.detach())
        self.register_buffer("weight_int8", quantized)  # (out_features, in_features)
        self.register_buffer("weight_scale", scales.reshape(-1))  # (out_features,)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]

    @classmethod
    def of(cls, linear: torch.nn.Linear) -> Int8Linear:
        return cls(linear.weight, linear.bias)

    def float_state(self) -> dict[str, torch.Tensor]:
        """nn.Linear's state dict for the weight this layer holds (dequantized) and its bias."""
        state = {"weight": self.weight_int8.float() * self.weight_scale[:, None]}
        if self.bias is not None:
            state["bias"] = self.bias
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: Tensor, shape = (..., in_features) -> Tensor, shape = (..., out_features)."""
        flat = x.reshape(-1, self.in_features)
        quantized, scales = _quantize_rows(flat)
        # The transposed view of the stored weight is the faster operand for few rows.
        products = torch._int_mm(quantized, self.weight_int8.T)
        out = products.float() * (scales * self.weight_scale)
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(module: torch.nn.Module) -> torch.nn.Module:
    """Replaces every nn.Linear inside `module` with an Int8Linear, in place; returns it."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear.of(child))
        else:
            quantize_linears(child)
    return module

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
    to int8 per row; float32 out. CPU only (`torch._int_mm`).

    input_passes=2 quantizes each input row twice: the row, then its rounding error, both
    multiplied in one `_int_mm` of twice the rows. The input then carries about 15 bits instead
    of 8 for nearly the same time, since a call of a few rows is bound by reading the weight.
    Whisper's output head wants it: teacher-forced on the benchmark's 21 windows (826 tokens),
    its KL to the float32 decoder went from 0.0041 to 0.0021 nats per token, the remainder
    coming from the int8 weights and layers.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, input_passes: int = 1
    ) -> None:
        super().__init__()
        if input_passes not in (1, 2):
            raise ValueError(f"input_passes is 1 or 2, not {input_passes}")
        self.input_passes = input_passes
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
        if self.input_passes == 1:
            out = self._products(quantized) * (scales * self.weight_scale)
        else:
            residual, residual_scales = _quantize_rows(flat.float() - quantized.float() * scales)
            if flat.shape[0] == 1:  # _int_mm has a fast path for one row: 2 x 1 row beats 2 rows
                first, second = self._products(quantized), self._products(residual)
            else:
                both = self._products(torch.cat([quantized, residual]))
                first, second = both[: flat.shape[0]], both[flat.shape[0] :]
            out = (first * scales + second * residual_scales) * self.weight_scale
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _products(self, quantized: torch.Tensor) -> torch.Tensor:
        """Exact int32 products of int8 rows with the weight, as float32."""
        # The transposed view of the stored weight is the faster operand for few rows.
        return torch._int_mm(quantized, self.weight_int8.T).float()

    def extra_repr(self) -> str:
        passes = f", input_passes={self.input_passes}" if self.input_passes != 1 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8{passes}"


def quantize_linears(module: torch.nn.Module) -> torch.nn.Module:
    """Replaces every nn.Linear inside `module` with an Int8Linear, in place; returns it."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear.of(child))
        else:
            quantize_linears(child)
    return module


def dynamic_int8_layers(module: torch.nn.Module, inplace: bool = False) -> torch.nn.Module:
    """`module` with every nn.Linear quantized by torch.ao's dynamic quantization (fbgemm: int8
    weights with a scale per tensor, the whole input block quantized with one scale on the fly);
    a quantized copy unless `inplace`. A call's rows depend on each other, so this is for drafts,
    whose proposals verification checks, never for a target."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice; the API still works
        return torch.ao.quantization.quantize_dynamic(
            module, {torch.nn.Linear}, dtype=torch.qint8, inplace=inplace
        )


def dynamic_int8_linear(weight: torch.Tensor) -> torch.nn.Module:
    """x @ weight.T through `dynamic_int8_layers`: float32 in and out."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data = weight.detach().float()
    # torch.ao swaps the children of the module it is given, not the module itself
    return dynamic_int8_layers(torch.nn.Sequential(linear))[0]

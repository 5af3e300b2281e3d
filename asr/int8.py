"""Int8 linear layers whose every output row depends on its own input row alone.

A decoder step on this CPU is bound by reading weights: whisper-base's decoder reads 88 MB of
float32 layer weights and a 106 MB output head per call. Int8 weights read a quarter of that,
and oneDNN multiplies int8 by int8 into int32 several times faster than float32 GEMM for the
handful of rows a decoder call scores (the 51865 x 512 head, caches flushed, 2 threads: 1.5 ms
for 1 to 6 rows and 1.7 ms for 12, where `torch._int_mm`, the fallback without oneDNN, takes
1.6 ms for 1 row and 3.4 ms for 12).

The layout is what CTranslate2 (faster-whisper's int8) uses: one scale per weight row, and the
input quantized per row on the fly. That second choice is what makes it usable for speculative
decoding. torch.ao's dynamic quantization scales the whole input block with one number, so a
row's output would change with the other rows in the call, and a position would score
differently alone than in a drafted block. Here a row's scale comes from that row, and integer
sums are exact in any order, so a row's output is the same bits in a call of 1 row or of 17:
verification sees exactly what plain decoding sees.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import List, Optional  # noqa: UP035 (TorchScript reads these names)

import torch

_LEVELS = 127  # symmetric int8: -127..127 (no -128, so negation stays exact)
_TINY = 1e-12  # an all-zero row gets this scale instead of dividing by zero


def _quantize_rows(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values: Tensor, shape = (rows, n), float32 -> int8 levels (as float32, in -127..127) and
    float32 scales (rows, 1). |value| / scale never exceeds 127 by more than a rounding, so the
    rounded levels need no clamp."""
    # abs().amax(): for a few rows several times faster than vector_norm(ord=inf)
    scales = values.abs().amax(dim=1, keepdim=True).clamp_(min=_TINY).div_(_LEVELS)
    return (values / scales).round_(), scales


@dataclass(frozen=True)
class QuantizedRows:
    """Rows quantized once for several `Int8Linear` layers that read the same input (the
    decoder layers' cross-attention keys all read the encoder's output): `quantize_rows`."""

    operand: torch.Tensor  # the levels in the product kernel's type (`_operand`)
    scales: torch.Tensor  # (rows, 1), float32


def quantize_rows(x: torch.Tensor) -> QuantizedRows:
    """x: Tensor, shape = (..., in_features) -> its rows, quantized as `Int8Linear` quantizes
    them (input_passes 1), for `Int8Linear.on_rows`."""
    levels, scales = _quantize_rows(x.reshape(-1, x.shape[-1]).float())
    return QuantizedRows(_operand(levels), scales)


def _operand(levels: torch.Tensor) -> torch.Tensor:
    """int8 levels (float32, -127..127) as the product kernel reads them: oneDNN multiplies
    unsigned by signed int8 (VNNI), so the levels shifted by 128 (zero point 128 takes it off
    again); `torch._int_mm` reads int8. Overwrites `levels`."""
    if onednn_int8_available(levels.device):
        return levels.add_(128).to(torch.uint8)
    return levels.to(torch.int8)


def onednn_int8_available(device: torch.device | str = "cpu") -> bool:
    """Whether oneDNN's int8 product (u8 x s8 -> s32, prepacked weight) runs here."""
    return torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available()


class Int8Linear(torch.nn.Module):
    """x @ weight.T + bias with the weight in int8 (a scale per output feature) and x quantized
    to int8 per row; float32 out. CPU only (oneDNN, or `torch._int_mm` without it).

    input_passes=2 quantizes each input row twice: the row, then its rounding error, both
    multiplied in one product of twice the rows. The input then carries about 15 bits instead
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
        levels, scales = _quantize_rows(weight.detach().float())
        self.register_buffer("weight_int8", levels.to(torch.int8))  # (out_features, in_features)
        self.register_buffer("weight_scale", scales.reshape(-1))  # (out_features,)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        # oneDNN's layout of weight_int8 and its zero points, made on first use. Buffers, not
        # plain attributes: a traced step (asr.traced_step) reads a module's buffers.
        self.register_buffer("_packed", None, persistent=False)
        self.register_buffer("_zero_points", None, persistent=False)

    @classmethod
    def of(cls, linear: torch.nn.Linear) -> Int8Linear:
        return cls(linear.weight, linear.bias)

    @classmethod
    def from_quantized(
        cls,
        weight_int8: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        input_passes: int = 1,
    ) -> Int8Linear:
        """A layer from the buffers of one made before (`asr.int8_store`): no quantizing."""
        layer = cls(torch.zeros(1, weight_int8.shape[1]), None, input_passes)
        layer.weight_int8, layer.weight_scale, layer.bias = weight_int8, weight_scale, bias
        layer.out_features, layer.in_features = weight_int8.shape
        return layer

    def float_state(self) -> dict[str, torch.Tensor]:
        """nn.Linear's state dict for the weight this layer holds (dequantized) and its bias."""
        state = {"weight": self.weight_int8.float() * self.weight_scale[:, None]}
        if self.bias is not None:
            state["bias"] = self.bias
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: Tensor, shape = (..., in_features) -> Tensor, shape = (..., out_features)."""
        flat = x.reshape(-1, self.in_features).float()
        levels, scales = _quantize_rows(flat)
        if self.input_passes == 1:
            out = self._products(levels).mul_(scales)
        else:
            residual, residual_scales = _quantize_rows(flat - levels * scales)
            both = self._products(torch.cat([levels, residual]))
            rows = flat.shape[0]
            out = both[:rows].mul_(scales).add_(both[rows:].mul_(residual_scales))
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def on_rows(self, rows: QuantizedRows) -> torch.Tensor:
        """This layer's output for input rows quantized once for several layers: the bits
        `forward` gives those rows (input_passes 1). Float32, Tensor, shape = (rows,
        out_features)."""
        out = self._operand_products(rows.operand).mul_(rows.scales)
        return out if self.bias is None else out.add_(self.bias)

    def _products(self, levels: torch.Tensor) -> torch.Tensor:
        """Integer products of rows of int8 levels (float32, -127..127) with the weight, times
        the weight's scales: float32, Tensor, shape = (rows, out_features). The sums are exact
        integers, so a row gets the same bits in any call, whatever the kernel. Overwrites
        `levels`."""
        return self._operand_products(_operand(levels))

    def _operand_products(self, operand: torch.Tensor) -> torch.Tensor:
        """`_products` of levels already in the kernel's operand type (`_operand`)."""
        if not onednn_int8_available(operand.device):
            products = torch._int_mm(operand, self.weight_int8.T)
            return products.float().mul_(self.weight_scale)
        self.prepack()  # the weight's scales scale the output columns
        if torch.jit.is_tracing():
            return _scripted_onednn_product()(
                operand, self._packed, self.weight_scale, self._zero_points
            )
        return torch.ops.onednn.qlinear_pointwise(
            operand, 1.0, 128, self._packed, self.weight_scale, self._zero_points, None,
            1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip

    def prepack(self) -> None:
        """Makes oneDNN's layout of the weight, once (a trace must not record it)."""
        if self._packed is None and onednn_int8_available(self.weight_int8.device):
            self._packed = torch.ops.onednn.qlinear_prepack(self.weight_int8, [8, self.in_features])
            self._zero_points = torch.zeros(self.out_features, dtype=torch.long)

    def extra_repr(self) -> str:
        passes = f", input_passes={self.input_passes}" if self.input_passes != 1 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8{passes}"


@functools.cache
def _scripted_onednn_product():
    """`Int8Linear._products`' oneDNN operation as a TorchScript function (compiled on first
    use): the tracer cannot record the operation's empty list of post-op scalars."""

    def product(
        shifted: torch.Tensor,
        packed: torch.Tensor,
        weight_scale: torch.Tensor,
        zero_points: torch.Tensor,
    ):
        # `number` is TorchScript's type of the operation's Scalar?[] (unknown to Python).
        scalars = torch.jit.annotate(List[Optional[number]], [])  # noqa: F821, UP006, UP045
        return torch.ops.onednn.qlinear_pointwise(
            shifted, 1.0, 128, packed, weight_scale, zero_points, None,
            1.0, 0, torch.float32, "none", scalars, "",
        )  # fmt: skip

    with warnings.catch_warnings():  # deprecated, as tracing is (asr.traced_step)
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(product)


def smoothing_divisor(
    channel_range: torch.Tensor, weight: torch.Tensor, alpha: float = 0.75
) -> torch.Tensor:
    """Per input channel divisor s for products of inputs with outlier channels (SmoothQuant):
    (x / s) @ (weight * s).T equals x @ weight.T, and x / s has flatter rows, so one int8 scale
    per row leaves its other channels more levels; the weight's columns take the range instead.

    channel_range: Tensor, shape = (in_features,), each input channel's typical magnitude (a
    layer norm's |weight| + |bias| bounds what it emits without calibration data); weight:
    (out_features, in_features). s = range^alpha / max|weight column|^(1 - alpha).
    """
    weight_range = weight.detach().float().abs().amax(dim=0).clamp(min=_TINY)
    return channel_range.float().clamp(min=_TINY) ** alpha / weight_range ** (1 - alpha)


def dynamic_int8_layers(module: torch.nn.Module, inplace: bool = False) -> torch.nn.Module:
    """`module` with every nn.Linear quantized by torch.ao's dynamic quantization (fbgemm: int8
    weights with a scale per tensor, the whole input block quantized with one scale on the fly);
    a quantized copy unless `inplace`. A call's rows depend on each other, so this is for drafts,
    whose proposals verification checks, never for a target.

    The layers are `quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8)`'s, bit for bit
    (the same modules, types exactly nn.Linear, through `dynamic_int8_linear`), made in a
    fraction of its time: it packs a zero weight of every layer's size before the real one.
    """
    import copy

    if not inplace:
        module = copy.deepcopy(module)
    module.eval()  # as quantize_dynamic leaves it
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, dynamic_int8_linear(child.weight, child.bias))
    return module


def dynamic_int8_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.nn.Module:
    """x @ weight.T + bias through `dynamic_int8_layers`' kernel (fbgemm): float32 in and out.

    The weight is quantized as torch.ao's `quantize_dynamic` would (its default weight observer
    and `_quantize_weight`), so the layer computes the same bits, but without what that path
    spends on a single layer at every load (a draft's 13 layers, each time a model loads): an
    nn.Linear randomly initialized only to be overwritten, a deep copy of it, and the packing of
    a zero weight that `nnqd.Linear.__init__` makes before the real one replaces it.
    """
    import warnings

    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.nn.quantized.modules.utils import _quantize_weight
    from torch.ao.quantization.qconfig import default_dynamic_qconfig

    weight = weight.detach().float()
    bias = None if bias is None else bias.detach().float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices; the API still works
        observer = default_dynamic_qconfig.weight()
        observer(weight)
        quantized = _quantize_weight(weight, observer)
        layer = DynamicLinear(1, 1)  # packs a 1 x 1 zero weight instead of a full-sized one
    layer.out_features, layer.in_features = weight.shape
    layer.set_weight_bias(quantized, bias)
    return layer

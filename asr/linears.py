"""Linear-layer kernels for the decoder runtime (`asr.static_decoder`), chosen once per model.

Speculative decoding is lossless when a position scores the same whether it is decoded alone
or inside a drafted block, and batched decoding when a window scores the same alone or beside
others. Both come down to one property of every product the decoder computes: an output row
must depend on its own input row only, bit for bit, whatever else the call holds.

- `PackedLinear` (float32, CPU): oneDNN with the weight reordered once into its blocked layout
  for small batches. On this project's AVX-512 CPU that kernel is row-invariant (a row gives
  the same bits in calls of 1 to 300 rows; `tests/test_static_decoder.py`) as long as the
  reduction is at most 1024 long, so longer ones are split into parts of at most 1024 whose
  products are added in a fixed order. It is also the fast kernel for the few rows a decoder
  call scores: the 51865 x 512 head took 4.0 ms for 1 row and 3.3 ms for 6 (caches flushed, 2
  threads), where `F.linear` took 10.7 and 23.6 ms.
- `asr.int8.Int8Linear` (int8, CPU): exact integer sums, row-invariant by construction.
- `DenseLinear`: `F.linear` (GPUs, half precision); rows may differ in the last bits between
  calls of different sizes, as with any BLAS.
"""

from __future__ import annotations

import functools
import warnings
from typing import List, Optional  # noqa: UP035 (TorchScript reads these names)

import torch
import torch.nn.functional as F

# Longest reduction one oneDNN product may have and stay row-invariant (measured: 1024 is,
# 1536 and 2048 are not).
MAX_PACKED_REDUCTION = 1024
# The batch size oneDNN lays the weight out for: 8 keeps rows invariant, 1 does not.
PACKED_BATCH_HINT = 8


def packed_linear_available(device: torch.device | str) -> bool:
    """Whether `PackedLinear` can run on `device`: oneDNN on a CPU."""
    return torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available()


class DenseLinear(torch.nn.Module):
    """x @ weight.T + bias with `F.linear`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.out_features, self.in_features = self.weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedLinear(torch.nn.Module):
    """x @ weight.T + bias, float32 on CPU, through oneDNN with the weight prepacked; every output
    row depends on its own input row alone (module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        weight = weight.detach().float()
        self.out_features, self.in_features = weight.shape
        parts = -(-self.in_features // MAX_PACKED_REDUCTION)
        self.bounds = [round(i * self.in_features / parts) for i in range(parts + 1)]
        # Buffers, not plain attributes: a traced step (asr.traced_step) reads a module's
        # buffers, and cannot hold oneDNN's packed tensors as constants.
        for index, (start, end) in enumerate(zip(self.bounds, self.bounds[1:], strict=False)):
            packed = torch.ops.mkldnn._reorder_linear_weight(
                weight[:, start:end].contiguous(), PACKED_BATCH_HINT
            )
            self.register_buffer(f"part{index}", packed, persistent=False)
        self.register_buffer(
            "bias", None if bias is None else bias.detach().float().contiguous(), persistent=False
        )

    @property
    def parts(self) -> list[torch.Tensor]:
        return [getattr(self, f"part{index}") for index in range(len(self.bounds) - 1)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: Tensor, shape = (..., in_features) -> Tensor, shape = (..., out_features)."""
        flat = x.reshape(-1, self.in_features)
        out = None
        for part, start, end in zip(self.parts, self.bounds, self.bounds[1:], strict=False):
            piece = flat if len(self.parts) == 1 else flat[:, start:end].contiguous()
            bias = self.bias if out is None else None
            product = _packed_product(piece, part, bias)
            out = product if out is None else out.add_(product)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN"


def _packed_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """oneDNN's product of a packed weight; while a step is traced (asr.traced_step), through
    TorchScript, as the tracer cannot record the operation's empty list of post-op scalars."""
    if torch.jit.is_tracing():
        return _scripted_packed_product()(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@functools.cache
def _scripted_packed_product():
    """`_packed_product`'s operation as a TorchScript function (compiled on first use)."""

    def product(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):  # noqa: UP045
        # `number` is TorchScript's type of the operation's Scalar?[] (unknown to Python).
        scalars = torch.jit.annotate(List[Optional[number]], [])  # noqa: F821, UP006, UP045
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", scalars, "")

    with warnings.catch_warnings():  # deprecated, as tracing is (asr.traced_step)
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(product)

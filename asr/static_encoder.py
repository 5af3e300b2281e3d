"""Whisper's encoder as plain tensor operations (the decoder's twin, `asr.static_decoder`).

Two strided convolutions with GELU, sinusoidal positions, then pre-norm transformer layers with
full (non-causal) self-attention over the 1500 positions of a 30 s window, as OpenAI's and
transformers' WhisperEncoder compute it. Each layer's query, key and value projections are one
product; attention is PyTorch's fused scaled_dot_product_attention. The encoder runs once per
window, in the dtype its tensors were read in ("mixed" and "int8" precisions: bfloat16).

On a CPU with native bfloat16 the products run on weights packed once into oneDNN's layout
(`_packed_layer`): PyTorch's own product reorders a weight and copies its output at every
call. The same kernel computes the same sums, so the features are the same bits (checked in
`tests/test_whisper_checkpoint.py`), and on the AMX Xeon a window took 109 ms instead of 125 ms
on two threads, 202 instead of 251 on one (docs/decoder-runtime.md). Fusing the residual
additions and GELU into the products, and the convolutions as products, was faster still
(90 ms) but rounds at other points, and a near-tie in the shipped sample's text came out
differently with one thread than with two.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class _EncoderLayer:
    self_norm: tuple[torch.Tensor, torch.Tensor]
    qkv_weight: torch.Tensor  # (3 * d_model, d_model): query (scaled in SDPA), key, value
    qkv_bias: torch.Tensor
    out_weight: torch.Tensor
    out_bias: torch.Tensor
    ffn_norm: tuple[torch.Tensor, torch.Tensor]
    fc1: tuple[torch.Tensor, torch.Tensor]
    fc2: tuple[torch.Tensor, torch.Tensor]


class StaticEncoder:
    """encode(mel) for a Whisper checkpoint's encoder tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor], heads: int, eps: float = 1e-5) -> None:
        """tensors: the encoder's, named as under transformers' "model.encoder." prefix."""
        self.heads = heads
        self.eps = eps
        self.conv1 = (tensors["conv1.weight"], tensors["conv1.bias"])
        self.conv2 = (tensors["conv2.weight"], tensors["conv2.bias"])
        self.positions = tensors["embed_positions.weight"]
        self.final_norm = (tensors["layer_norm.weight"], tensors["layer_norm.bias"])
        count = 1 + max(int(k.split(".")[1]) for k in tensors if k.startswith("layers."))
        self.layers = [self._layer(tensors, f"layers.{i}.") for i in range(count)]
        # Products on prepacked weights (`_packed_layer`), or PyTorch's F.linear.
        self.packed = _packing_applies(self.conv1[0].device, self.dtype)
        self._packed_layers: list[_EncoderLayer] | None = None  # made on first use

    @staticmethod
    def _layer(tensors: dict[str, torch.Tensor], prefix: str) -> _EncoderLayer:
        def pair(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            return tensors[f"{prefix}{name}.weight"], tensors[f"{prefix}{name}.bias"]

        query, key, value = (tensors[f"{prefix}self_attn.{p}_proj.weight"] for p in "qkv")
        key_bias = tensors.get(f"{prefix}self_attn.k_proj.bias", torch.zeros_like(query[:, 0]))
        return _EncoderLayer(
            self_norm=pair("self_attn_layer_norm"),
            qkv_weight=torch.cat([query, key, value]),
            qkv_bias=torch.cat(
                [
                    tensors[f"{prefix}self_attn.q_proj.bias"],
                    key_bias,
                    tensors[f"{prefix}self_attn.v_proj.bias"],
                ]
            ),
            out_weight=tensors[f"{prefix}self_attn.out_proj.weight"],
            out_bias=tensors[f"{prefix}self_attn.out_proj.bias"],
            ffn_norm=pair("final_layer_norm"),
            fc1=pair("fc1"),
            fc2=pair("fc2"),
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.conv1[0].dtype

    @property
    def products(self) -> list[str]:
        """The names of the weights its layers' products read, which packing copies."""
        names = [f"self_attn.{p}_proj.weight" for p in ("q", "k", "v", "out")]
        names += ["fc1.weight", "fc2.weight"]
        return [f"layers.{i}.{name}" for i in range(len(self.layers)) for name in names]

    @torch.inference_mode()
    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: Tensor, shape = (batch, n_mels, 3000) -> Tensor, shape = (batch, 1500,
        d_model), in the encoder's dtype."""
        layers, linear = self.layers, F.linear
        if self.packed:
            if self._packed_layers is None:
                rows = mel.shape[-1] // 2  # the positions a window's layers compute
                self._packed_layers = [_packed_layer(layer, rows) for layer in self.layers]
                self.layers = self._packed_layers  # the unpacked weights are read no more
            layers, linear = self._packed_layers, _packed_linear
        x = F.gelu(F.conv1d(mel.to(self.dtype), *self.conv1, padding=1))
        x = F.gelu(F.conv1d(x, *self.conv2, stride=2, padding=1))
        # Made contiguous once: a sum keeps its first operand's layout, so a transposed stream
        # stayed transposed through every residual sum and each layer norm copied it (a window
        # took 351 ms, now 341, on the 2-core EPYC; best of 24); the same values either way.
        x = (x.transpose(1, 2) + self.positions[: x.shape[2]]).contiguous()
        batch, length, width = x.shape
        for layer in layers:
            normed = F.layer_norm(x, (width,), *layer.self_norm, self.eps)
            qkv = linear(normed, layer.qkv_weight, layer.qkv_bias)
            query, key, value = qkv.view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(query, key, value)
            attended = attended.transpose(1, 2).reshape(batch, length, width)
            x = x + linear(attended, layer.out_weight, layer.out_bias)
            normed = F.layer_norm(x, (width,), *layer.ffn_norm, self.eps)
            x = x + linear(F.gelu(linear(normed, *layer.fc1)), *layer.fc2)
        return F.layer_norm(x, (width,), *self.final_norm, self.eps)


def _packing_applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `_packed_layer`'s products serve this encoder: bfloat16 on a CPU that computes
    it natively through oneDNN, whose product on a prepacked weight gives F.linear's bits
    there. (Float32's F.linear is another library's kernel, whose sums differ in their last
    bits.)"""
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def _packed_layer(layer: _EncoderLayer, rows: int) -> _EncoderLayer:
    """`layer` with its product weights reordered once into oneDNN's blocked layout for
    products of about `rows` rows (`_packed_linear` reads them)."""

    def pack(weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)

    return replace(
        layer,
        qkv_weight=pack(layer.qkv_weight),
        out_weight=pack(layer.out_weight),
        fc1=(pack(layer.fc1[0]), layer.fc1[1]),
        fc2=(pack(layer.fc2[0]), layer.fc2[1]),
    )


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """F.linear on a weight `_packed_layer` reordered."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

"""Whisper's encoder as plain tensor operations (the decoder's twin, `asr.static_decoder`).

Two strided convolutions with GELU, sinusoidal positions, then pre-norm transformer layers with
full (non-causal) self-attention over the 1500 positions of a 30 s window, as OpenAI's and
transformers' WhisperEncoder compute it. Each layer's query, key and value projections are one
product; attention is PyTorch's fused scaled_dot_product_attention. The encoder runs once per
window, in the dtype its tensors were read in ("mixed" and "int8" precisions: bfloat16).

On a CPU with oneDNN the products run on weights packed once, with the residual additions
fused into them, and the two convolutions as products over their three taps with their GELU
fused (`_OneDnnProducts`): on the AMX Xeon a bfloat16 window took 90 ms instead of 125 ms on
two threads (docs/decoder-runtime.md). The sums are the same, rounded to the dtype at other
points, so the features differ from the unfused ones in their last bits, as between thread
counts, and lie a little closer to float32's; a window's features never depend on the windows
encoded beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# The convolutions' kernel width (Whisper's encoder: 3, padding 1; the second strides by 2).
_TAPS = 3


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
        # oneDNN's fused products (a CPU's), or PyTorch's operations one by one.
        self.fused = _onednn_applies(self.conv1[0].device, self.dtype)
        self._onednn: _OneDnnProducts | None = None  # made on first use

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

    @torch.inference_mode()
    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: Tensor, shape = (batch, n_mels, 3000) -> Tensor, shape = (batch, 1500,
        d_model), in the encoder's dtype."""
        if self.fused:
            if self._onednn is None:
                self._onednn = _OneDnnProducts(self, frames=mel.shape[-1])
            return self._onednn(mel.to(self.dtype))
        x = F.gelu(F.conv1d(mel.to(self.dtype), *self.conv1, padding=1))
        x = F.gelu(F.conv1d(x, *self.conv2, stride=2, padding=1))
        x = x.transpose(1, 2) + self.positions[: x.shape[2]]
        batch, length, width = x.shape
        for layer in self.layers:
            normed = F.layer_norm(x, (width,), *layer.self_norm, self.eps)
            qkv = F.linear(normed, layer.qkv_weight, layer.qkv_bias)
            query, key, value = qkv.view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(query, key, value)
            attended = attended.transpose(1, 2).reshape(batch, length, width)
            x = x + F.linear(attended, layer.out_weight, layer.out_bias)
            normed = F.layer_norm(x, (width,), *layer.ffn_norm, self.eps)
            x = x + F.linear(F.gelu(F.linear(normed, *layer.fc1)), *layer.fc2)
        return F.layer_norm(x, (width,), *self.final_norm, self.eps)


def _onednn_applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN's fused products serve this encoder: a CPU with oneDNN, float32, or
    bfloat16 where the CPU computes it natively (emulated bfloat16 keeps PyTorch's kernels)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class _OneDnnProducts:
    """The encoder's products on a CPU through oneDNN: weights packed once for a window's row
    count, GELU fused into the convolutions, the residual additions into the attention's output
    product and the second feed-forward product.

    Each convolution is a product of its input's three taps side by side (im2col: a row holds
    frames t-1, t and t+1 of every channel) with the kernel laid out to match, which gives the
    (frames, d_model) layout the layers read instead of a transposed copy."""

    def __init__(self, encoder: StaticEncoder, frames: int) -> None:
        """frames: the mel frames of the windows it will mostly read (packing's row count;
        any other count is computed too)."""
        self.encoder = encoder
        positions = frames // 2
        self.conv1 = (self._taps_weight(encoder.conv1[0], frames), encoder.conv1[1])
        self.conv2 = (self._taps_weight(encoder.conv2[0], positions), encoder.conv2[1])
        self.layers = [
            tuple(
                (_pack(weight, positions), bias)
                for weight, bias in (
                    (layer.qkv_weight, layer.qkv_bias),
                    (layer.out_weight, layer.out_bias),
                    layer.fc1,
                    layer.fc2,
                )
            )
            for layer in encoder.layers
        ]

    @staticmethod
    def _taps_weight(kernel: torch.Tensor, rows: int) -> torch.Tensor:
        """A conv1d kernel (out, in, taps) as a packed (out, taps * in) product weight."""
        out_channels = kernel.shape[0]
        return _pack(kernel.permute(0, 2, 1).reshape(out_channels, -1), rows)

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        encoder, product = self.encoder, torch.ops.mkldnn._linear_pointwise
        x = _taps(mel.transpose(1, 2), stride=1)
        x = product(x, *self.conv1, "gelu", [], "none")  # "none": GELU's exact (erf) form
        x = product(_taps(x, stride=2), *self.conv2, "gelu", [], "none")
        x = x + encoder.positions[: x.shape[1]]
        batch, length, width = x.shape
        for layer, (qkv, out, fc1, fc2) in zip(encoder.layers, self.layers, strict=True):
            normed = F.layer_norm(x, (width,), *layer.self_norm, encoder.eps)
            projected = product(normed, *qkv, "none", [], "")
            query, key, value = projected.view(batch, length, 3, encoder.heads, -1).permute(
                2, 0, 3, 1, 4
            )
            attended = F.scaled_dot_product_attention(query, key, value)
            attended = attended.transpose(1, 2).reshape(batch, length, width)
            x = product.binary(attended, x, *out, "add")
            normed = F.layer_norm(x, (width,), *layer.ffn_norm, encoder.eps)
            # GELU apart, on the product rounded to the dtype: fused, it was as fast and as
            # close to float32 (module docstring), and flipped the shipped sample's comma.
            hidden = F.gelu(product(normed, *fc1, "none", [], ""))
            x = product.binary(hidden, x, *fc2, "add")
        return F.layer_norm(x, (width,), *encoder.final_norm, encoder.eps)


def _taps(x: torch.Tensor, stride: int) -> torch.Tensor:
    """(batch, frames, channels) -> (batch, frames // stride, taps * channels): each output
    frame's taps side by side, tap-major, with one zero frame padded at either end."""
    padded = F.pad(x, (0, 0, 1, 1))
    windows = padded.unfold(1, _TAPS, stride)  # (batch, out frames, channels, taps)
    return windows.transpose(2, 3).reshape(x.shape[0], windows.shape[1], -1)


def _pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """A (out, in) weight in oneDNN's blocked layout for products of about `rows` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)

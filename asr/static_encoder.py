"""Whisper's encoder as plain tensor operations (the decoder's twin, `asr.static_decoder`).

Two strided convolutions with GELU, sinusoidal positions, then pre-norm transformer layers with
full (non-causal) self-attention over the 1500 positions of a 30 s window, as OpenAI's and
transformers' WhisperEncoder compute it. Each layer's query, key and value projections are one
product; attention is PyTorch's fused scaled_dot_product_attention. The encoder runs once per
window, in the dtype its tensors were read in ("mixed" and "int8" precisions: bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass

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

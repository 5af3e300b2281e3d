"""Whisper's decoder with int8 linear layers, computed so that a row never depends on its call.

Speculative decoding is lossless when a position scores the same whether it is decoded alone or
inside a drafted block, and batched decoding when a window scores the same alone or beside
others. In float32 that holds up to rounding (BLAS picks other kernels for other block widths).
With int8 layers rounding is not enough: a last-bit change in an activation can move it to
the next int8 level, and across six layers the logits moved by up to 0.57 between a 9-token
block and the same tokens one by one. So this decoder removes every source of dependence on the
call instead:

- linear layers: `asr.int8.Int8Linear`, per-row scales and exact integer sums;
- attention: the queries of a call go through in chunks of a fixed `QUERY_CHUNK` rows (padded),
  against the whole fixed-size key buffer (all `max_context` self-attention slots; the 1500
  encoder positions), so every product and softmax has the same shape in every call and a row's
  values are computed by the same operations on the same numbers;
- the self-attention cache holds position p of a row in slot p. A query at position p sees the
  slots 0..p, which then hold exactly that row's tokens: there are no holes to mask, rollback
  needs no copy, and a row alone or in a batch reads the same slots.

Everything else is row-wise (layer norm, GELU, residual additions, embeddings).
`tests/test_int8_decoder.py` checks the logits bit for bit: block against one by one, batch
against alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Queries per attention product. Padding costs compute (a 16-row chunk made a 1-token step
# 15.4 ms, a 2-row one 7.7 ms), more chunks cost calls; 2 is fastest for plain decoding, the
# most common call, and within noise of the best for 3-9 tokens.
QUERY_CHUNK = 2


class SlotCache:
    """Self-attention keys and values by position, and the windows' cross-attention ones.

    keys[i], values[i]: Tensor, shape = (batch, heads, max_context, head_dim), layer i.
    cross: per layer (keys, values), each Tensor, shape = (batch, heads, 1500, head_dim).
    Offers the two methods `WhisperTarget` calls on a transformers cache.
    """

    def __init__(self, cross, layers: int, max_context: int) -> None:
        keys, _ = cross[0]
        batch, heads, _, head_dim = keys.shape
        shape = (batch, heads, max_context, head_dim)
        # zeros: a slot not yet written is masked out, and 0 * a finite value stays 0
        self.keys = [keys.new_zeros(shape) for _ in range(layers)]
        self.values = [keys.new_zeros(shape) for _ in range(layers)]
        self.cross = list(cross)

    def crop(self, dropped: int) -> None:
        """Nothing to do: a rolled-back slot is rewritten before any query can see it."""

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.cross = [(k[rows], v[rows]) for k, v in self.cross]


def _attend(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hidden):
    """softmax(queries @ keys.T, masked) @ values over fixed-size query chunks.

    queries: (batch, heads, n, head_dim), already scaled; keys, values: (batch, heads, slots,
    head_dim); hidden: None or Tensor[bool], shape = (batch, 1, n, slots), True = masked.
    """
    n = queries.shape[2]
    outputs = []
    for start in range(0, n, QUERY_CHUNK):
        chunk = queries[:, :, start : start + QUERY_CHUNK]
        rows = chunk.shape[2]
        if rows < QUERY_CHUNK:
            chunk = F.pad(chunk, (0, 0, 0, QUERY_CHUNK - rows))
        scores = chunk @ keys.transpose(-1, -2)
        if hidden is not None:
            mask = hidden[:, :, start : start + QUERY_CHUNK]
            if rows < QUERY_CHUNK:
                mask = F.pad(mask, (0, 0, 0, QUERY_CHUNK - rows), value=True)
            scores = scores.masked_fill(mask, -torch.inf)
            # padded query rows see nothing; give them one slot so the softmax stays finite
            if rows < QUERY_CHUNK:
                scores[:, :, rows:, 0] = 0.0
        outputs.append((scores.softmax(dim=-1) @ values)[:, :, :rows])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def _heads(states: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, n, d_model) -> (batch, heads, n, head_dim)."""
    batch, n, _ = states.shape
    return states.view(batch, n, heads, -1).transpose(1, 2)


def _merge(states: torch.Tensor) -> torch.Tensor:
    """(batch, heads, n, head_dim) -> (batch, n, d_model)."""
    batch, heads, n, head_dim = states.shape
    return states.transpose(1, 2).reshape(batch, n, heads * head_dim)


@torch.inference_mode()
def decoder_states(
    decoder, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: SlotCache
) -> torch.Tensor:
    """Runs transformers' WhisperDecoder `decoder` (its linear layers `Int8Linear`s) on a block.

    tokens, positions: Tensor, shape = (batch, n); mask: Tensor[bool], shape = (batch, n),
    False for padding (neither stored nor attended to). Returns Tensor, shape = (batch, n,
    d_model), after the final layer norm.
    """
    batch, n = tokens.shape
    states = decoder.embed_tokens(tokens) + decoder.embed_positions.weight[positions]
    slots = cache.keys[0].shape[2]
    # a query at position p sees the slots 0..p: (batch, 1, n, slots), True = hidden
    hidden = torch.arange(slots, device=tokens.device) > positions[:, None, :, None]
    rows, columns = mask.nonzero(as_tuple=True)
    stored_at = positions[rows, columns]
    for index, layer in enumerate(decoder.layers):
        attention = layer.self_attn
        heads = attention.num_heads
        normed = layer.self_attn_layer_norm(states)
        queries = _heads(attention.q_proj(normed) * attention.scaling, heads)
        keys = attention.k_proj(normed).view(batch, n, heads, -1)
        values = attention.v_proj(normed).view(batch, n, heads, -1)
        cache.keys[index][rows, :, stored_at] = keys[rows, columns]
        cache.values[index][rows, :, stored_at] = values[rows, columns]
        attended = _attend(queries, cache.keys[index], cache.values[index], hidden)
        states = states + attention.out_proj(_merge(attended))

        attention = layer.encoder_attn
        normed = layer.encoder_attn_layer_norm(states)
        queries = _heads(attention.q_proj(normed) * attention.scaling, heads)
        cross_keys, cross_values = cache.cross[index]
        attended = _attend(queries, cross_keys, cross_values, None)
        states = states + attention.out_proj(_merge(attended))

        normed = layer.final_layer_norm(states)
        states = states + layer.fc2(F.gelu(layer.fc1(normed)))
    return decoder.layer_norm(states)

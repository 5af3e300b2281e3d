"""Whisper's decoder as plain tensor operations over a static slot cache.

transformers' decoder grows a cache per call, builds masks and dispatches through several
layers of Python for every token; a decoder step of whisper-base on a CPU is a few
milliseconds of arithmetic, so that overhead, and how verification calls are computed, decide
whether drafting pays. This runtime keeps only the arithmetic:

- the weights of each layer are taken once from a transformers `WhisperDecoder` and handed to
  a linear kernel chosen for the device and precision (`asr.linears`, `asr.int8`); the
  self-attention's query, key and value projections are one product;
- the self-attention cache is preallocated: position p of a row lives in slot p, so rolling
  back a row is free (a rejected slot is rewritten before any query can see it) and nothing
  is ever copied to grow it; the cross-attention keys and values are the window's, computed
  once (`asr.whisper.WhisperModel.cross_attention`); keys are kept transposed,
  (batch, heads, head_dim, positions), the layout the score product reads fastest.

Two ways to attend, chosen per call:
- exact (a target's calls on CPU, its prompts included): every query row is computed by the same
  operations on the same numbers whatever else the call holds. BLAS picks its kernel by the
  number of rows, and on this CPU a row gets the same bits from products of 4 to 32 rows (and
  other bits from products of 1 to 3), so the queries of a call go through in products of
  `EXACT_ROWS` rows (padded to 4: a plain step's one query costs about twice its attention,
  a verification of 6 about half of what 1 + 1 products of 3 would) against every encoder
  position, and against the cache's slots up to the end of the query's own bucket of
  `SLOT_BUCKET` positions, one row at a time (`_slot_buckets`), so no product's shape depends
  on the block or the batch, only on the query's own position. With row-invariant
  linear kernels, a position then scores the same bits alone, in a drafted block, or beside
  other windows, and drafting is lossless bit for bit (`tests/test_static_decoder.py`).
  A first call scores every row's whole prompt, shorter prompts left-padded to the longest
  (padding columns are computed and dropped): in exact mode a window prompted with its SOT
  sequence alone gets the same bits beside one prompted with previous text as alone, which
  recordings and passages decoded side by side rely on.
- fast (a draft, GPUs): one product over all queries and only the slots used so far.

Either mode can instead attend to every slot, masked by position (`every_slot`), so that it
reads no position on the host and its product shapes never change: what a CUDA graph records
(`asr.cuda_graphs`, `asr.graph_rounds`), exact still in the sense above.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Query rows per attention product in exact mode (see the module docstring): CPU matrix
# products give a row the same bits for any row count from 4 to 32 (and, apart, from 1 to 3).
EXACT_ROWS = range(4, 33)
# Zero query rows a traced exact-mode product always adds (asr.traced_step): a block of r rows
# then runs in a product of r + 4 rows, within EXACT_ROWS for r <= 28, which gives its rows the
# bits of the eager product of max(r, 4) rows, and one trace serves every block width.
TRACED_QUERY_PADDING = EXACT_ROWS.start
# In exact mode a query at position p attends to the slots before the next multiple of this
# (the rest of its bucket masked): most windows decode far fewer than max_context (448)
# positions, and reading every slot's keys and values cost about 0.9 of a 10 ms int8 step.
SLOT_BUCKET = 64

LinearFactory = Callable[[torch.Tensor, torch.Tensor | None], torch.nn.Module]
"""(weight (out, in), bias (out,) or None) -> a module computing x @ weight.T + bias."""


@dataclass(frozen=True)
class _Norm:
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float = 1e-5  # nn.LayerNorm's, which Whisper uses

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor], name: str) -> _Norm:
        return cls(tensors[f"{name}.weight"], tensors[f"{name}.bias"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


@dataclass(frozen=True)
class _Layer:
    self_norm: _Norm
    qkv: torch.nn.Module  # (query * scaling, key, value) in one product
    self_out: torch.nn.Module
    cross_norm: _Norm
    cross_query: torch.nn.Module  # already scaled
    cross_out: torch.nn.Module
    ffn_norm: _Norm
    fc1: torch.nn.Module
    fc2: torch.nn.Module

    @classmethod
    def of(
        cls, tensors: dict[str, torch.Tensor], prefix: str, linear: LinearFactory, scaling: float
    ) -> _Layer:
        """tensors: a decoder's, named as under transformers' "model.decoder." prefix;
        prefix: this layer's ("layers.3.")."""

        def weight(name: str) -> torch.Tensor:
            return tensors[f"{prefix}{name}.weight"]

        def bias(name: str) -> torch.Tensor:  # Whisper's key projections have none
            found = tensors.get(f"{prefix}{name}.bias")
            return torch.zeros_like(weight(name)[:, 0]) if found is None else found

        def product(name: str, scale: float = 1.0) -> torch.nn.Module:
            return linear(weight(name) * scale, bias(name) * scale)

        # The query's scaling is folded into its weights: exact for Whisper's head_dim 64
        # (1/8, a power of two), and a single rounding otherwise.
        names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
        scales = (scaling, 1.0, 1.0)
        return cls(
            self_norm=_Norm.of(tensors, f"{prefix}self_attn_layer_norm"),
            qkv=linear(
                torch.cat([weight(n) * s for n, s in zip(names, scales, strict=True)]),
                torch.cat([bias(n) * s for n, s in zip(names, scales, strict=True)]),
            ),
            self_out=product("self_attn.out_proj"),
            cross_norm=_Norm.of(tensors, f"{prefix}encoder_attn_layer_norm"),
            cross_query=product("encoder_attn.q_proj", scaling),
            cross_out=product("encoder_attn.out_proj"),
            ffn_norm=_Norm.of(tensors, f"{prefix}final_layer_norm"),
            fc1=product("fc1"),
            fc2=product("fc2"),
        )


class SlotCache:
    """A batch's self-attention keys and values by position, and its windows' cross-attention
    keys and values.

    keys[i]: Tensor, shape = (batch, heads, head_dim, slots); values[i]: Tensor, shape =
    (batch, heads, slots, head_dim); slot p holds position p. cross_keys[i]: Tensor, shape =
    (batch, heads, head_dim, 1500); cross_values[i]: Tensor, shape = (batch, heads, 1500,
    head_dim).
    """

    def __init__(self, cross, slots: int, dtype: torch.dtype, group: int = 1) -> None:
        """cross: per layer (keys, values), each Tensor, shape = (windows, heads, 1500,
        head_dim) (`asr.whisper.EncodedAudio.cross`, whose keys are transposed views); dtype:
        what attention reads (a copy of `cross` when it differs); group: rows per window (the
        chains of a drafted tree), consecutive, which read their window's cross-attention keys
        and values in one product: batch = windows * group."""
        self.group = group
        self.cross_keys = [_transposed(keys).to(dtype) for keys, _ in cross]
        self.cross_values = [values.to(dtype) for _, values in cross]
        windows, heads, head_dim, _ = self.cross_keys[0].shape
        batch = windows * group
        like = self.cross_values[0]
        self.keys = [like.new_zeros((batch, heads, head_dim, slots)) for _ in cross]
        self.values = [like.new_zeros((batch, heads, slots, head_dim)) for _ in cross]
        # The cross tensors are the encoded audio's own (and a shared-encoder draft's) until
        # the first keep_rows copies the kept rows: only then may rows move in place.
        self.owns_cross = False

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def slots(self) -> int:
        return self.keys[0].shape[-1]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keeps only these rows, in this order (whole groups of rows). Tensor, shape = (n,).

        Rows in ascending order (a batch shedding its finished rows) move down in place, so
        only the rows after the first one dropped are moved, not every kept row copied; the
        first rows alone (the last rows finished) are a view, and nothing moves. The cross
        tensors are copied the first time rows must move, as until then they are the encoded
        audio's own (and a shared-encoder draft's)."""
        windows = rows[:: self.group] // self.group
        for name in ("keys", "values"):
            setattr(self, name, _kept_rows(getattr(self, name), rows, in_place=True))
        for name in ("cross_keys", "cross_values"):
            setattr(self, name, _kept_rows(getattr(self, name), windows, self.owns_cross))
        # views of the first windows stay whoever's they were; anything else was copied
        self.owns_cross = self.owns_cross or windows.tolist() != list(range(len(windows)))

    def row(self, index: int) -> SlotCache:
        """Row `index` alone, as a one-row cache whose tensors are views of this one's: what
        a call writes to it lands in this cache (a pool's row taking a new window). Rows in
        groups of one only."""
        if self.group != 1:
            raise ValueError("a single row of a grouped cache would lose its window")
        view = SlotCache.__new__(SlotCache)
        view.group, view.owns_cross = 1, False
        for name in ("keys", "values", "cross_keys", "cross_values"):
            setattr(view, name, [tensor[index : index + 1] for tensor in getattr(self, name)])
        return view


def _kept_rows(
    tensors: list[torch.Tensor], rows: torch.Tensor, in_place: bool
) -> list[torch.Tensor]:
    """Each tensor's rows `rows`. The first rows, in order, are views (nothing moves). In
    place (rows moved down, the tail left unused) when allowed and the rows ascend: each row's
    source is then at or after its destination, so no source is overwritten before it is read.
    Else copies."""
    order = rows.tolist()
    if order == list(range(len(order))):
        return [tensor[: len(order)] for tensor in tensors]
    if not in_place or any(b <= a for a, b in itertools.pairwise(order)):
        return [tensor[rows] for tensor in tensors]
    moves = [(slot, row) for slot, row in enumerate(order) if slot != row]
    for tensor in tensors:
        for slot, row in moves:
            tensor[slot].copy_(tensor[row])
    return [tensor[: len(order)] for tensor in tensors]


def _transposed(keys: torch.Tensor) -> torch.Tensor:
    """(batch, heads, positions, head_dim) -> contiguous (batch, heads, head_dim, positions);
    no copy when `keys` is already a transposed view of such a tensor."""
    return keys.transpose(-1, -2).contiguous()


class StaticDecoder:
    """A WhisperDecoder's weights on chosen linear kernels; `forward` runs a block of tokens."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        config,
        linear: LinearFactory,
        attention_dtype: torch.dtype | None = None,
    ) -> None:
        """tensors: a Whisper decoder's, named as under transformers' "model.decoder." prefix;
        config: the checkpoint's (decoder_attention_heads, d_model, activation_function);
        linear: the kernel each product runs on; attention_dtype: the dtype keys, values and
        attention products are kept in (default: the embeddings'), the softmax always in
        float32."""
        self.embed_tokens = tensors["embed_tokens.weight"]
        self.embed_positions = tensors["embed_positions.weight"]
        self.attention_dtype = attention_dtype or self.embed_tokens.dtype
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        scaling = self.head_dim**-0.5
        count = 1 + max(int(k.split(".")[1]) for k in tensors if k.startswith("layers."))
        self.layers = [_Layer.of(tensors, f"layers.{i}.", linear, scaling) for i in range(count)]
        self.final_norm = _Norm.of(tensors, "layer_norm")
        self.activation = {"gelu": F.gelu, "relu": F.relu}[config.activation_function]

    @property
    def max_context(self) -> int:
        return self.embed_positions.shape[0]

    def new_cache(self, cross, group: int = 1) -> SlotCache:
        """An empty cache for a batch of windows; cross: their `EncodedAudio.cross`, one entry
        per layer of this decoder; group: rows per window (`SlotCache`)."""
        if len(cross) != len(self.layers):
            raise ValueError(f"cross has {len(cross)} layers, the decoder {len(self.layers)}")
        return SlotCache(cross, self.max_context, self.attention_dtype, group)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SlotCache,
        *,
        exact: bool = False,
        valid: torch.Tensor | None = None,
        cross_queries: dict[int, torch.Tensor] | None = None,
        every_slot: bool = False,
    ) -> torch.Tensor:
        """`compute` in inference mode (what every caller but a compiled one wants)."""
        return self.compute(
            tokens,
            positions,
            cache,
            exact=exact,
            valid=valid,
            cross_queries=cross_queries,
            every_slot=every_slot,
        )

    def compute(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SlotCache,
        *,
        exact: bool = False,
        valid: torch.Tensor | None = None,
        cross_queries: dict[int, torch.Tensor] | None = None,
        every_slot: bool = False,
        slots: int | None = None,
        traced_buckets: tuple[SlotBucket, SlotBucket] | None = None,
    ) -> torch.Tensor:
        """Stores the block's keys and values in `cache` and returns its final states.

        tokens, positions: Tensor, shape = (batch, n); a row's positions follow what the cache
        holds for it (slots 0..p-1 are its tokens before position p). valid: Tensor[bool],
        shape = (batch, n), False for padding (not stored; its states are meaningless); None:
        every column. exact: attend as the module docstring says; padding columns (a first
        block's shorter prompts, left-padded) are computed with the rest and dropped.
        cross_queries: filled with each listed layer's scaled cross-attention queries, Tensor,
        shape = (batch, heads, n, head_dim) (word timing reads them).
        every_slot: attend to every slot, masked by position, and read nothing of the
        positions on the host, so the call can be recorded as a CUDA graph and replayed with
        other positions (asr.cuda_graphs); exact then stays exact, in products of one shape.
        slots: fast mode only: attend to slots 0..slots-1, masked by position (at least the
        block's last position + 1; None: exactly that), so a traced step reads how many from
        a shape rather than from the positions (asr.traced_step).
        traced_buckets: exact mode, one row: its block's columns in its first bucket and in the
        next (empty where the block lies in one; `exact_block_parts`), built from shapes while
        tracing, so that one trace serves any block; every attention product then pads its
        queries by `TRACED_QUERY_PADDING` rows and gives each row the eager product's bits.
        Returns Tensor, shape = (batch, n, d_model), after the final layer norm.
        Runs in the caller's autograd mode (callers turn gradients off): torch.compile traces
        this, as it cannot trace into inference mode (asr.graph_rounds' fused draft).
        """
        batch, n = tokens.shape
        states = F.embedding(tokens, self.embed_tokens) + self.embed_positions[positions]
        store = _StoreIndex.of(positions, valid)
        if slots is not None and (exact or every_slot):
            raise ValueError("slots is for fast mode over the used slots")
        traced = traced_buckets is not None
        if traced and (not exact or every_slot or batch != 1):
            raise ValueError("traced_buckets are one row's, in exact mode")
        bucketed = exact and not every_slot and not traced
        buckets = _slot_buckets(positions, cache.slots) if bucketed else traced_buckets
        masked = slots is not None
        if every_slot:
            slots = cache.slots
        elif traced:
            slots = traced_buckets[1].slots  # the later bucket ends last (not max: a shape)
        elif slots is None:
            slots = max(b.slots for b in buckets) if exact else int(positions.max()) + 1
        # A query at position p sees slots 0..p: Tensor[bool], shape = (batch, 1, n, slots);
        # a lone query of a lone row sees every slot up to its own (a draft's step).
        hidden = None
        if exact or every_slot or masked or tokens.numel() > 1:
            hidden = torch.arange(slots, device=tokens.device) > positions[:, None, :, None]
        for index, layer in enumerate(self.layers):
            normed = layer.self_norm(states)
            query, key, value = layer.qkv(normed).view(batch, n, 3, self.heads, -1).unbind(2)
            keys, values = cache.keys[index], cache.values[index]
            store.write(keys, values, key, value)
            if buckets is None:
                attended = _attend(
                    query.transpose(1, 2), keys[..., :slots], values[:, :, :slots], hidden, exact
                )
            else:
                attended = _attend_in_buckets(
                    query.transpose(1, 2), keys, values, hidden, buckets, traced
                )
            states = states + layer.self_out(_merge(attended))

            normed = layer.cross_norm(states)
            query = layer.cross_query(normed).view(batch, n, self.heads, -1).transpose(1, 2)
            if cross_queries is not None and index in cross_queries:
                cross_queries[index] = query
            cross_keys, cross_values = cache.cross_keys[index], cache.cross_values[index]
            if traced:
                attended = _attend_padded(query, cross_keys, cross_values, None)
            else:
                attended = _attend_grouped(query, cross_keys, cross_values, cache.group, exact)
            states = states + layer.cross_out(_merge(attended))

            normed = layer.ffn_norm(states)
            states = states + layer.fc2(self.activation(layer.fc1(normed)))
        return self.final_norm(states)


@dataclass(frozen=True)
class _StoreIndex:
    """Where a block's keys and values go: (row, slot) of every stored column, and which
    columns those are (None: all, row by row)."""

    rows: torch.Tensor  # (entries,)
    slots: torch.Tensor  # (entries,)
    columns: tuple[torch.Tensor, torch.Tensor] | None

    @classmethod
    def of(cls, positions: torch.Tensor, valid: torch.Tensor | None) -> _StoreIndex:
        """positions, valid: Tensor, shape = (batch, n)."""
        if valid is None or bool(valid.all()):
            batch, n = positions.shape
            rows = torch.arange(batch, device=positions.device).repeat_interleave(n)
            return cls(rows, positions.reshape(-1), None)
        rows, columns = valid.nonzero(as_tuple=True)
        return cls(rows, positions[rows, columns], (rows, columns))

    def write(self, keys, values, key: torch.Tensor, value: torch.Tensor) -> None:
        """keys: (batch, heads, head_dim, slots), values: (batch, heads, slots, head_dim);
        key, value: (batch, n, heads, head_dim)."""
        if self.columns is None and torch.jit.is_tracing():
            # Scattered along the slots, so that the traced shapes follow the block's and a
            # traced step serves any batch size (asr.traced_step). Not everywhere: on this CPU
            # a scatter of 8 rows costs more than the indexed assignment, and torch.compile
            # makes more kernels of it (docs/gpu.md, run 8).
            batch, n, heads, head_dim = key.shape
            positions = self.slots.view(batch, n)  # every column: the block's positions
            slots = positions[:, None, None, :].expand(batch, heads, head_dim, n)
            keys.scatter_(3, slots, key.permute(0, 2, 3, 1).to(keys.dtype))
            values.scatter_(2, slots.transpose(2, 3), value.transpose(1, 2).to(values.dtype))
            return
        if self.columns is None:
            key, value = key.flatten(0, 1), value.flatten(0, 1)
        else:
            key, value = key[self.columns], value[self.columns]
        # keys[rows, :, :, slots] is (entries, heads, head_dim), as is key.
        keys[self.rows, :, :, self.slots] = key.to(keys.dtype)
        values[self.rows, :, self.slots] = value.to(values.dtype)


def _attend(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    hidden: torch.Tensor | None,
    exact: bool,
) -> torch.Tensor:
    """softmax(queries @ keys, hidden masked) @ values, in the keys' dtype with the softmax in
    float32; returns the queries' dtype.

    queries: (batch, heads, n, head_dim), scaled; keys: (batch, heads, head_dim, slots);
    values: (batch, heads, slots, head_dim); hidden: None or Tensor[bool], shape = (batch, 1,
    n, slots), True = not attended. exact: in products of the row counts `_exact_rows` gives.
    """
    dtype = keys.dtype
    rows_per_product = _exact_rows(dtype) if exact else range(1, queries.shape[2] + 1)
    outputs = []
    for start in range(0, queries.shape[2], rows_per_product.stop - 1):
        chunk = queries[:, :, start : start + rows_per_product.stop - 1].to(dtype)
        rows = chunk.shape[2]
        padding = max(rows_per_product.start - rows, 0)
        if padding:  # zero queries: their rows are computed and dropped
            chunk = F.pad(chunk, (0, 0, 0, padding))
        scores = (chunk @ keys).float()
        if hidden is not None:
            mask = hidden[:, :, start : start + rows]
            if padding:  # padding rows see every slot, so no row is all -inf
                mask = F.pad(mask, (0, 0, 0, padding), value=False)
            scores = scores.masked_fill(mask, -torch.inf)
        attended = scores.softmax(dim=-1).to(dtype) @ values
        outputs.append(attended[:, :, :rows])
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    return out.to(queries.dtype)


def _attend_padded(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    hidden: torch.Tensor | None,
) -> torch.Tensor:
    """Exact `_attend` of at most 28 query rows (none too) in one product of
    `TRACED_QUERY_PADDING` more rows, whatever their count, so that a trace records one
    sequence of operations for every count (asr.traced_step); each row's bits are the eager
    product's, both products holding 4 to 32 rows. Shapes as `_attend`'s."""
    dtype = keys.dtype
    _exact_rows(dtype)
    rows = queries.shape[2]
    padded = F.pad(queries.to(dtype), (0, 0, 0, TRACED_QUERY_PADDING))
    scores = (padded @ keys).float()
    if hidden is not None:  # padding rows see every slot, so no row is all -inf
        mask = F.pad(hidden, (0, 0, 0, TRACED_QUERY_PADDING), value=False)
        scores = scores.masked_fill(mask, -torch.inf)
    attended = scores.softmax(dim=-1).to(dtype) @ values
    return attended[:, :, :rows].to(queries.dtype)


def _attend_grouped(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, group: int, exact: bool
) -> torch.Tensor:
    """Unmasked `_attend` of rows in groups of `group` consecutive rows that read one window's
    keys and values. In exact mode a group's queries go in one product: a drafted tree's
    chains read their window's cross-attention once, not once per chain, and products of 4 to
    32 rows give each row the same bits in any of them, so a chain's positions score as plain
    steps. Fast mode (a prompt) keeps each product's shape. queries: (windows * group, heads,
    n, head_dim); keys, values: per window."""
    if group == 1:
        return _attend(queries, keys, values, None, exact)
    if not exact:  # products of other shapes would give other bits: one per chain instead
        out = torch.empty_like(queries)
        for member in range(group):
            out[member::group] = _attend(queries[member::group], keys, values, None, False)
        return out
    batch, heads, n, head_dim = queries.shape
    shared = queries.view(batch // group, group, heads, n, head_dim).transpose(1, 2)
    out = _attend(
        shared.reshape(batch // group, heads, group * n, head_dim), keys, values, None, exact
    )
    out = out.view(batch // group, heads, group, n, head_dim).transpose(1, 2)
    return out.reshape(batch, heads, n, head_dim)


@dataclass(frozen=True)
class SlotBucket:
    """Queries of one row that attend to the same slots: columns [start, stop) of row `row`,
    against slots [0, slots)."""

    row: int
    start: int
    stop: int
    slots: int

    @property
    def columns(self) -> slice:
        return slice(self.start, self.stop)


def _slot_buckets(positions: torch.Tensor, max_slots: int) -> list[SlotBucket]:
    """positions: Tensor, shape = (batch, n), each row's increasing positions -> its columns
    grouped by the `SLOT_BUCKET`-wide bucket of their position."""
    buckets = []
    for row, row_positions in enumerate(positions.tolist()):
        ends = [min((p // SLOT_BUCKET + 1) * SLOT_BUCKET, max_slots) for p in row_positions]
        start = 0
        for column in range(1, len(ends) + 1):
            if column == len(ends) or ends[column] != ends[start]:
                buckets.append(SlotBucket(row, start, column, ends[start]))
                start = column
    return buckets


# The widest block a traced exact-mode call computes: its products pad it by 4 rows.
MAX_TRACED_EXACT_WIDTH = EXACT_ROWS.stop - 1 - TRACED_QUERY_PADDING


def exact_block_parts(positions: torch.Tensor, max_slots: int) -> tuple[int, int, int] | None:
    """How a traced exact-mode block of one row attends (`compute`'s traced_buckets): (its
    columns in its first slot bucket, that bucket's end, the next bucket's end; the same end
    twice where every column lies in the first). None where the block is not one row of
    consecutive positions (a position clamped at the end of the context repeats) or is wider
    than `MAX_TRACED_EXACT_WIDTH`. positions: Tensor, shape = (batch, n), increasing."""
    if positions.shape[0] != 1 or positions.shape[1] > MAX_TRACED_EXACT_WIDTH:
        return None
    row = positions[0].tolist()
    if row[-1] - row[0] != len(row) - 1:
        return None
    first = min((row[0] // SLOT_BUCKET + 1) * SLOT_BUCKET, max_slots)  # as `_slot_buckets`
    later = min((row[-1] // SLOT_BUCKET + 1) * SLOT_BUCKET, max_slots)
    return sum(p < first for p in row), first, later


def _attend_in_buckets(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    hidden: torch.Tensor,
    buckets: list[SlotBucket] | tuple[SlotBucket, ...],
    traced: bool = False,
) -> torch.Tensor:
    """Exact `_attend` of each bucket's queries against its slots (shapes as `_attend`'s;
    keys and values hold every slot, hidden at least the buckets' slots). traced: in
    `_attend_padded`'s products, a bucket of no columns included."""
    attend = _attend_padded if traced else functools.partial(_attend, exact=True)
    if len(buckets) == 1 and queries.shape[0] == 1:  # a plain step or a block within a bucket
        slots = buckets[0].slots
        return attend(queries, keys[..., :slots], values[:, :, :slots], hidden[..., :slots])
    out = queries.new_empty(queries.shape)
    for bucket in buckets:
        row, columns, slots = slice(bucket.row, bucket.row + 1), bucket.columns, bucket.slots
        out[row, :, columns] = attend(
            queries[row, :, columns],
            keys[row, ..., :slots],
            values[row, :, :slots],
            hidden[row, :, columns, :slots],
        )
    return out


def _exact_rows(dtype: torch.dtype) -> range:
    """Query rows per product that give a row the same bits in any product (module docstring).
    Only float32 is exact: half-precision products round sums that differ with the kernel, and
    the rounding hides it from random tests but not from real attention."""
    if dtype != torch.float32:
        raise ValueError(f"exact attention is float32 only, not {dtype}")
    return EXACT_ROWS


def _merge(states: torch.Tensor) -> torch.Tensor:
    """(batch, heads, n, head_dim) -> (batch, n, heads * head_dim)."""
    batch, heads, n, head_dim = states.shape
    return states.transpose(1, 2).reshape(batch, n, heads * head_dim)

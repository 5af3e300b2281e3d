"""Decoder steps captured as CUDA graphs and replayed: a GPU step without launch overhead.

A whisper-base decoder step on a GPU is a few hundred small kernels, and launching them from
Python costs far more than running them (H100: about 6 ms a token, where the arithmetic takes a
fraction of one). A CUDA graph records the launches of one step once and replays them with one
call. That needs the same tensors at the same addresses on every replay, so `StepGraphs` owns
static buffers for a pool of `size` rows: the slot cache (`asr.static_decoder`, whose shapes
never change: every slot, every encoder position), a step's tokens and positions, and its
logits. Each block width (1 for a plain step, k + 1 for a verification) is captured once, on
first use, and replayed from then on; a new batch of windows only copies its cross-attention
keys and values in.

Pools come in powers of two (`pool_size`): a batch of 5 windows decodes in a pool of 8 whose
last rows repeat its last window (computed and dropped), and when rows finish, the rest move to
a smaller pool (`adopt`). A model thus keeps at most log2(largest batch) pools.

A step attends to every cache slot, masked by position (`StaticDecoder.forward`'s every_slot),
since a graph cannot read positions on the host to pick the slots. A replay computes exactly
what the same step computes uncaptured (the same kernels in the same order), which
`tests/test_cuda.py` checks bit for bit; without CUDA (`capture` False) the same buffers run
eagerly, which the CPU tests use. `asr.graph_rounds` captures whole rounds (draft, verification,
rules, commit) on these pools' buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asr.static_decoder import SlotCache


def pool_size(rows: int) -> int:
    """The pool that holds `rows` rows: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # (size, width), long
    positions: torch.Tensor  # (size, width), long
    logits: torch.Tensor  # (size, width, vocab), float32


def _pad_rows(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """`tensor` with its last row repeated up to `size` rows."""
    missing = size - tensor.shape[0]
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor[-1:].expand(missing, *tensor.shape[1:])])


class StepGraphs:
    """A pool of `size` rows of one model's decoder, its steps captured (module docstring)."""

    def __init__(self, model, size: int, capture: bool = True) -> None:
        """model: an asr.whisper.WhisperModel; capture: record CUDA graphs (else run eagerly,
        on the same buffers)."""
        self.model, self.size, self.capture = model, size, capture
        runtime = model.runtime
        heads, head_dim = runtime.heads, runtime.head_dim
        positions = model.config.max_source_positions
        options = {"dtype": runtime.attention_dtype, "device": model.device}
        cross = []
        for _ in runtime.layers:  # laid out as EncodedAudio's (keys: transposed views)
            keys = torch.zeros((size, heads, head_dim, positions), **options)
            values = torch.zeros((size, heads, positions, head_dim), **options)
            cross.append((keys.transpose(-1, -2), values))
        self.cache = runtime.new_cache(cross)  # shares these buffers: no copy
        self.rows = size  # rows in use; the others repeat the last one
        self._graphs: dict[int, _Graph] = {}
        self._pool = None  # one memory pool for every width's graph

    def load(self, cross) -> SlotCache:
        """Holds a new batch: cross, `EncodedAudio.cross` of at most `size` windows."""
        self.rows = cross[0][0].shape[0]
        for index, (keys, values) in enumerate(cross):
            self.cache.cross_keys[index].copy_(_pad_rows(keys.transpose(-1, -2), self.size))
            self.cache.cross_values[index].copy_(_pad_rows(values, self.size))
        return self.cache

    def adopt(self, other: StepGraphs, rows: torch.Tensor) -> SlotCache:
        """Holds these rows of another pool (a batch whose finished rows left it): every
        self-attention slot and the cross-attention of each row."""
        self.rows = len(rows)
        picked = _pad_rows(rows, self.size)
        for name in ("keys", "values", "cross_keys", "cross_values"):
            for mine, theirs in zip(
                getattr(self.cache, name), getattr(other.cache, name), strict=True
            ):
                mine.copy_(theirs[picked])
        return self.cache

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        valid: torch.Tensor | None,
        exact: bool = False,
    ) -> torch.Tensor:
        """The decoder, uncaptured (a prompt, a block with padding), in fast mode or, for a
        target whose kernels allow it, exact mode (`asr.static_decoder`): states of the rows
        in use, Tensor, shape = (rows, width, d_model)."""
        padded = [
            None if t is None else _pad_rows(t, self.size) for t in (tokens, positions, valid)
        ]
        states = self.model.runtime.forward(
            padded[0], padded[1], self.cache, exact=exact, valid=padded[2]
        )
        return states[: self.rows]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The exact-mode decoder step and head: logits of the rows in use, Tensor, shape =
        (rows, width, vocab), valid until the next step. tokens, positions: Tensor, shape =
        (rows, width), every column valid."""
        tokens, positions = _pad_rows(tokens, self.size), _pad_rows(positions, self.size)
        if not self.capture:
            return self._run(tokens, positions)[: self.rows]
        width = tokens.shape[1]
        graph = self._graphs.get(width) or self._record(width)
        graph.tokens.copy_(tokens)
        graph.positions.copy_(positions)
        graph.graph.replay()
        return graph.logits[: self.rows]

    def _run(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        states = self.model.runtime.forward(
            tokens, positions, self.cache, exact=True, every_slot=True
        )
        return self.model.logits(states)

    def _record(self, width: int) -> _Graph:
        device = self.model.device
        tokens = torch.zeros((self.size, width), dtype=torch.long, device=device)
        # Warm-up and capture write the last slots, which a row rewrites before it reads them.
        top = self.model.max_context
        positions = torch.arange(top - width, top, device=device).repeat(self.size, 1)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # kernels pick their workspaces before the capture
            for _ in range(2):
                self._run(tokens, positions)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._run(tokens, positions)
        self._pool = graph.pool()
        recorded = _Graph(graph, tokens, positions, logits)
        self._graphs[width] = recorded
        return recorded

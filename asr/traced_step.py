"""Decoder blocks on CPU, traced (TorchScript) once per kind and block width.

A step of whisper-base-draft on a 2-core CPU is about 1.4 ms of kernels (two layers and a
34k-token head) and 0.6 ms of Python dispatching its few hundred operations; a target's int8
step spends about a quarter of its time in Python (4 of 16 ms inside a transcription here:
six layers, each product quantizing its rows in several small operations). A traced step runs
the same operations from TorchScript's interpreter, without the Python: the same aten calls
on the same tensors, so the same bits as the eager step (tests/test_traced_step.py).

What is traced:
- a draft's block's last logits (`_Step`), or, for the plain greedy chains transcription
  drafts, its greedy tokens (`_GreedyStep`), whose argmax over a reduced head's columns never
  fills a whole vocabulary with logits: fast-mode blocks of one row per window and at most
  `MAX_TRACED_WIDTH` tokens, traced on first use (about 0.1 s each); a draft's whole chain of
  greedy steps runs as one call (`_GreedyChain`, scripted over those traces), without
  returning to Python between its steps;
- a target's exact-mode block (`_ExactStep`: a plain step or a verification, every column's
  logits) of a window decoded alone: one trace for every block of up to 28 tokens, within one
  slot bucket or across two (`asr.static_decoder.exact_block_parts`; its attention products
  pad the queries by 4 rows whatever their count, so no operation depends on the width). It
  costs about 0.25 s to make and run once and saves about 4 ms a call (16 -> 12 ms, int8), so
  it is made on its `EXACT_TRACE_AFTER`-th call: a short recording never pays for it. Exact
  calls of several windows attend bucket by bucket, chosen on the host, and stay eager.

What a trace fixes and what it takes as inputs: the block's width (a draft's: one trace per
kind and width); the tokens, their positions, the cache's tensors and how many slots the step
attends to are inputs, and every shape follows theirs, so a draft's trace serves any batch
size. The slot count goes in as a tensor's shape, which the tracer records, so a step reads
only the slots in use (exact mode: its bucket's), as the eager step does. A draft's blocks have
no padding to skip (`asr.whisper_target.WhisperTarget`'s store_padding). A tree's rows share
their window's cross-attention (`SlotCache.group`) and are not traced.

`torch.jit.trace` is deprecated in favour of torch.compile and torch.export: on this CPU
torch.compile spends tens of seconds compiling what the trace records in a tenth of one, which
a command-line run cannot repay, and an exported program runs from Python again. Where tracing
fails, steps run eagerly (the same results, the speed of before).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from asr.int8 import Int8Linear
from asr.static_decoder import SlotBucket, exact_block_parts

if TYPE_CHECKING:
    from asr.static_decoder import SlotCache
    from asr.whisper import WhisperModel

log = logging.getLogger(__name__)


# Widest block traced: a draft block's first call feeds the 1 or 2 committed tokens its cache
# lacks (decoding.drafters.draft_block), its other calls 1; wider blocks (a draft's first
# block after a long rejection) are rare and run eagerly.
MAX_TRACED_WIDTH = 2
# A target's exact-mode trace is made on this call of it (module docstring): it costs about
# as much as 60 eager calls save.
EXACT_TRACE_AFTER = 64


class _Step(torch.nn.Module):
    """The module a trace records: `model`'s decoder over a block, then its last column's
    logits. Its products are registered as submodules, which tracing needs of every module it
    calls (int8 layers hold packed weights that only a registered module can carry)."""

    def __init__(self, model: WhisperModel) -> None:
        super().__init__()
        self.model = model
        products = [
            value
            for layer in model.runtime.layers
            for value in vars(layer).values()
            if isinstance(value, torch.nn.Module)
        ]
        head = model.output_head()
        if isinstance(head, torch.nn.Module):
            products.append(head)
        for product in products:
            if isinstance(product, Int8Linear):
                product.prepack()  # made now: a trace would record it as a step's operation
        self.products = torch.nn.ModuleList(products)

    def forward(self, tokens, positions, used_slots, keys, values, cross_keys, cross_values):
        states = self._states(tokens, positions, used_slots, keys, values, cross_keys, cross_values)
        return self.model.compute_logits(states[:, -1:])

    def _states(self, tokens, positions, used_slots, keys, values, cross_keys, cross_values):
        """The decoder's final states over the block (fast mode), its keys and values stored."""
        cache = _cache(keys, values, cross_keys, cross_values)
        return self.model.runtime.compute(tokens, positions, cache, slots=used_slots.shape[0])


class _GreedyStep(_Step):
    """`_Step` that returns its last column's greedy tokens instead of its logits
    (`WhisperModel.greedy_tokens`): a reduced head's scores never fill a whole vocabulary."""

    def forward(
        self, tokens, positions, used_slots, keys, values, cross_keys, cross_values, suppressed
    ):
        states = self._states(tokens, positions, used_slots, keys, values, cross_keys, cross_values)
        return self.model.greedy_tokens(states[:, -1], suppressed)


class _ExactStep(_Step):
    """A target's exact-mode block of one row: every column's logits, as a plain step or a
    verification call needs them. Its columns in their first slot bucket and in the next,
    and the two buckets' ends, enter as shapes (`asr.static_decoder.exact_block_parts`), so
    one trace serves every block of up to `asr.static_decoder.MAX_TRACED_EXACT_WIDTH` tokens."""

    def forward(
        self,
        tokens,
        positions,
        first_columns,
        first_slots,
        later_slots,
        keys,
        values,
        cross_keys,
        cross_values,
    ):
        split, width = first_columns.shape[0], tokens.shape[1]
        buckets = (
            SlotBucket(0, 0, split, first_slots.shape[0]),
            SlotBucket(0, split, width, later_slots.shape[0]),
        )
        cache = _cache(keys, values, cross_keys, cross_values)
        states = self.model.runtime.compute(
            tokens, positions, cache, exact=True, traced_buckets=buckets
        )
        return self.model.compute_logits(states)


class _GreedyChain(torch.nn.Module):
    """A draft's chain of greedy steps in one call (TorchScript, scripted over two traced
    `_GreedyStep`s): the block through `first`, then each step's token fed back through
    `later` (a one-token step), `steps` tokens in all. The steps and their inputs are the ones
    `decoding.drafters.draft_block` would make one call at a time (positions and slots clamped
    to the context as `asr.whisper_target.WhisperTarget` clamps them), so the tokens and the
    cache are the same; what goes is the Python between the steps (about 0.2 ms a step on
    this CPU, docs/decoder-runtime.md)."""

    def __init__(self, first: torch.nn.Module, later: torch.nn.Module, context: int) -> None:
        super().__init__()
        self.first = first
        self.later = later
        self.context = context

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        used_slots: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        cross_keys: list[torch.Tensor],
        cross_values: list[torch.Tensor],
        suppressed: torch.Tensor,
        steps: int,
    ) -> torch.Tensor:
        cache = (keys, values, cross_keys, cross_values)
        best = self.first(tokens, positions, used_slots, *cache, suppressed)
        chain = [best]
        last = positions[:, -1:]
        for step in range(1, steps):
            at = (last + step).clamp(max=self.context - 1)
            used = used_slots.new_empty(min(used_slots.shape[0] + step, self.context))
            best = self.later(best.unsqueeze(1), at, used, *cache, suppressed)
            chain.append(best)
        return torch.stack(chain, dim=1)


def _cache(keys, values, cross_keys, cross_values) -> SimpleNamespace:
    """A traced step's cache: the tensors of one window's rows (`SlotCache`'s fields)."""
    return SimpleNamespace(
        keys=keys, values=values, cross_keys=cross_keys, cross_values=cross_values, group=1
    )


class TracedSteps:
    """`model`'s traced blocks on CPU (module docstring): a draft's fast-mode blocks of up to
    `MAX_TRACED_WIDTH` tokens, traced on first use of each width, and a target's exact-mode
    blocks of one window, in one trace made on its `EXACT_TRACE_AFTER`-th call."""

    def __init__(self, model: WhisperModel) -> None:
        self.model = model
        # by the module traced and the block width (None: an exact trace serves every width)
        self.traced: dict[tuple[type, int | None], torch.jit.ScriptModule] = {}
        self.exact_eager_calls = 0  # exact blocks run eagerly before their trace is made
        self.failed = False  # tracing failed: steps stay eager
        self.chains_failed = False  # scripting a chain failed: single (traced) steps

    @staticmethod
    def applies(model: WhisperModel, tokens: torch.Tensor, keep: int, cache: SlotCache) -> bool:
        """Whether a draft's block is a traced step: at most `MAX_TRACED_WIDTH` tokens per row,
        of which only the last one's logits are kept, one row per window, on CPU, of a model
        that traces its steps (`WhisperModel.trace_steps`)."""
        narrow = tokens.shape[1] <= MAX_TRACED_WIDTH and keep == 1
        return narrow and TracedSteps._traces(model, cache)

    def logits(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: SlotCache
    ) -> torch.Tensor | None:
        """The last column's logits as `model.logits(model.decoder_states(...))[:, -1:]`
        computes them, with every column's keys and values stored in `cache`; None where no
        trace could be made (the caller steps eagerly). tokens, positions: Tensor, shape =
        (batch, width), every column valid. Returns Tensor, shape = (batch, 1, vocab)."""
        inputs = self._inputs(tokens, positions, cache, int(positions.max()) + 1)
        return self._run((_Step, tokens.shape[1]), lambda: _Step(self.model), inputs)

    def greedy_tokens(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SlotCache,
        suppressed_columns: torch.Tensor,
    ) -> torch.Tensor | None:
        """The argmax of `logits(...)` with these head columns masked
        (`WhisperModel.greedy_tokens`), the cache filled the same; None where no trace could be
        made. Returns Tensor, shape = (batch,), long."""
        slots = int(positions.max()) + 1
        inputs = (*self._inputs(tokens, positions, cache, slots), suppressed_columns)
        return self._run((_GreedyStep, tokens.shape[1]), lambda: _GreedyStep(self.model), inputs)

    def greedy_chain(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SlotCache,
        suppressed_columns: torch.Tensor,
        steps: int,
    ) -> torch.Tensor | None:
        """`steps` chained `greedy_tokens` calls in one (`_GreedyChain`): the block, then each
        token but the last fed back at the next position; the cache filled the same. None
        where the chain has no traces yet (it is made once the block's width and the
        one-token step are traced, which the caller's single steps do) or tracing failed.
        Returns Tensor, shape = (batch, steps), long."""
        width = tokens.shape[1]
        steps_traced = all((_GreedyStep, w) in self.traced for w in (width, 1))
        if self.failed or self.chains_failed or not steps_traced:
            return None
        key = (_GreedyChain, width)
        if key not in self.traced:
            first, later = self.traced[(_GreedyStep, width)], self.traced[(_GreedyStep, 1)]
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # deprecated, as tracing (module docstring)
                    chain = _GreedyChain(first, later, self.model.max_context)
                    self.traced[key] = torch.jit.script(chain)
            except Exception as error:  # TorchScript cannot script it here: single steps
                log.warning("draft chains of %s stay single steps: %s", self.model.name, error)
                self.chains_failed = True
                return None
        slots = int(positions.max()) + 1
        inputs = self._inputs(tokens, positions, cache, slots)
        with torch.jit.optimized_execution(False):
            return self.traced[key](*inputs, suppressed_columns, steps)

    def exact_logits(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: SlotCache, keep: int
    ) -> torch.Tensor | None:
        """A target's exact-mode block, as `model.logits(model.decoder_states(..., exact=True)
        [:, -keep:])` computes it, every column's keys and values stored in `cache`; None
        where it is not traced: more than one row, a tree's rows, repeated positions, more
        than `asr.static_decoder.MAX_TRACED_EXACT_WIDTH` tokens, before the trace's
        `EXACT_TRACE_AFTER`-th call, or a failed trace. tokens, positions: Tensor, shape =
        (batch, width), every column valid. Returns Tensor, shape = (1, keep, vocab)."""
        if self.failed or not self._traces(self.model, cache):
            return None
        parts = exact_block_parts(positions, cache.slots)
        if parts is None:
            return None
        key = (_ExactStep, None)  # one trace for every width
        if key not in self.traced and self.exact_eager_calls < EXACT_TRACE_AFTER - 1:
            self.exact_eager_calls += 1
            return None
        # (columns in the first bucket, its end, the next bucket's end), as shapes
        inputs = self._inputs(tokens, positions, cache, *parts)
        logits = self._run(key, lambda: _ExactStep(self.model), inputs)
        return None if logits is None else logits[:, -keep:]

    @staticmethod
    def _traces(model: WhisperModel, cache: SlotCache) -> bool:
        """Whether this model's blocks on this cache may be traced: on CPU, one row per window,
        where the model traces its steps."""
        return model.trace_steps and model.device.type == "cpu" and cache.group == 1

    @staticmethod
    def _inputs(tokens: torch.Tensor, positions: torch.Tensor, cache: SlotCache, *sizes: int):
        """A trace's inputs: the block, a tensor of each size (the slots attended, and for an
        exact block its columns in the first bucket: traced as shapes, not as constants), then
        the cache's tensors."""
        return (
            tokens,
            positions,
            *(tokens.new_empty(size) for size in sizes),
            cache.keys,
            cache.values,
            cache.cross_keys,
            cache.cross_values,
        )

    def _run(self, key: tuple, make: Callable[[], _Step], inputs: tuple) -> torch.Tensor | None:
        """Runs the trace for `key`, traced from `make()` if there is none yet; None where
        tracing failed (then every later step stays eager too)."""
        if self.failed:
            return None
        if key not in self.traced:
            traced = self._trace(make, inputs)
            if traced is None:
                self.failed = True
                return None
            self.traced[key] = traced
        # The simple executor: the profiling one spends about 0.1 s optimizing each trace on
        # its second call and then runs it no faster on this CPU (same bits either way).
        with torch.jit.optimized_execution(False):
            return self.traced[key](*inputs)

    def _trace(self, make: Callable[[], _Step], inputs: tuple) -> torch.jit.ScriptModule | None:
        """A trace of `make()` on these inputs. Tracing runs the step once, eagerly: the call
        that follows stores the same keys and values in the same slots again."""
        try:
            with warnings.catch_warnings():
                # Deprecation (module docstring), and the tracer's note that the block's width
                # is taken as a constant: it is, per trace.
                warnings.simplefilter("ignore")
                # Not storing the example inputs: they are the cache of the batch being
                # decoded (its cross-attention keys and values too, 37 MB a window), which the
                # trace would otherwise keep alive for the rest of the process.
                return torch.jit.trace(make(), inputs, check_trace=False, _store_inputs=False)
        except Exception as error:  # an operation the tracer cannot record: stay eager
            log.warning("decoder steps of %s stay eager: %s", self.model.name, error)
            return None

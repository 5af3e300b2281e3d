"""A draft's short decoder blocks on CPU, traced (TorchScript) once per kind and block width.

A step of whisper-base-draft on a 2-core CPU is about 1.4 ms of kernels (two layers and a
34k-token head) and 0.6 ms of Python dispatching its few hundred operations, and the draft's
step, not verification, is what drafting pays for on a CPU (docs/drafts.md). A traced step
runs the same operations from TorchScript's interpreter, without the Python: the same aten
calls on the same tensors, so the same bits as the eager step (tests/test_traced_step.py).

What a trace returns: the block's last logits (`_Step`), or, for the plain greedy chains
transcription drafts, its greedy tokens (`_GreedyStep`), whose argmax over a reduced head's
columns never fills a whole vocabulary with logits. What a trace fixes and what it takes as
inputs: the block's width (1 or 2 tokens: one trace per kind and width, made on first use in
about 0.1 s); the tokens, their positions, the cache's tensors and how many slots the step
attends to are inputs, and every shape follows theirs, so a trace serves any batch size. The
slot count goes in as a tensor's shape, which the tracer records, so a step reads only the
slots in use, as the eager fast mode does. A draft's blocks have no padding to skip
(`asr.whisper_target.WhisperTarget`'s store_padding). Only fast-mode steps of one row per
window are traced: a target's exact-mode calls choose their products by position on the host,
and a tree's rows share their window's cross-attention (`SlotCache.group`).

`torch.jit.trace` is deprecated in favour of torch.compile and torch.export: on this CPU
torch.compile spends tens of seconds compiling what the trace records in a tenth of one, which
a command-line run cannot repay, and an exported program runs from Python again. Where tracing
fails, steps run eagerly (the same results, the speed of before).
"""

from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from asr.static_decoder import SlotCache
    from asr.whisper import WhisperModel

log = logging.getLogger(__name__)


# Widest block traced: a draft block's first call feeds the 1 or 2 committed tokens its cache
# lacks (decoding.drafters.draft_block), its other calls 1; wider blocks (a draft's first
# block after a long rejection) are rare and run eagerly.
MAX_TRACED_WIDTH = 2


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
        self.products = torch.nn.ModuleList(products)

    def forward(self, tokens, positions, used_slots, keys, values, cross_keys, cross_values):
        states = self._states(tokens, positions, used_slots, keys, values, cross_keys, cross_values)
        return self.model.compute_logits(states[:, -1:])

    def _states(self, tokens, positions, used_slots, keys, values, cross_keys, cross_values):
        """The decoder's final states over the block, its keys and values stored."""
        cache = SimpleNamespace(
            keys=keys, values=values, cross_keys=cross_keys, cross_values=cross_values, group=1
        )
        return self.model.runtime.compute(tokens, positions, cache, slots=used_slots.shape[0])


class _GreedyStep(_Step):
    """`_Step` that returns its last column's greedy tokens instead of its logits
    (`WhisperModel.greedy_tokens`): a reduced head's scores never fill a whole vocabulary."""

    def forward(
        self, tokens, positions, used_slots, keys, values, cross_keys, cross_values, suppressed
    ):
        states = self._states(tokens, positions, used_slots, keys, values, cross_keys, cross_values)
        return self.model.greedy_tokens(states[:, -1], suppressed)


class TracedSteps:
    """`model`'s fast-mode blocks of up to `MAX_TRACED_WIDTH` tokens on CPU, traced on first
    use of each width."""

    def __init__(self, model: WhisperModel) -> None:
        self.model = model
        # by the module traced (logits or greedy tokens) and the block width
        self.traced: dict[tuple[type, int], torch.jit.ScriptModule] = {}
        self.failed = False  # tracing failed: steps stay eager

    @staticmethod
    def applies(model: WhisperModel, tokens: torch.Tensor, keep: int, cache: SlotCache) -> bool:
        """Whether a block is a traced step: at most `MAX_TRACED_WIDTH` tokens per row, of which
        only the last one's logits are kept, one row per window, on CPU, of a model that traces
        its steps (`WhisperModel.trace_steps`)."""
        cpu = model.device.type == "cpu"
        narrow = tokens.shape[1] <= MAX_TRACED_WIDTH and keep == 1
        return model.trace_steps and cpu and narrow and cache.group == 1

    def logits(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: SlotCache
    ) -> torch.Tensor | None:
        """The last column's logits as `model.logits(model.decoder_states(...))[:, -1:]`
        computes them, with every column's keys and values stored in `cache`; None where no
        trace could be made (the caller steps eagerly). tokens, positions: Tensor, shape =
        (batch, width), every column valid. Returns Tensor, shape = (batch, 1, vocab)."""
        return self._run(_Step, self._inputs(tokens, positions, cache))

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
        inputs = (*self._inputs(tokens, positions, cache), suppressed_columns)
        return self._run(_GreedyStep, inputs)

    @staticmethod
    def _inputs(tokens: torch.Tensor, positions: torch.Tensor, cache: SlotCache) -> tuple:
        return (
            tokens,
            positions,
            # The slots in use, as a shape: traced as an input, not as a constant.
            tokens.new_empty(int(positions.max()) + 1),
            cache.keys,
            cache.values,
            cache.cross_keys,
            cache.cross_values,
        )

    def _run(self, kind: type[_Step], inputs: tuple) -> torch.Tensor | None:
        """Runs `kind`'s trace for this block width, traced on first use; None where tracing
        failed (then every later step stays eager too)."""
        if self.failed:
            return None
        key = (kind, inputs[0].shape[1])
        if key not in self.traced:
            traced = self._trace(kind, inputs)
            if traced is None:
                self.failed = True
                return None
            self.traced[key] = traced
        return self.traced[key](*inputs)

    def _trace(self, kind: type[_Step], inputs: tuple) -> torch.jit.ScriptModule | None:
        """A trace of `kind` on these inputs. Tracing runs the step once, eagerly: the call
        that follows stores the same keys and values in the same slots again."""
        try:
            with warnings.catch_warnings():
                # Deprecation (module docstring), and the tracer's note that the block's width
                # is taken as a constant: it is, per trace.
                warnings.simplefilter("ignore")
                return torch.jit.trace(kind(self.model), inputs, check_trace=False)
        except Exception as error:  # an operation the tracer cannot record: stay eager
            log.warning("decoder steps of %s stay eager: %s", self.model.name, error)
            return None

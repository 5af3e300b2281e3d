"""A draft's one-token decoder steps on CPU, traced (TorchScript) once per batch size.

A step of whisper-base-draft on a 2-core CPU is about 1.4 ms of kernels (two layers and a
34k-token head) and 0.6 ms of Python dispatching its few hundred operations, and the draft's
step, not verification, is what drafting pays for on a CPU (docs/drafts.md). A traced step
runs the same operations from TorchScript's interpreter, without the Python: the same aten
calls on the same tensors, so the same bits as the eager step (tests/test_traced_step.py).

What a trace fixes and what it takes as inputs: the block is one token (one trace per
model, made on first use in about 0.1 s); the tokens, their positions, the cache's tensors and
how many slots the step attends to are inputs, and every shape follows theirs, so the trace
serves any batch size. The slot count goes in as a tensor's shape, which the tracer records,
so a step reads only the slots in use, as the eager fast mode does. Only fast-mode steps of
one row per window are traced: a target's exact-mode calls choose their products by position
on the host, and a tree's rows share their window's cross-attention (`SlotCache.group`).

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


class _Step(torch.nn.Module):
    """The module a trace records: `model`'s decoder over a one-token block, then its logits.
    Its products are registered as submodules, which tracing needs of every module it calls
    (int8 layers hold packed weights that only a registered module can carry)."""

    def __init__(self, model: WhisperModel) -> None:
        super().__init__()
        self.model = model
        products = [
            value
            for layer in model.runtime.layers
            for value in vars(layer).values()
            if isinstance(value, torch.nn.Module)
        ]
        self.products = torch.nn.ModuleList(products)
        head = model.output_head()
        self.head = head if isinstance(head, torch.nn.Module) else torch.nn.Identity()

    def forward(self, tokens, positions, used_slots, keys, values, cross_keys, cross_values):
        cache = SimpleNamespace(
            keys=keys, values=values, cross_keys=cross_keys, cross_values=cross_values, group=1
        )
        states = self.model.runtime.compute(tokens, positions, cache, slots=used_slots.shape[0])
        return self.model.compute_logits(states)


class TracedSteps:
    """`model`'s one-token fast-mode steps on CPU, traced on first use."""

    def __init__(self, model: WhisperModel) -> None:
        self.model = model
        self.traced: torch.jit.ScriptModule | None = None
        self.failed = False  # tracing failed: steps stay eager

    @staticmethod
    def applies(model: WhisperModel, tokens: torch.Tensor, cache: SlotCache) -> bool:
        """Whether a block is a traced step: one token per row, one row per window, on CPU, of
        a model that traces its steps (`WhisperModel.trace_steps`)."""
        cpu = model.device.type == "cpu"
        return model.trace_steps and cpu and tokens.shape[1] == 1 and cache.group == 1

    def logits(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: SlotCache
    ) -> torch.Tensor | None:
        """The block's logits as `model.logits(model.decoder_states(...))` computes them, with
        its keys and values stored in `cache`; None where no trace could be made (the caller
        steps eagerly). tokens, positions: Tensor, shape = (batch, 1). Returns Tensor, shape =
        (batch, 1, vocab)."""
        if self.failed:
            return None
        inputs = (
            tokens,
            positions,
            # The slots in use, as a shape: traced as an input, not as a constant.
            tokens.new_empty(int(positions.max()) + 1),
            cache.keys,
            cache.values,
            cache.cross_keys,
            cache.cross_values,
        )
        if self.traced is None:
            self.traced = self._trace(inputs)
            self.failed = self.traced is None
            if self.failed:
                return None
        return self.traced(*inputs)

    def _trace(self, inputs: tuple) -> torch.jit.ScriptModule | None:
        """A trace of `_Step` on these inputs. Tracing runs the step once, eagerly: the call
        that follows stores the same keys and values in the same slots again."""
        try:
            with warnings.catch_warnings():
                # Deprecation (module docstring), and the tracer's note that the block's one
                # column is taken as a constant: it is, in every traced step.
                warnings.simplefilter("ignore")
                return torch.jit.trace(_Step(self.model), inputs, check_trace=False)
        except Exception as error:  # an operation the tracer cannot record: stay eager
            log.warning("decoder steps of %s stay eager: %s", self.model.name, error)
            return None

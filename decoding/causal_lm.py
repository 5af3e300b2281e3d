"""transformers causal LMs as Targets (and, through ModelDrafter, as drafters).

Duck-typed: any model called as model(input_ids=, position_ids=, attention_mask=,
past_key_values=, use_cache=True, logits_to_keep=) that returns `.logits` and a cache with
`crop(-n)` (negative: drop the last n columns), `get_seq_length()` and
`batch_select_indices(rows)` works; transformers itself is never imported here.

A DynamicCache grows and crops all rows together, while rows of a batch keep different numbers
of tokens (prompts of different lengths, different acceptance lengths). So positions are explicit
per row, and a column of the cache that holds nothing for a row (padding, a rejected draft token
that other rows still need the column for) stays as a hole that the attention mask hides.
Columns that are holes in every row at the end of the cache are cropped.

Sliding-window layers (Gemma 2/3, Mistral) count columns, not positions, and transformers cannot
crop them once full, so a row may not outgrow the smallest window: that raises rather than
silently changing the output.
"""

from __future__ import annotations

import copy

import torch

from decoding.projection import OutputProjection


class CacheLayout:
    """Which cache column holds which position, per row.

    valid: Tensor[bool], shape = (batch, columns); positions: Tensor, shape = (batch, columns).
    """

    def __init__(self, batch: int, device: torch.device) -> None:
        self.valid = torch.zeros((batch, 0), dtype=torch.bool, device=device)
        self.positions = torch.zeros((batch, 0), dtype=torch.long, device=device)
        self.has_holes = False

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def cached_lengths(self) -> torch.Tensor:
        """Tensor, shape = (batch,): how many positions each row has cached (always a prefix)."""
        return self.valid.sum(dim=1)

    def append(self, positions: torch.Tensor, mask: torch.Tensor, mask_is_full: bool) -> None:
        self.valid = torch.cat([self.valid, mask], dim=1)
        self.positions = torch.cat([self.positions, positions], dim=1)
        self.has_holes = self.has_holes or not mask_is_full

    def rollback(self, lengths: torch.Tensor) -> int:
        """Invalidates positions >= lengths[r]; returns how many trailing columns to crop."""
        self.valid &= self.positions < lengths.unsqueeze(1)
        return self._trim()

    def keep_rows(self, rows: torch.Tensor) -> int:
        """Keeps these rows; returns how many trailing columns to crop."""
        self.valid = self.valid[rows]
        self.positions = self.positions[rows]
        return self._trim()

    def _trim(self) -> int:
        if self.width == 0:
            return 0
        used = self.valid.any(dim=0)
        columns = torch.arange(1, self.width + 1, device=used.device)
        kept, total_valid = torch.stack([(columns * used).max(), self.valid.sum()]).tolist()
        dropped = self.width - kept
        self.valid = self.valid[:, :kept]
        self.positions = self.positions[:, :kept]
        self.has_holes = total_valid != self.valid.numel()
        return dropped


def attention_mask(
    layouts: list[CacheLayout], block_mask: torch.Tensor, block_is_full: bool
) -> torch.Tensor | None:
    """2-D mask over cached columns then the new block; None when nothing is hidden, which keeps
    transformers on its fastest attention path (no materialised mask)."""
    if block_is_full and not any(layout.has_holes for layout in layouts):
        return None
    return torch.cat([layout.valid for layout in layouts] + [block_mask], dim=1).long()


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


class OutputHead:
    """A causal LM's output layer (an OutputProjection), then Gemma 2's logit soft-capping.

    `of` returns None for models whose head is not a plain linear layer (a quantized one, say);
    they keep their own forward.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, softcap: float | None):
        self.projection = OutputProjection(weight, bias)
        self.softcap = softcap

    @classmethod
    def of(cls, model: torch.nn.Module) -> OutputHead | None:
        head = getattr(model, "lm_head", None)
        if type(head) is not torch.nn.Linear or not hasattr(model, "model"):
            return None
        # One per weight: its OutputProjection copies the weight once (decoding.projection),
        # and a drafter wraps its model anew for every generation.
        cached = getattr(head, "_specscribe_output_head", None)
        if cached is not None and cached.projection.weight.data_ptr() == head.weight.data_ptr():
            return cached
        softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
        built = cls(head.weight, head.bias, softcap)
        head._specscribe_output_head = built
        return built

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        """states: Tensor, shape = (batch, n, d_model) -> logits, shape = (batch, n, vocab)."""
        logits = self.projection(states)
        if self.softcap:  # Gemma 2's final logit soft-capping, as its own forward applies it
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _forward(model, head: OutputHead | None, keep: int, **inputs):
    """(logits of the last `keep` positions, cache): through `head` when there is one."""
    if head is None:
        output = model(**inputs, logits_to_keep=keep)
        return output.logits, output.past_key_values
    output = model.model(**inputs)
    return head(output.last_hidden_state[:, -keep:]), output.past_key_values


class CausalLM:
    """A Target over a transformers causal LM instance (AutoModelForCausalLM, in eval mode)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = _device_of(model)
        self.head = OutputHead.of(model)
        self.cache = None
        self.layout: CacheLayout | None = None

    def reset(self) -> None:
        self.cache = None
        self.layout = None

    def score(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: int
    ) -> torch.Tensor:
        if self.layout is None:
            self.layout = CacheLayout(tokens.shape[0], self.device)
        _check_window(self.cache, self.layout.width + tokens.shape[1])
        mask_is_full = bool(mask.all())
        logits, self.cache = _forward(
            self.model,
            self.head,
            keep,
            input_ids=tokens,
            position_ids=positions,
            attention_mask=attention_mask([self.layout], mask, mask_is_full),
            past_key_values=self.cache,
            use_cache=True,
        )
        self.layout.append(positions, mask, mask_is_full)
        return logits

    def rollback(self, lengths: torch.Tensor) -> None:
        if self.layout is not None:
            _crop(self.cache, self.layout.rollback(lengths))

    def keep_rows(self, rows: torch.Tensor) -> None:
        if self.layout is not None:
            self.cache.batch_select_indices(rows)
            _crop(self.cache, self.layout.keep_rows(rows))

    def early_exit(self, exit_layer: int) -> EarlyExitLM:
        """This model cut after `exit_layer` decoder layers, sharing weights and KV cache."""
        return EarlyExitLM(self, exit_layer)


def _check_window(cache, width: int) -> None:
    windows = [
        layer.sliding_window
        for layer in getattr(cache, "layers", ())
        if getattr(layer, "is_sliding", False)
    ]
    if windows and width >= min(windows):
        raise NotImplementedError(
            f"a cache of {width} columns would outgrow the sliding attention window "
            f"({min(windows)}), which cannot be rolled back exactly"
        )


def _crop(cache, columns: int) -> None:
    if columns:
        cache.crop(-columns)


class EarlyExitLM:
    """The first `exit_layer` decoder layers of a CausalLM, then its final norm and lm_head.

    For Llama-style models (`model.model.layers`, `model.model.norm`, `model.lm_head`); the model's
    own forward runs on a shallow copy whose layer list is cut, so rotary embeddings and masks
    are built exactly as in the full model, and every weight is shared.

    The KV cache is shared too: the first layers of the target hold, for every committed token,
    exactly the keys and values these layers compute. Drafting appends entries to those layers
    only (an "extension"), and `discard` crops them before the target verifies, because the
    target recomputes the drafted positions in every layer. Before the target has a cache (the
    first step of a batch) the extension lives in a private cache. Needs a cache whose per-layer
    entries can be cropped alone (transformers >= 5 `cache.layers[i].crop`).
    """

    def __init__(self, target: CausalLM, exit_layer: int) -> None:
        depth = len(target.model.model.layers)
        if not 1 <= exit_layer < depth:
            raise ValueError(f"exit_layer must be in [1, {depth - 1}] (got {exit_layer})")
        self.target = target
        self.exit_layer = exit_layer
        self.device = target.device
        self.view = _truncated_view(target.model, exit_layer)
        self._private_cache = None
        self._extension: CacheLayout | None = None

    def cached_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Tensor, shape = (batch,): positions the shared cache already holds for each row."""
        if self.target.layout is None:
            return torch.zeros_like(lengths)
        return self.target.layout.cached_lengths()

    def score(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: int
    ) -> torch.Tensor:
        if self._extension is None:
            self._extension = CacheLayout(tokens.shape[0], self.device)
        shared = self.target.cache
        layouts = [self._extension] if shared is None else [self.target.layout, self._extension]
        mask_is_full = bool(mask.all())
        logits, cache = _forward(
            self.view,
            self.target.head,  # the target's own head, already transposed
            keep,
            input_ids=tokens,
            position_ids=positions,
            attention_mask=attention_mask(layouts, mask, mask_is_full),
            past_key_values=self._private_cache if shared is None else shared,
            use_cache=True,
        )
        if shared is None:
            self._private_cache = cache
        self._extension.append(positions, mask, mask_is_full)
        return logits

    def discard(self) -> None:
        """Drops everything drafted since the last discard, leaving the target's cache as it was."""
        if self._extension is not None and self.target.cache is not None:
            for layer in self.target.cache.layers[: self.exit_layer]:
                layer.crop(-self._extension.width)
        self._private_cache = None
        self._extension = None


def _truncated_view(model: torch.nn.Module, exit_layer: int) -> torch.nn.Module:
    """A shallow copy of `model` whose decoder layer list stops at `exit_layer`.

    The module dictionaries are copied before the swap, so the original model is untouched.
    """
    decoder = copy.copy(model.model)
    decoder._modules = dict(decoder._modules)
    decoder._modules["layers"] = torch.nn.ModuleList(list(model.model.layers)[:exit_layer])
    view = copy.copy(model)
    view._modules = dict(view._modules)
    view._modules["model"] = decoder
    return view

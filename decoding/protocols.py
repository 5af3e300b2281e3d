"""What the decoding loop needs from a target model and from a drafter.

Shapes: `batch` rows decode together; a row's committed tokens are `committed[r, : lengths[r]]`
(prompt then generated tokens, right-padded); `k` is the draft block length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from decoding.verify import Sampler

NO_TOKEN = -1
"""Fills a draft block after the end of a row's proposals (rows stop drafting independently)."""


@dataclass(frozen=True)
class Draft:
    """Proposed continuations, one block per row.

    tokens: Tensor, shape = (batch, k); NO_TOKEN after each row's last proposal.
    q: Tensor, shape = (batch, k, vocab); the draft distribution each token was sampled from, or
       None when the proposals are a deterministic function of the committed tokens (greedy draft
       models, n-gram lookup, cross-tokenizer drafts), which verification treats as one-hot q.
    steps: draft model forward passes spent on this block.
    """

    tokens: torch.Tensor
    q: torch.Tensor | None = None
    steps: int = 0


@dataclass(frozen=True)
class DraftRequest:
    """What the loop asks a drafter for at one step: up to k tokens after each row's committed
    tokens. One object rather than six arguments, so a drafter that does not use a setting
    (n-gram lookup has no confidence to stop on) simply ignores its field.

    committed: Tensor, shape = (batch, capacity); row r's tokens are committed[r, : lengths[r]].
    lengths: Tensor, shape = (batch,).
    k: the block length; a row may propose fewer (NO_TOKEN after its last proposal).
    stop_below: a row's block ends before a token whose top draft probability is lower.
    sampler: None for greedy drafts; otherwise draft tokens are sampled and `q` returned.
    stop_joint: stop_below bounds the product of the block's top probabilities so far (the
        draft's own estimate that the whole block up to this token is accepted) instead.
    branches: rows come in groups of this many consecutive rows with the same committed
        tokens (greedy tree drafting, `decoding.generate`); row r starts its block with the
        draft's (r % branches)-th best token and continues greedily. 1: one chain per row.
    """

    committed: torch.Tensor
    lengths: torch.Tensor
    k: int
    stop_below: float = 0.0
    sampler: Sampler | None = None
    stop_joint: bool = False
    branches: int = 1


class Target(Protocol):
    """A model that scores blocks of tokens and keeps a cache it can roll back, per row.

    A target may also have `width_invariant = True`: each position of a block scores (and
    caches) the same bits whatever else the block holds, the prompts' first call included,
    so `decoding.generate` may verify a draft in the call that scores the prompts.
    """

    device: torch.device

    def reset(self) -> None:
        """Forget every row: the next `score` starts a new batch from position 0."""

    def score(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: int
    ) -> torch.Tensor:
        """Appends a block to every row's cache and returns the logits of its last `keep` columns.

        tokens: Tensor, shape = (batch, width)
        positions: Tensor, shape = (batch, width); each token's position in its row's sequence.
        mask: Tensor[bool], shape = (batch, width); False marks padding, never attended to.
        Returns Tensor, shape = (batch, keep, vocab); entry j predicts the token that follows
        column width - keep + j.
        """

    def rollback(self, lengths: torch.Tensor) -> None:
        """Forgets cached tokens at positions >= lengths[r]. Tensor, shape = (batch,)."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keeps only these rows, in this order (finished rows leave the batch). shape = (n,)."""


@runtime_checkable
class GreedyTarget(Target, Protocol):
    """A target that can give a chain of its greedy tokens more cheaply than their logits."""

    def greedy_chain(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, steps: int
    ) -> torch.Tensor:
        """`steps` greedy tokens per row: the first is `score(tokens, positions, mask,
        keep=1)[:, -1].argmax(dim=-1)`, each next one that of the token before it scored at
        the position after it. The same tokens and the same cache (the block and the first
        `steps - 1` tokens), without building the logits where the model can avoid it (a draft
        with a reduced head takes the argmax over its head's columns) and without returning to
        the caller between steps where it need not. Returns Tensor, shape = (batch, steps),
        long."""


class BranchingTarget(Target, Protocol):
    """A target that tree drafting can use: rows can take each other's cached positions."""

    def copy_positions(
        self, source: torch.Tensor, starts: torch.Tensor, stops: torch.Tensor
    ) -> None:
        """Row r takes row source[r]'s cached positions starts[r] .. stops[r] - 1 (rows with
        source[r] == r keep theirs). Tensors, shape = (batch,)."""


class Drafter(Protocol):
    """Proposes up to k tokens per row; verification decides what is kept."""

    def reset(self) -> None:
        """Forgets every row; the first `propose` of a batch prefills from the prompt."""

    def propose(self, request: DraftRequest) -> Draft:
        """Drafts up to request.k tokens after each row's committed tokens (`DraftRequest`)."""

    def rollback(self, committed: torch.Tensor, lengths: torch.Tensor) -> None:
        """Called after verification with the new committed rows: drops state past them."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keeps only these rows, in this order. Tensor, shape = (n,)."""

"""Drafters: where proposals come from. Verification makes every one of them lossless."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from decoding.protocols import NO_TOKEN, Draft, Drafter, DraftRequest, GreedyTarget, Target
from decoding.verify import best_tokens


def draft_block(model: Target, request: DraftRequest, cached: torch.Tensor) -> Draft:
    """Drafts up to request.k tokens per row, one model step each, after first feeding what is
    uncached.

    model caches positions < cached[r] of row r on entry; on exit it also holds every committed
    position and the first `steps - 1` drafted tokens (the last one is never fed).
    cached: Tensor, shape = (batch,).
    """
    committed, lengths, k = request.committed, request.lengths, request.k
    stop_below, sampler, stop_joint = request.stop_below, request.sampler, request.stop_joint
    # Right-align the uncached tails so every row's last committed token is the last column.
    width = int((lengths - cached).max())
    positions = lengths.unsqueeze(1) - width + torch.arange(width, device=lengths.device)
    mask = positions >= cached.unsqueeze(1)
    positions = positions.clamp(min=0)
    block = committed.gather(1, positions)
    # Plain greedy chains need only each step's best token, which a GreedyTarget gives without
    # building its logits, in one call; a tree's root needs the ranks, a confidence stop the
    # probabilities.
    if sampler is None and not stop_below and isinstance(model, GreedyTarget):
        if request.branches == 1:
            return Draft(tokens=model.greedy_chain(block, positions, mask, k), steps=k)
        root = _ranked_tokens(model.score(block, positions, mask, keep=1)[:, -1], request.branches)
        tokens = root.unsqueeze(1)
        if k > 1:  # each chain drafted on greedily from its root
            chain = model.greedy_chain(
                tokens, lengths.unsqueeze(1), torch.ones_like(mask[:, :1]), k - 1
            )
            tokens = torch.cat([tokens, chain], dim=1)
        return Draft(tokens=tokens, steps=k)

    logits = model.score(block, positions, mask, keep=1)[:, -1]
    drafting = torch.ones_like(lengths, dtype=torch.bool)
    joint = torch.ones(lengths.shape, device=lengths.device)  # product of the block's confidences
    every_column = torch.ones_like(drafting).unsqueeze(1)
    tokens, q = [], []
    for j in range(k):
        if sampler is None:
            if j == 0 and request.branches > 1:  # a tree's root: each row of a group its rank
                token = _ranked_tokens(logits, request.branches)
            else:
                token = best_tokens(logits)
            confidence = logits.float().softmax(dim=-1).amax(dim=-1) if stop_below else None
        else:
            probs = sampler.probs(logits)
            token = sampler.draw(probs)
            confidence = probs.amax(dim=-1)
            q.append(probs)
        if stop_below:
            if stop_joint:
                joint = joint * confidence
                confidence = joint
            drafting &= confidence >= stop_below
            token = torch.where(drafting, token, NO_TOKEN)
        tokens.append(token)
        if j == k - 1 or (stop_below and not bool(drafting.any())):
            break
        # Stopped rows keep feeding a dummy token: the batch steps together, rollback drops it.
        feed = token.clamp(min=0).unsqueeze(1)
        logits = model.score(feed, (lengths + j).unsqueeze(1), every_column, keep=1)[:, -1]
    return Draft(
        tokens=torch.stack(tokens, dim=1),
        q=torch.stack(q, dim=1) if q else None,
        steps=len(tokens),
    )


def _ranked_tokens(logits: torch.Tensor, branches: int) -> torch.Tensor:
    """Row r's (r % branches)-th best token: the rows of a group start a tree's chains from the
    draft's best tokens in turn. Tensor, shape = (batch, vocab) -> (batch,)."""
    rank = torch.arange(logits.shape[0], device=logits.device) % branches
    return logits.topk(branches, dim=-1).indices.gather(1, rank.unsqueeze(1)).squeeze(1)


class ModelDrafter:
    """A smaller causal LM over the target's vocabulary, with a cache of its own.

    It remembers which token it fed at each position; after verification its cache keeps the
    longest prefix that still agrees with the committed tokens (never the last committed token,
    whose logits the next block needs), so rollback needs no knowledge of what was accepted.

    context: the most positions its model can hold (its context, or a sliding window its cache
    cannot roll back; None: no limit). A block is cut to fit, and once the sequence fills it the
    drafter proposes nothing: the target decodes on alone, its output unchanged (a draft with a
    shorter context than its target's ended the generation with an error).
    """

    def __init__(self, model: Target, context: int | None = None) -> None:
        self.model = model
        self.context = context
        self._fed: torch.Tensor | None = None  # (batch, positions): token fed at each position
        self._cached: torch.Tensor | None = None  # (batch,): positions cached and valid

    def reset(self) -> None:
        self.model.reset()
        self._fed = None
        self._cached = None

    def propose(self, request: DraftRequest) -> Draft:
        committed, lengths = request.committed, request.lengths
        if self.context is not None:
            # A block of k feeds the committed tokens and k - 1 drafted ones.
            room = self.context - int(lengths.max())
            if room < 1:
                return Draft(tokens=committed.new_full((len(lengths), 0), NO_TOKEN))
            request = replace(request, k=min(request.k, room))
        if self._cached is None:
            self._cached = torch.zeros_like(lengths)
        draft = draft_block(self.model, request, self._cached)
        fed_drafts = draft.tokens[:, : draft.steps - 1].clamp(min=0)
        width = int(lengths.max()) + fed_drafts.shape[1]
        fed = _pad_columns(committed, width)[:, :width].clone()
        offsets = torch.arange(fed_drafts.shape[1], device=lengths.device)
        fed.scatter_(1, lengths.unsqueeze(1) + offsets, fed_drafts)
        self._fed = fed
        self._cached = lengths + fed_drafts.shape[1]
        return draft

    def rollback(self, committed: torch.Tensor, lengths: torch.Tensor) -> None:
        if self._fed is None:
            return
        width = self._fed.shape[1]
        agrees = self._fed == _pad_columns(committed, width)[:, :width]
        agreed = agrees.cumprod(dim=1).sum(dim=1)
        self._cached = torch.minimum(torch.minimum(agreed, self._cached), lengths - 1)
        self.model.rollback(self._cached)

    def keep_rows(self, rows: torch.Tensor) -> None:
        # Also before the first proposal: a model that has scored nothing yet must still drop
        # the rows (a Whisper draft narrows the windows whose audio it will attend to).
        self.model.keep_rows(rows)
        if self._fed is not None:
            self._fed = self._fed[rows]
            self._cached = self._cached[rows]


def _pad_columns(tokens: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - tokens.shape[1]
    return torch.nn.functional.pad(tokens, (0, missing), value=NO_TOKEN) if missing > 0 else tokens


class EarlyExitModel(Target, Protocol):
    """A shallow slice of the target that shares its KV cache (see causal_lm.EarlyExitLM)."""

    def cached_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Positions per row that the target's cache holds. shape = (batch,)."""

    def discard(self) -> None:
        """Drops what drafting appended to the shared cache."""


class EarlyExitDrafter:
    """Self-speculation: the target's own first layers, norm and lm_head draft.

    Shares the target's weights and KV cache: the committed tokens' keys and values in the first
    layers are the target's, so nothing is prefilled twice; drafted entries are discarded before
    the target verifies. Rollback and row removal are therefore the target's own.
    """

    def __init__(self, model: EarlyExitModel) -> None:
        self.model = model

    def reset(self) -> None:
        self.model.discard()

    def propose(self, request: DraftRequest) -> Draft:
        draft = draft_block(self.model, request, self.model.cached_lengths(request.lengths))
        self.model.discard()
        return draft

    def rollback(self, committed: torch.Tensor, lengths: torch.Tensor) -> None:
        """The target's rollback already rolled the shared cache back."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        """The target's keep_rows already selected the shared cache's rows."""


class PromptLookupDrafter:
    """n-gram lookup: find the row's last n tokens earlier in prompt + generated text and propose
    what followed (transformers' prompt_lookup_num_tokens). Tries n = max_ngram down to
    min_ngram and takes the most recent occurrence, as recent text predicts best; a continuation
    that runs into the present repeats with the match's period, so loops are drafted in full.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def reset(self) -> None:
        """Stateless."""

    def propose(self, request: DraftRequest) -> Draft:
        committed, lengths, k = request.committed, request.lengths, request.k
        tokens = torch.full((len(lengths), k), NO_TOKEN, dtype=torch.long, device=lengths.device)
        for row, length in enumerate(lengths.tolist()):
            continuation = self._lookup(committed[row, :length], k)
            tokens[row, : len(continuation)] = continuation
        return Draft(tokens=tokens)

    def _lookup(self, sequence: torch.Tensor, k: int) -> torch.Tensor:
        length = len(sequence)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            earlier = sequence[:-1].unfold(0, n, 1)  # every n-gram that has a successor
            starts = (earlier == sequence[-n:]).all(dim=1).nonzero().flatten()
            if len(starts):
                start = int(starts[-1]) + n
                period = length - start
                return sequence[start + torch.arange(k, device=sequence.device) % period]
        return sequence[:0]

    def rollback(self, committed: torch.Tensor, lengths: torch.Tensor) -> None:
        """Stateless."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Stateless."""


class LookupBranchDrafter:
    """A tree whose last chain follows prompt lookup: `drafter` proposes every chain of a
    group of `branches` rows (from its best first tokens, `DraftRequest.branches`), and where
    n-gram lookup over the group's text proposes a chain that the draft's greedy chain does not
    already hold, the group's last row proposes it instead of the draft's `branches`-th best.

    The lookup chain costs no draft step, and verification keeps only what the target would
    have chosen, so the output is unchanged. The inner drafter's cache follows what it fed
    itself, not what was proposed (ModelDrafter compares its fed tokens with the committed
    ones), so overriding a row's proposals leaves its rollback correct.
    """

    def __init__(self, drafter: Drafter, lookup: PromptLookupDrafter, branches: int) -> None:
        if branches < 2:
            raise ValueError(f"a lookup branch needs a tree of at least 2 chains (got {branches})")
        self.drafter = drafter
        self.lookup = lookup
        self.branches = branches
        self.lookup_chains = 0  # blocks whose last chain came from lookup, since reset

    def reset(self) -> None:
        self.drafter.reset()
        self.lookup_chains = 0

    def propose(self, request: DraftRequest) -> Draft:
        if request.branches != self.branches or request.sampler is not None:
            raise ValueError(
                f"a lookup branch drafts greedy trees of {self.branches} chains "
                f"(asked for {request.branches}{', sampled' if request.sampler else ''})"
            )
        draft = self.drafter.propose(request)
        firsts = torch.arange(0, len(request.lengths), self.branches, device=request.lengths.device)
        looked_up = self.lookup.propose(
            replace(request, committed=request.committed[firsts], lengths=request.lengths[firsts])
        ).tokens
        greedy = draft.tokens[firsts]
        # Lookup adds a chain where it proposes something the greedy chain does not start with.
        proposes = looked_up[:, 0] != NO_TOKEN
        width = min(greedy.shape[1], looked_up.shape[1])
        differs = (looked_up[:, :width] != greedy[:, :width]) & (looked_up[:, :width] != NO_TOKEN)
        replaced = proposes & differs.any(dim=1)
        if not bool(replaced.any()):
            return draft
        tokens = draft.tokens.clone()
        last_rows = firsts[replaced] + self.branches - 1
        chain = torch.full_like(tokens[last_rows], NO_TOKEN)
        chain[:, :width] = looked_up[replaced, :width]
        tokens[last_rows] = chain
        self.lookup_chains += int(replaced.sum())
        return replace(draft, tokens=tokens)

    def rollback(self, committed: torch.Tensor, lengths: torch.Tensor) -> None:
        self.drafter.rollback(committed, lengths)

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.drafter.keep_rows(rows)


Encode = Callable[[str], list[int]]
Decode = Callable[[Sequence[int]], str]


@dataclass
class _RowText:
    """How far one row's committed target tokens have been carried over into draft tokens."""

    synced: int = 0  # target tokens folded into `text`
    text: str = ""
    anchor: int = 0  # length of the prefix of `text` that `frozen` encodes
    frozen: list[int] = field(default_factory=list)


class CrossTokenizerDrafter:
    """Drafts with a model whose tokenizer differs from the target's (Universal Assisted
    Generation): committed target tokens -> text -> draft tokens -> draft -> text -> target tokens.

    Tokenizations do not compose at a boundary ("ab" may be one token, "a" + "b" two), so both
    directions re-encode a window of trailing text and keep only what lies past the old tokens:
    - target -> draft: the text is extended incrementally; the draft tokens of all but the last
      `window` of them are frozen and the rest is re-encoded every step;
    - draft -> target: the drafted text is appended to the text of the last `window` committed
      target tokens, re-encoded, and the tokens past those committed ones proposed (if the
      committed tokens are not reproduced, the drafted text is encoded alone).
    The inner drafter's cache follows the draft-token sequence even where re-encoding changed
    its end (ModelDrafter keeps only the prefix that still agrees).

    Proposals are deterministic given the committed tokens (the inner drafter runs greedy), so
    under sampling q is one-hot at the proposal, which keeps speculative sampling exact.
    The callables must not add special tokens and must round-trip: decode(encode(s)) == s.
    """

    def __init__(
        self,
        drafter: Drafter,
        target_encode: Encode,
        target_decode: Decode,
        draft_encode: Encode,
        draft_decode: Decode,
        window: int = 8,
    ) -> None:
        self.drafter = drafter
        self.target_encode, self.target_decode = target_encode, target_decode
        self.draft_encode, self.draft_decode = draft_encode, draft_decode
        self.window = window
        self._rows: list[_RowText] = []

    def reset(self) -> None:
        self.drafter.reset()
        self._rows = []

    def propose(self, request: DraftRequest) -> Draft:
        committed, lengths, k = request.committed, request.lengths, request.k
        if not self._rows:
            self._rows = [_RowText() for _ in range(len(lengths))]
        target_rows = [
            committed[row, :length].tolist() for row, length in enumerate(lengths.tolist())
        ]
        contexts = [
            self._to_draft(ids, state) for ids, state in zip(target_rows, self._rows, strict=True)
        ]
        draft_committed, draft_lengths = _stack_rows(contexts, committed.device)
        self.drafter.rollback(draft_committed, draft_lengths)
        # Greedy inside, whatever the request's sampler: see the class docstring.
        inner_request = replace(
            request, committed=draft_committed, lengths=draft_lengths, sampler=None
        )
        inner = self.drafter.propose(inner_request)

        tokens = torch.full((len(lengths), k), NO_TOKEN, dtype=torch.long)
        for row, drafted in enumerate(inner.tokens.tolist()):
            drafted = [token for token in drafted if token != NO_TOKEN]
            proposal = self._to_target(target_rows[row], contexts[row], drafted)[:k]
            tokens[row, : len(proposal)] = torch.tensor(proposal, dtype=torch.long)
        return Draft(tokens=tokens.to(committed.device), steps=inner.steps)

    def _to_draft(self, target_ids: list[int], state: _RowText) -> list[int]:
        """Draft tokens for the row's committed text; updates `state` incrementally."""
        if len(target_ids) > state.synced:
            context = target_ids[max(0, state.synced - self.window) : state.synced]
            before = self.target_decode(context)
            after = self.target_decode(context + target_ids[state.synced :])
            if after.startswith(before):
                state.text += after[len(before) :]
            else:  # decoding is not local here (e.g. a split character): start over
                state.text, state.anchor, state.frozen = self.target_decode(target_ids), 0, []
            state.synced = len(target_ids)
        tail = self.draft_encode(state.text[state.anchor :])
        if len(tail) > 2 * self.window:
            head_text = self.draft_decode(tail[: -self.window])
            if head_text and state.text.startswith(head_text, state.anchor):
                state.frozen += tail[: -self.window]
                state.anchor += len(head_text)
                tail = tail[-self.window :]
        # The inner drafter conditions on at least one token; a row whose text encodes to nothing
        # drafts from an arbitrary token, which verification renders harmless.
        return state.frozen + tail or [0]

    def _to_target(
        self, target_ids: list[int], context: list[int], drafted: list[int]
    ) -> list[int]:
        """Target tokens that continue target_ids with the text of `drafted`."""
        if not drafted:
            return []
        before = self.draft_decode(context[-self.window :])
        after = self.draft_decode(context[-self.window :] + drafted)
        text = after[len(before) :] if after.startswith(before) else self.draft_decode(drafted)
        if not text:
            return []
        recent = target_ids[-self.window :]
        extended = self.target_encode(self.target_decode(recent) + text)
        if extended[: len(recent)] == recent:
            return extended[len(recent) :]
        return self.target_encode(text)

    def rollback(self, committed: torch.Tensor, lengths: torch.Tensor) -> None:
        """Nothing to drop: the next propose re-syncs text and inner drafter from `committed`."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        if self._rows:
            self._rows = [self._rows[row] for row in rows.tolist()]
        self.drafter.keep_rows(rows)  # before its first proposal too (ModelDrafter)


def _stack_rows(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (batch, longest) tensor and (batch,) lengths."""
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    stacked = torch.zeros((len(rows), int(lengths.max())), dtype=torch.long)
    for index, row in enumerate(rows):
        stacked[index, : len(row)] = torch.tensor(row, dtype=torch.long)
    return stacked.to(device), lengths.to(device)

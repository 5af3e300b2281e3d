"""The decoding loop: draft, verify, commit, roll back; for a batch of rows at once.

Rows advance by different amounts every step (their own acceptance lengths) and leave the batch
when they stop (EOS, max_new_tokens). Each row only ever sees its own tokens at its own
positions, so a batch decodes every row exactly as that row would decode alone, and greedy
speculative output is the target's greedy output token for token.

`decoding.reference.speculative_greedy` is the same algorithm for one greedy row, written to be
read first; tests check this loop against it token for token.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from decoding.lookahead import BlockOutcome, Heuristic, LookaheadPolicy
from decoding.protocols import NO_TOKEN, Draft, Drafter, DraftRequest, Target
from decoding.verify import Sampler, SamplingOptions, Verdict, greedy_accept, speculative_sample

PAD = 0  # fills unused slots of a block; masked, or placed after every token that matters

StepHook = Callable[[tuple[tuple[int, ...], ...]], bool]
"""on_step(new) after each verify step: new[r] = the tokens prompt row r committed in it (() for a
row that already stopped). Returning True stops every row there (a stop string, a server whose
client left); the tokens committed so far are the result."""


@dataclass(frozen=True)
class DecodeStats:
    """Counts and times of one or more generations; `+` merges them.

    accepted_histogram[n]: verify steps (per row) that accepted n drafted tokens.
    draft_calls: draft model forward passes (0 for n-gram lookup).
    """

    target_calls: int = 0
    draft_calls: int = 0
    accepted_histogram: tuple[int, ...] = ()
    generated_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def tokens_per_target_call(self) -> float:
        """Committed tokens per target forward pass, summed over the rows of a batch."""
        return self.generated_tokens / self.target_calls if self.target_calls else 0.0

    def __add__(self, other: DecodeStats) -> DecodeStats:
        histograms = (self.accepted_histogram, other.accepted_histogram)
        return DecodeStats(
            target_calls=self.target_calls + other.target_calls,
            draft_calls=self.draft_calls + other.draft_calls,
            accepted_histogram=tuple(map(sum, itertools.zip_longest(*histograms, fillvalue=0))),
            generated_tokens=self.generated_tokens + other.generated_tokens,
            draft_seconds=self.draft_seconds + other.draft_seconds,
            verify_seconds=self.verify_seconds + other.verify_seconds,
        )


@dataclass(frozen=True)
class GenerationResult:
    """New tokens per row, in prompt order; a row that stopped at EOS ends with it.

    sum_logprobs[r]: log-probability of row r's new tokens under the logits the target returned
    (before temperature, top-k and top-p), e.g. for Whisper's average log-probability.
    """

    tokens: tuple[tuple[int, ...], ...]
    sum_logprobs: tuple[float, ...]
    stats: DecodeStats


@dataclass(frozen=True)
class _StepReport:
    """What one verify step committed, summed over the batch's rows; the numbers are read back
    from the device in a single transfer (`_to_host`)."""

    finished: torch.Tensor  # Tensor[bool], shape = (batch,): rows that stopped at this step
    any_finished: bool
    histogram: tuple[int, ...]  # histogram[n]: rows that accepted n drafted tokens
    reached: tuple[int, ...]  # per drafted column: rows that verified it, all before it accepted
    kept: tuple[int, ...]  # per drafted column: rows that accepted it
    proposed: int  # drafted tokens the target verified
    accepted: int  # drafted tokens it accepted
    rejections: int  # rows that rejected one of their drafted tokens
    new_tokens: int  # tokens committed (accepted drafts, the target's own tokens)

    def per_group(self, size: int) -> _StepReport:
        """The counts of one row per group of `size` identical rows (a tree's branches, which
        all commit their group's best chain)."""
        if size == 1:
            return self

        def each(counts: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(count // size for count in counts)

        return _StepReport(
            finished=self.finished,
            any_finished=self.any_finished,
            histogram=each(self.histogram),
            reached=each(self.reached),
            kept=each(self.kept),
            proposed=self.proposed // size,
            accepted=self.accepted // size,
            rejections=self.rejections // size,
            new_tokens=self.new_tokens // size,
        )


def _to_host(**named: torch.Tensor) -> dict[str, list]:
    """Each named tensor's values as a flat list, copied from the device in one transfer (one
    synchronisation per step rather than one per number)."""
    flat = [tensor.reshape(-1) for tensor in named.values()]
    values = torch.cat(flat).tolist()
    host, start = {}, 0
    for name, tensor in zip(named, flat, strict=True):
        host[name] = values[start : start + len(tensor)]
        start += len(tensor)
    return host


class _BatchState:
    """The decoding state of the rows still in the batch: right-padded committed tokens, where
    each row stands, and the finished rows' results."""

    def __init__(
        self,
        prompts: list[torch.Tensor],
        max_new_tokens: int,
        device: torch.device,
        branches: int = 1,
    ):
        """prompts: one per row; with branches > 1, each caller's prompt `branches` times in a
        row (its tree's chains), which give one result."""
        self.max_new_tokens = max_new_tokens
        self.prompt_lengths = torch.tensor([len(p) for p in prompts], device=device)
        self.lengths = self.prompt_lengths.clone()
        self.longest_prompt = max(len(p) for p in prompts)
        self.committed = torch.full(
            (len(prompts), self.longest_prompt + max_new_tokens + 1), PAD, device=device
        )
        for row, prompt in enumerate(prompts):
            self.committed[row, : len(prompt)] = prompt
        self.sum_logprobs = torch.zeros(len(prompts), dtype=torch.float64, device=device)
        # each row's index in the caller's batch
        self.ids = [row // branches for row in range(len(prompts))]
        self.results: list[tuple[tuple[int, ...], float]] = [((), 0.0)] * (len(prompts) // branches)
        self.uncached = self.longest_prompt  # widest uncached tail: the prompts, then one token
        self.max_budget = max_new_tokens  # most tokens any row may still add

    @property
    def count(self) -> int:
        return len(self.ids)

    def admissible(self, draft: Draft) -> Draft:
        """Drops proposals a row could not commit before max_new_tokens, then the columns no row
        uses any more, which the target would otherwise verify for nothing."""
        budget = self.max_new_tokens - (self.lengths - self.prompt_lengths)
        columns = torch.arange(draft.tokens.shape[1], device=draft.tokens.device)
        tokens = draft.tokens.masked_fill(columns >= budget.unsqueeze(1) - 1, NO_TOKEN)
        width = int((tokens != NO_TOKEN).sum(dim=1).max()) if tokens.numel() else 0
        q = None if draft.q is None else draft.q[:, :width]
        return Draft(tokens=tokens[:, :width], q=q, steps=draft.steps)

    def verify_block(self, proposals: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """tokens, positions, mask: each row's uncached committed tail, right-aligned so the
        last committed token is in the same column for every row, then its proposals.
        Tensor, shape = (batch, uncached + k)."""
        device = proposals.device
        lengths = self.lengths.unsqueeze(1)
        tail_positions = lengths + torch.arange(-self.uncached, 0, device=device)
        draft_positions = lengths + torch.arange(proposals.shape[1], device=device)
        tail_mask = tail_positions >= 0  # only the first block has rows with shorter tails
        tail_positions = tail_positions.clamp(min=0)
        tokens = torch.cat([self.committed.gather(1, tail_positions), proposals.clamp(min=0)], 1)
        positions = torch.cat([tail_positions, draft_positions], dim=1)
        # Unused proposal slots lie after every real token of their row and are rolled back.
        mask = torch.cat([tail_mask, torch.ones_like(proposals, dtype=torch.bool)], dim=1)
        self.uncached = 1  # the target keeps all but the last committed token of every row
        return tokens, positions, mask

    def commit(
        self,
        verdict: Verdict,
        logits: torch.Tensor,
        proposals: torch.Tensor,
        stop_ids: torch.Tensor,
    ) -> _StepReport:
        """Appends each row's accepted tokens, cut after the first stop token.

        logits: Tensor, shape = (batch, k + 1, vocab); column j scored verdict.tokens[:, j].
        """
        width = verdict.tokens.shape[1]
        columns = torch.arange(width, device=verdict.tokens.device)
        count = verdict.accepted + 1
        stops = torch.isin(verdict.tokens, stop_ids) & (columns < count.unsqueeze(1))
        hit_stop = stops.any(dim=1)
        count = torch.where(hit_stop, stops.int().argmax(dim=1) + 1, count)
        dropped = columns >= count.unsqueeze(1)
        new_tokens = verdict.tokens.masked_fill(dropped, PAD)
        logprobs = logits.float().log_softmax(dim=-1).gather(-1, new_tokens.unsqueeze(-1))
        logprobs = logprobs.squeeze(-1).masked_fill(dropped, 0).double()
        # Token by token, as plain decoding adds them: float sums depend on their order, and a
        # model whose logits do not depend on the block (asr.int8_decoder) then gives the
        # very same log-probability drafted or not.
        for column in range(width):
            self.sum_logprobs += logprobs[:, column]
        self._ensure_capacity(self.longest_prompt + self.max_new_tokens + width)
        self.committed.scatter_(1, self.lengths.unsqueeze(1) + columns, new_tokens)
        self.lengths += count

        generated = self.lengths - self.prompt_lengths
        finished = hit_stop | (generated >= self.max_new_tokens)
        proposed = (proposals != NO_TOKEN).sum(dim=1)
        drafted = columns[: proposals.shape[1]].unsqueeze(1)  # (k, 1) against rows
        host = _to_host(
            histogram=torch.bincount(verdict.accepted, minlength=width),
            reached=((proposed > drafted) & (verdict.accepted >= drafted)).sum(dim=1),
            kept=(verdict.accepted > drafted).sum(dim=1),
            proposed=proposed.sum(),
            accepted=verdict.accepted.sum(),
            rejections=(verdict.accepted < proposed).sum(),
            new_tokens=count.sum(),
            finished=finished.sum(),
            least_generated=generated.masked_fill(finished, self.max_new_tokens).min(),
        )
        self.max_budget = self.max_new_tokens - host["least_generated"][0]
        return _StepReport(
            finished=finished,
            any_finished=host["finished"][0] > 0,
            histogram=tuple(host["histogram"]),
            reached=tuple(host["reached"]),
            kept=tuple(host["kept"]),
            proposed=host["proposed"][0],
            accepted=host["accepted"][0],
            rejections=host["rejections"][0],
            new_tokens=host["new_tokens"][0],
        )

    def new_tokens(self, before: torch.Tensor) -> tuple[tuple[int, ...], ...]:
        """Each caller row's tokens committed since its length was `before[row]`."""
        new: list[tuple[int, ...]] = [()] * len(self.results)
        spans = zip(before.tolist(), self.lengths.tolist(), self.committed.tolist(), strict=True)
        for row, (start, end, tokens) in enumerate(spans):
            new[self.ids[row]] = tuple(tokens[start:end])
        return tuple(new)

    def retire(self, finished: torch.Tensor) -> torch.Tensor:
        """Records the finished rows' results and drops them; returns the kept rows' indices."""
        picked = finished.nonzero().flatten()
        results = zip(
            picked.tolist(),
            self.committed[picked].tolist(),
            self.prompt_lengths[picked].tolist(),
            self.lengths[picked].tolist(),
            self.sum_logprobs[picked].tolist(),
            strict=True,
        )
        for row, tokens, start, end, logprob in results:
            self.results[self.ids[row]] = (tuple(tokens[start:end]), logprob)
        kept = (~finished).nonzero().flatten()
        self.committed = self.committed[kept]
        self.lengths = self.lengths[kept]
        self.prompt_lengths = self.prompt_lengths[kept]
        self.sum_logprobs = self.sum_logprobs[kept]
        self.ids = [self.ids[row] for row in kept.tolist()]
        return kept

    def _ensure_capacity(self, width: int) -> None:
        missing = width - self.committed.shape[1]
        if missing > 0:
            self.committed = torch.nn.functional.pad(self.committed, (0, missing), value=PAD)


def _as_rows(prompt_ids: Sequence[Sequence[int]] | torch.Tensor, device: torch.device) -> list:
    if isinstance(prompt_ids, torch.Tensor) and prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids must be (batch, length) (got shape {prompt_ids.shape})")
    rows = [torch.as_tensor(row, dtype=torch.long, device=device) for row in prompt_ids]
    if not rows or any(len(row) == 0 for row in rows):
        raise ValueError("prompt_ids must hold at least one row, each with at least one token")
    return rows


def _stop_ids(eos_token_id: int | Sequence[int] | None, device: torch.device) -> torch.Tensor:
    ids = [] if eos_token_id is None else eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids)
    return torch.tensor(ids, dtype=torch.long, device=device)


def device_clock(device: torch.device) -> float:
    """perf_counter once `device` has finished the work queued on it."""
    if device.type == "cuda":  # kernels run asynchronously; time what they did, not the launch
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _best_chains(
    verdict: Verdict, logits: torch.Tensor, proposals: torch.Tensor, branches: int
) -> tuple[Verdict, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row of a group of `branches` takes its group's longest accepted chain (the first
    of the longest: the draft's own choice on a tie). Returns the verdict, logits and
    proposals row by row as that chain's row has them, and source: Tensor, shape = (batch,),
    the row each row now follows."""
    groups = verdict.accepted.shape[0] // branches
    best = verdict.accepted.view(groups, branches).argmax(dim=1)
    first_rows = torch.arange(groups, device=best.device) * branches
    source = (first_rows + best).repeat_interleave(branches)
    followed = Verdict(accepted=verdict.accepted[source], tokens=verdict.tokens[source])
    return followed, logits[source], proposals[source], source


def _roll_back(
    target: Target, drafter: Drafter | None, rows: _BatchState, kept: torch.Tensor | None
) -> None:
    """Both caches follow the batch: finished rows go, and the target keeps every committed
    token but each row's last, whose logits the next block needs."""
    for cache in (target, drafter):
        if cache is not None and kept is not None:
            cache.keep_rows(kept)
    target.rollback(rows.lengths - 1)
    if drafter is not None:
        drafter.rollback(rows.committed, rows.lengths)


def generate(
    target: Target,
    prompt_ids: Sequence[Sequence[int]] | torch.Tensor,
    drafter: Drafter | None = None,
    policy: LookaheadPolicy | None = None,
    *,
    sampling: SamplingOptions | None = None,
    max_new_tokens: int = 128,
    eos_token_id: int | Sequence[int] | None = None,
    on_step: StepHook | None = None,
    branches: int = 1,
) -> GenerationResult:
    """Decodes every prompt row with `target`, speculatively when a drafter is given.

    Greedy when `sampling` is None (output equals the target's greedy decoding); otherwise
    samples exactly from the target's distribution under `sampling`. Without a drafter each
    step commits one token. `policy` picks the draft length (default: Heuristic()).
    on_step: sees each step's committed tokens and may stop the generation (`StepHook`).
    branches: greedy tree drafting. Each prompt decodes as this many rows with the same
    committed tokens; at every block row i of a prompt starts from the draft's i-th best token
    and drafts on greedily (a tree whose root has `branches` chains), one target call verifies
    them all, and the prompt's longest accepted chain is committed to each of its rows, which
    take the chain's cache positions from its row (`BranchingTarget.copy_positions`). A chain
    per row rather than one row holding the tree: every position is then scored in a row
    whose slots hold exactly its prefix, as a plain step scores it, so the target's exact
    (bit-for-bit) mode stays exact. 1: one chain.
    """
    # 1. Check the request; set up the rows, both caches and the random stream.
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
    if branches < 1:
        raise ValueError(f"branches must be >= 1 (got {branches})")
    if branches > 1 and (drafter is None or sampling is not None):
        raise ValueError(
            "branches > 1 drafts a tree of greedy chains: it needs a drafter and greedy decoding"
        )
    if branches > 1 and not hasattr(target, "copy_positions"):
        raise ValueError(f"branches > 1: {type(target).__name__} cannot copy cached positions")
    device = target.device
    policy = (policy or Heuristic()) if drafter is not None else None
    sampler = None if sampling is None else Sampler(sampling, device)
    prompts = [row for row in _as_rows(prompt_ids, device) for _ in range(branches)]
    rows = _BatchState(prompts, max_new_tokens, device, branches)
    stop_ids = _stop_ids(eos_token_id, device)
    stats = DecodeStats()
    target.reset()
    if drafter is not None:
        drafter.reset()

    # The first call scores the prompts. A target that scores every position with the same
    # bits whatever the block holds verifies a first draft in that call too, which saves a
    # call per generation (one batch of Whisper windows: 222 calls became 219 for 8 short
    # files); any other scores the prompts alone, so that their cache entries are the same
    # with and without a draft and drafted output stays the plain output.
    draft_with_prompt = bool(getattr(target, "width_invariant", False))
    first_step, draft_primed = True, False
    with torch.inference_mode():
        while rows.count:
            # 2. Draft up to k tokens per row (none without a drafter, with one token to go, or
            # on the first call where the prompts must be scored alone).
            started = device_clock(device)
            call_rows, k = rows.count, 0
            if policy is not None and (draft_with_prompt or not first_step):
                k = min(policy.next_k(call_rows), rows.max_budget - 1)
            if k > 0:
                request = DraftRequest(
                    rows.committed,
                    rows.lengths,
                    k,
                    policy.stop_below,
                    sampler,
                    policy.stop_joint,
                    branches,
                )
                draft = drafter.propose(request)
            else:
                draft = Draft(tokens=torch.empty((rows.count, 0), dtype=torch.long, device=device))
            drafted = device_clock(device)

            # 3. Score the uncached tails plus the proposals in one target call, then verify.
            draft = rows.admissible(draft)
            proposals = draft.tokens
            logits = target.score(*rows.verify_block(proposals), keep=proposals.shape[1] + 1)
            if sampler is None:
                verdict = greedy_accept(proposals, logits)
            else:
                p = sampler.probs(logits)
                verdict = speculative_sample(proposals, draft.q, p, sampler.generator)
            if branches > 1:
                verdict, logits, proposals, source = _best_chains(
                    verdict, logits, proposals, branches
                )

            # 4. Commit; rows that stopped leave the batch; caches drop what was rejected.
            before = rows.lengths.clone() if on_step is not None or branches > 1 else None
            step = rows.commit(verdict, logits, proposals, stop_ids)
            if branches > 1:
                target.copy_positions(source, before, before + verdict.accepted)
                step = step.per_group(branches)
            finished, any_finished = step.finished, step.any_finished
            if on_step is not None and on_step(rows.new_tokens(before)):
                finished, any_finished = torch.ones_like(finished), True
            # Rows that stopped leave the caches, which moves the rows after them: a cost of the
            # batch (in the stats), not of the block length (kept from the policy's times).
            shed_from = device_clock(device) if any_finished else None
            kept = rows.retire(finished) if any_finished else None
            if rows.count:
                _roll_back(target, drafter, rows, kept)
            verified = device_clock(device)
            shed = 0.0 if shed_from is None else verified - shed_from

            # 5. Account, and let the policy learn.
            stats = stats + DecodeStats(
                target_calls=1,
                draft_calls=draft.steps,
                accepted_histogram=step.histogram,
                generated_tokens=step.new_tokens,
                draft_seconds=drafted - started,
                verify_seconds=verified - drafted,
            )
            if policy is not None and not first_step:  # a first call's price is its prompt's
                policy.update(
                    BlockOutcome(
                        k=k,
                        width=proposals.shape[1],
                        proposed=step.proposed,
                        accepted=step.accepted,
                        rejections=step.rejections,
                        reached=step.reached,
                        kept=step.kept,
                        draft_seconds=drafted - started,
                        verify_seconds=verified - drafted - shed,
                        includes_prefill=k > 0 and not draft_primed,
                        draft_steps=draft.steps,
                        rows=call_rows,
                    )
                )
            first_step, draft_primed = False, draft_primed or k > 0
    tokens, sum_logprobs = zip(*rows.results, strict=True)
    return GenerationResult(tokens, sum_logprobs, stats)

"""Greedy speculative decoding of ONE row, written to be read, not to be fast.

`decoding.generate` does the same for a batch (rows that advance by different amounts, leave
the batch when they stop, sample as well as argmax); tests check it against this loop token for
token. Read this first: it is the algorithm, in the order of the paper (Leviathan et al. 2023):
draft k tokens, score them all in one target call, keep the longest prefix the target agrees
with plus the target's own next token, roll both caches back to what was kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decoding.protocols import NO_TOKEN, Drafter, DraftRequest, Target


@dataclass(frozen=True)
class ReferenceResult:
    tokens: tuple[int, ...]  # the new tokens; ends with the stop token when one was met
    target_calls: int


def speculative_greedy(
    target: Target,
    drafter: Drafter | None,
    prompt: Sequence[int],
    k: int,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
) -> ReferenceResult:
    """The target's greedy continuation of `prompt`, drafting k tokens per step (none without a
    drafter, and none on the first step, which caches the prompt alone as `generate` does)."""
    tokens, cached, calls = list(prompt), 0, 0  # target caches positions < cached
    one = torch.ones((1, 1), dtype=torch.bool, device=target.device)
    target.reset()
    if drafter is not None:
        drafter.reset()
    with torch.inference_mode():
        while len(tokens) - len(prompt) < max_new_tokens:
            committed = torch.tensor([tokens], device=target.device)
            lengths = torch.tensor([len(tokens)], device=target.device)
            # 1. Draft, at most one token fewer than the budget: the target adds one of its own.
            budget = max_new_tokens - (len(tokens) - len(prompt))
            drafts: list[int] = []
            if drafter is not None and cached > 0 and min(k, budget - 1) > 0:
                proposed = drafter.propose(DraftRequest(committed, lengths, min(k, budget - 1)))
                for token in proposed.tokens[0].tolist():
                    if token == NO_TOKEN:
                        break
                    drafts.append(token)
            # 2. Score the uncached committed tokens and the drafts in one target call.
            block = tokens[cached:] + drafts
            positions = torch.arange(cached, cached + len(block), device=target.device)
            mask = one.expand(1, len(block))
            logits = target.score(
                torch.tensor([block], device=target.device), positions[None], mask, len(drafts) + 1
            )
            calls += 1
            best = logits[0].argmax(dim=-1).tolist()  # best[j]: the target's token after drafts[:j]
            # 3. Keep the drafts the target agrees with, then its own token; stop at a stop token.
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == best[accepted]:
                accepted += 1
            for token in best[: accepted + 1]:
                tokens.append(token)
                if token in stop_ids:
                    return ReferenceResult(tuple(tokens[len(prompt) :]), calls)
            # 4. Roll back: the target keeps all but the last committed token (whose logits the
            # next block needs); the drafter drops whatever no longer agrees with `tokens`.
            cached = len(tokens) - 1
            target.rollback(torch.tensor([cached], device=target.device))
            if drafter is not None:
                committed = torch.tensor([tokens], device=target.device)
                drafter.rollback(committed, torch.tensor([len(tokens)], device=target.device))
    return ReferenceResult(tuple(tokens[len(prompt) :]), calls)


def beam_search_one(
    target: Target,
    prompt: Sequence[int],
    beam_size: int,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    patience: float = 1.0,
) -> tuple[tuple[int, ...], float]:
    """OpenAI Whisper's beam search for one prompt, ranked by log-probability per token;
    every hypothesis's next-token scores computed from scratch over its whole sequence (no
    cache to reorder). Returns the chosen tokens (ending with the stop token where it ended)
    and their summed log-probability. `decoding.beam.beam_search` must agree with it."""
    live: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    ended: dict[tuple[int, ...], float] = {}
    wanted = round(beam_size * patience)
    with torch.inference_mode():
        while True:
            candidates = []
            for tokens, logprob in live:
                sequence = torch.tensor([[*prompt, *tokens]], device=target.device)
                positions = torch.arange(sequence.shape[1], device=target.device)[None]
                target.reset()
                logits = target.score(sequence, positions, torch.ones_like(sequence).bool(), 1)
                logprobs = logits[0, -1].float().log_softmax(dim=-1)
                best = logprobs.topk(beam_size + 1)
                for value, token in zip(best.values.tolist(), best.indices.tolist(), strict=True):
                    if value > float("-inf"):
                        candidates.append(((*tokens, token), logprob + value))
            candidates.sort(key=lambda candidate: candidate[1], reverse=True)
            live = []
            for tokens, logprob in candidates:
                if tokens[-1] in stop_ids:
                    if len(ended) < wanted:
                        ended[tokens] = logprob
                else:
                    live.append((tokens, logprob))
                if len(live) == beam_size:
                    break
            if len(ended) >= wanted or not live or len(live[0][0]) >= max_new_tokens:
                break
    for tokens, logprob in live:
        if len(ended) >= beam_size:
            break
        ended.setdefault(tokens, logprob)

    def per_token(item: tuple[tuple[int, ...], float]) -> float:
        tokens, logprob = item
        return logprob / max(1, len(tokens) - (bool(tokens) and tokens[-1] in stop_ids))

    return max(ended.items(), key=per_token)

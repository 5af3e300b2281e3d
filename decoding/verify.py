"""Verification of draft blocks: greedy acceptance and lossless speculative sampling.

Notation (Leviathan et al. 2023): p is the TARGET distribution and q the DRAFT distribution, as in
transformers' `_speculative_sampling`; gpt-fast swaps the letters (its p is the draft).
A block x_1..x_k drafted from q is checked against p_1..p_{k+1}, the target's distributions at
the k+1 positions that end in each drafted token's prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from decoding.protocols import NO_TOKEN

# Below this, logits / temperature overflow float32 into NaN probabilities (1e-38 did).
MIN_TEMPERATURE = 1e-30


@dataclass(frozen=True)
class SamplingOptions:
    """How tokens are sampled; draft and target use the same rules. Greedy is `sampling=None`."""

    temperature: float = 1.0
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0
    seed: int | None = None

    def validate(self) -> SamplingOptions:
        if not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 (got {self.temperature}); greedy decoding samples "
                "nothing (sampling=None; on the command line, no --sample)"
            )
        if self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature must be at least {MIN_TEMPERATURE:g} (got {self.temperature}): "
                "logits divided by less overflow; for the likeliest token, decode greedily"
            )
        if not math.isfinite(self.temperature):  # inf samples uniformly: noise, not text
            raise ValueError(f"temperature must be finite (got {self.temperature})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        return self


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one block per row.

    accepted: Tensor, shape = (batch,); drafted tokens kept per row.
    tokens: Tensor, shape = (batch, k + 1); row r commits tokens[r, : accepted[r] + 1], the kept
    drafts followed by one token from the target (a correction, or a bonus after full acceptance).
    """

    accepted: torch.Tensor
    tokens: torch.Tensor


def apply_sampling(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Logits -> sampling probabilities. Tensor, shape = (..., vocab) -> same shape."""
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth_best = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the more likely tokens already hold top_p; the best one always stays.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False  # a top_p that rounds to 0 in float32 (1e-46) kept none
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


class Sampler:
    """SamplingOptions plus the random stream that every draw of one generation uses."""

    def __init__(self, options: SamplingOptions, device: torch.device) -> None:
        self.options = options.validate()
        self.generator = torch.Generator(device=device)
        if options.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(options.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Tensor, shape = (..., vocab) -> probabilities under these options."""
        options = self.options
        return apply_sampling(logits.float(), options.temperature, options.top_k, options.top_p)

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """Tensor, shape = (batch, vocab) -> one token per row, shape = (batch,)."""
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)


def best_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dimension (the first maximum on ties, as argmax), through
    max's indices: on CPU argmax over a vocabulary costs about three times as much (86 against
    32 us for one row of Whisper's 51865 logits, 2 threads). Tensor, shape = (..., vocab) ->
    (...), long."""
    return logits.max(dim=-1).indices


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Keeps the longest drafted prefix that equals the target's argmax, plus the next argmax.

    draft_tokens: Tensor, shape = (batch, k); target_logits: Tensor, shape = (batch, k + 1, vocab).
    """
    best = best_tokens(target_logits)
    accepted = (draft_tokens == best[:, :-1]).cumprod(dim=1).sum(dim=1)
    # Accepted drafts equal the argmax, so the argmax row is also the committed row.
    return Verdict(accepted=accepted, tokens=best)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(p - q, 0)): what to sample after rejecting a draft token. (..., vocab)."""
    residual = (p - q).clamp(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    # A rejection implies p(x) < q(x), hence positive mass; zero mass only arises from rounding
    # when p == q, where p itself is the right answer.
    return torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)


def speculative_sample(
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Lossless rejection sampling: the committed tokens are distributed exactly as under p.

    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from
    normalize(max(p_i - q_i, 0)); after accepting every drafted token sample a bonus from p_{k+1}.
    draft_tokens: Tensor, shape = (batch, k), NO_TOKEN after a row's last proposal.
    q: Tensor, shape = (batch, k, vocab), or None for deterministic drafts (q is then one-hot).
    p: Tensor, shape = (batch, k + 1, vocab); target probabilities (after apply_sampling).
    """
    batch, k = draft_tokens.shape
    proposed = draft_tokens != NO_TOKEN
    x = draft_tokens.clamp(min=0)
    if q is None:
        q = torch.zeros_like(p[:, :k]).scatter_(-1, x.unsqueeze(-1), 1.0)
    p_x = p[:, :k].gather(-1, x.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    u = torch.rand((batch, k), generator=generator, device=p.device, dtype=p.dtype)
    accept = proposed & (u * q_x < p_x)  # u < p/q without dividing by q
    accepted = accept.cumprod(dim=1).sum(dim=1)

    rows = torch.arange(batch, device=p.device)
    p_next = p[rows, accepted]
    # After a row's last proposal there is nothing to reject: q = 0 turns the residual into p.
    rejected_here = accepted < proposed.sum(dim=1)
    q_next = q[rows, accepted.clamp(max=max(k - 1, 0))] if k else torch.zeros_like(p_next)
    q_next = q_next * rejected_here.unsqueeze(-1)
    next_token = torch.multinomial(residual_distribution(p_next, q_next), 1, generator=generator)

    tokens = torch.cat([x, x.new_zeros((batch, 1))], dim=1)
    tokens.scatter_(1, accepted.unsqueeze(1), next_token)
    return Verdict(accepted=accepted, tokens=tokens)

"""Draft-length policies: how many tokens to draft next, learned from how blocks fared.

Every policy has one question, `next_k()`, one lesson, `update(outcome)`, and `stop_below`, the
draft confidence under which a drafter ends a row's block early (0 never stops). A policy keeps
its state across `generate` calls on purpose: what it learned about a model pair carries over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class BlockOutcome:
    """One verify step, summed over the rows of the batch."""

    k: int  # block length asked of the drafter (0: a plain decoding step)
    width: int  # drafted columns the target verified
    proposed: int  # drafted tokens
    accepted: int  # drafted tokens the target kept
    rejections: int  # rows whose block ended at a rejected token
    draft_seconds: float
    verify_seconds: float
    includes_prefill: bool  # the first step of a generation also processed the prompts


class LookaheadPolicy(Protocol):
    stop_below: float

    def next_k(self) -> int:
        """Draft block length for the next step (>= 1)."""

    def update(self, outcome: BlockOutcome) -> None:
        """Learns from the step that just ran."""


def _check_k(name: str, k: int) -> int:
    if k < 1:
        raise ValueError(f"{name} must be >= 1 (got {k})")
    return k


class ConstantK:
    """Always k tokens."""

    stop_below = 0.0

    def __init__(self, k: int = 4) -> None:
        self.k = _check_k("k", k)

    def next_k(self) -> int:
        return self.k

    def update(self, outcome: BlockOutcome) -> None:
        """A constant policy learns nothing."""


class Heuristic:
    """transformers' "heuristic" schedule: +2 after a fully accepted block, -1 otherwise."""

    stop_below = 0.0

    def __init__(self, start: int = 4, low: int = 1, high: int = 16) -> None:
        if not _check_k("low", low) <= start <= high:
            raise ValueError(f"need low <= start <= high (got {low}, {start}, {high})")
        self.k, self.low, self.high = start, low, high

    def next_k(self) -> int:
        return self.k

    def update(self, outcome: BlockOutcome) -> None:
        if outcome.proposed == 0:
            return
        fully_accepted = outcome.rejections == 0
        self.k = min(self.high, self.k + 2) if fully_accepted else max(self.low, self.k - 1)


class ConfidenceStop:
    """Up to k tokens; the drafter ends a row's block before a token it is unsure of.

    Unsure means the draft distribution's top probability is below `threshold`. The token is
    left out rather than proposed: it would most likely be rejected and widen the verify block.
    """

    def __init__(self, k: int = 8, threshold: float = 0.4) -> None:
        if not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1] (got {threshold})")
        self.k = _check_k("k", k)
        self.stop_below = threshold

    def next_k(self) -> int:
        return self.k

    def update(self, outcome: BlockOutcome) -> None:
        """The threshold does the adapting, inside the drafter."""


class Adaptive:
    """The k that maximises expected committed tokens per unit of time.

    If each drafted token is accepted with probability alpha (the i.i.d. model of Leviathan et
    al.), a block of k drafts commits on average

        E(k) = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)

    tokens (the accepted drafts plus the target's own token) and takes k*d + v(k) seconds: k draft
    steps of d seconds and one target call v(k) that verifies them. With the cost ratio
    c = d / v(k) this is the textbook rule

        k* = argmax_{0 <= k <= k_max} E(k) / (v(k) * (k*c + 1)).

    alpha is the geometric maximum-likelihood estimate with exponential forgetting: accepted
    drafts are successes and rejections failures. A block accepted to its end has no failure,
    which keeps the estimate unbiased although blocks are truncated at k. Pseudo-counts from
    `prior_alpha` start it off and fade within a few blocks.

    d and v(k) are exponential moving averages of measured times. v is kept per block width
    because it grows with k where the target is compute-bound (CPUs) and hardly at all where it
    is memory-bound (GPUs); an untried k borrows the nearest tried width's time, so longer blocks
    get tried once shorter ones pay. Before any measurement v = 1 and d = prior_cost. Times from
    a generation's first step (prompt prefill) are ignored.

    k = 0 is plain decoding (E(0) = 1, nothing drafted), chosen when drafting does not pay; every
    `probe_every`-th such step still drafts one token so that alpha can recover.

    Block lengths follow the clock, so a seeded sampling run is only repeatable with the other,
    clock-free policies (greedy output is the same whatever the policy).
    """

    stop_below = 0.0

    def __init__(
        self,
        k_max: int = 12,
        decay: float = 0.9,
        prior_alpha: float = 0.7,
        prior_cost: float = 0.1,
        prior_weight: float = 4.0,
        probe_every: int = 8,
    ) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1) (got {decay})")
        if not 0 < prior_alpha < 1:
            raise ValueError(f"prior_alpha must be in (0, 1) (got {prior_alpha})")
        self.k_max = _check_k("k_max", k_max)
        self.probe_every = _check_k("probe_every", probe_every)
        self.decay = decay
        self.prior_cost = prior_cost
        self.successes = prior_alpha * prior_weight
        self.failures = (1 - prior_alpha) * prior_weight
        self.draft_step: float | None = None  # seconds per draft step
        self.verify: dict[int, float] = {}  # drafted columns -> seconds per target call
        self._plain_steps = 0

    @property
    def alpha(self) -> float:
        return self.successes / (self.successes + self.failures)

    def expected_tokens(self, k: int) -> float:
        alpha = min(self.alpha, 1 - 1e-9)
        return (1 - alpha ** (k + 1)) / (1 - alpha)

    def seconds(self, k: int) -> float:
        """Estimated time of a step that drafts k tokens (relative units before measurements)."""
        if not self.verify:
            return k * self.prior_cost + 1
        verify = self.verify[min(self.verify, key=lambda width: (abs(width - k), width))]
        draft = self.prior_cost * verify if self.draft_step is None else self.draft_step
        return k * draft + verify

    def next_k(self) -> int:
        candidates = range(self.k_max + 1)
        best = max(candidates, key=lambda k: self.expected_tokens(k) / self.seconds(k))
        if best > 0:
            return best
        self._plain_steps += 1
        return 1 if self._plain_steps % self.probe_every == 0 else 0

    def update(self, outcome: BlockOutcome) -> None:
        if outcome.proposed:
            self.successes = self.decay * self.successes + outcome.accepted
            self.failures = self.decay * self.failures + outcome.rejections
        if outcome.includes_prefill:
            return
        if outcome.k:
            self.draft_step = self._average(self.draft_step, outcome.draft_seconds / outcome.k)
        previous = self.verify.get(outcome.width)
        self.verify[outcome.width] = self._average(previous, outcome.verify_seconds)

    def _average(self, average: float | None, observed: float) -> float:
        if average is None:
            return observed
        return self.decay * average + (1 - self.decay) * observed

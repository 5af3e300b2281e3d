"""Draft-length policies: how many tokens to draft next, learned from how blocks fared.

Every policy has one question, `next_k()`, one lesson, `update(outcome)`, and `stop_below`, the
draft confidence under which a drafter ends a row's block early (0 never stops): each token's top
probability, or with `stop_joint` the product of them over the block so far. A policy keeps
its state across `generate` calls on purpose: what it learned about a model pair carries over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol


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
    # The step also processed a prompt, so its times say nothing about k: the target's first
    # step of a generation, or the draft's first block of one (it catches up on the whole prompt,
    # and in a process's first generation also sets up its kernels).
    includes_prefill: bool
    draft_steps: int = 0  # draft model calls the block took (0: unknown, taken as k)
    rows: int = 1  # rows the calls scored (windows of a batch, a tree's chains)
    # Per drafted column i: rows whose i-th draft was verified with every earlier one accepted,
    # and rows that accepted it (empty when the caller does not count them).
    reached: tuple[int, ...] = ()
    kept: tuple[int, ...] = ()


class LookaheadPolicy(Protocol):
    stop_below: float
    stop_joint: bool

    def next_k(self, rows: int = 1) -> int:
        """Draft block length for the next step (>= 1; Adaptive may return 0), for a call
        of `rows` rows."""

    def update(self, outcome: BlockOutcome) -> None:
        """Learns from the step that just ran."""


def _check_k(name: str, k: int) -> int:
    if k < 1:
        raise ValueError(f"{name} must be >= 1 (got {k})")
    return k


class ConstantK:
    """Always k tokens."""

    stop_below = 0.0
    stop_joint = False

    def __init__(self, k: int = 4) -> None:
        self.k = _check_k("k", k)

    def next_k(self, rows: int = 1) -> int:
        return self.k

    def update(self, outcome: BlockOutcome) -> None:
        """A constant policy learns nothing."""


HEURISTIC_HIGH = 16  # the longest block Heuristic grows to by default


class Heuristic:
    """transformers' "heuristic" schedule: +2 after a fully accepted block, -1 otherwise."""

    stop_below = 0.0
    stop_joint = False

    def __init__(self, start: int = 4, low: int = 1, high: int = HEURISTIC_HIGH) -> None:
        if not _check_k("low", low) <= start <= high:
            raise ValueError(
                f"the heuristic's draft length must start between {low} and {high} (got {start})"
            )
        self.k, self.low, self.high = start, low, high

    def next_k(self, rows: int = 1) -> int:
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

    stop_joint = False  # each token on its own, as transformers does

    def __init__(self, k: int = 8, threshold: float = 0.4) -> None:
        if not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1] (got {threshold})")
        self.k = _check_k("k", k)
        self.stop_below = threshold

    def next_k(self, rows: int = 1) -> int:
        return self.k

    def update(self, outcome: BlockOutcome) -> None:
        """The threshold does the adapting, inside the drafter."""


# Adaptive: a call time is taken as at most this many times what the measured costs predict.
SPIKE_FACTOR = 2.0


class Adaptive:
    """The k that maximises expected committed tokens per unit of time.

    A block of k drafts commits the accepted drafts plus the target's own token:

        E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k

    where a_i is the probability that draft i is accepted given that drafts 1..i-1 were (its
    survival rate). The step takes d(k) + v(k) seconds: a draft call that proposes k tokens and
    one target call that verifies them. The policy drafts

        k* = argmax_{0 <= k <= k_max} E(k) / (d(k) + v(k)).

    With a constant a_i = alpha and d(k) = k*d this is the textbook rule of Leviathan et al.
    Real acceptance is not that memoryless: easy stretches (a quoted passage, boilerplate code)
    run long, and a draft that has been right for five tokens is more likely to be right on the
    sixth than on the first. So a_i is measured per position: among rows whose i-th draft was
    verified, the share that accepted it. A position with few observations leans on its
    predecessor's rate (which enters as `prior_weight` pseudo-observations; the first position
    leans on the pooled alpha): neighbouring positions behave alike, and the pooled alpha,
    dominated by the failures of first drafts, would understate how long a run that has started
    goes on. With no observations at all this is the geometric model.

    The pooled alpha is the geometric maximum-likelihood estimate: accepted drafts are successes
    and rejections failures (a block accepted to its end has no failure, which keeps the
    estimate unbiased although blocks are truncated at k). Pseudo-counts from `prior_alpha`
    start it off. Every count forgets with `decay` per block.

    Both costs are lines fitted to measured calls, kept per number of rows in the call (a batch
    of windows sheds rows as they end, and a call of 8 rows costs about three of 1): each
    block length (for d) and verified width (for v) keeps an exponential moving average of its
    call times, and the cost of any k is read
    off the least-squares line through those averages (never falling). A line rather than each
    k's own average, because every k is measured only now and then, one unlucky call must not
    keep the policy off a k for good, and untried lengths get a price by extrapolation, so
    longer blocks are tried once shorter ones pay. v(k) grows with k where the target is
    compute-bound (CPUs) and hardly at all where it is memory-bound (GPUs). d(k) has a fixed
    part besides its k draft steps: the draft first catches up on the tokens committed since its
    last call, and a draft with another tokenizer re-encodes text each call, which makes short
    blocks dearer per token than long ones. Before any measurement v = 1 and d(k) = k *
    prior_cost * v; with one block length measured, d is proportional to k. Times of steps that
    also processed a prompt (`BlockOutcome.includes_prefill`) are ignored: a first drafted block
    that took ten times the usual, and was rejected, would otherwise keep the policy off drafting
    for the rest of a short file.

    k = 0 is plain decoding (E(0) = 1, nothing drafted), chosen when drafting does not pay; every
    `probe_every`-th such step still drafts one token so that alpha can recover, and a probe
    accepted whole is followed at once by one twice as long (up to k_max). One-token probes
    alone would recover slowly from a few early rejections, and would measure only the dearest
    block per token of a draft whose call has a fixed part (a draft with another tokenizer
    re-encodes text on every call).

    With `confidence_stop` = p* > 0 the draft's own confidence also decides where a block ends.
    Whenever drafting pays (k* > 0) the policy asks for k_max tokens, and a row's block ends
    before the token at which the joint confidence Q (the product of the block's top draft
    probabilities so far, the draft's estimate that the whole block through that token is
    accepted) falls below p*. The per-position rates average sure and unsure tokens, so on their
    own they end blocks too early in easy stretches: on the summarise prompt the int8 draft had
    blocks of 16 accepted whole and was then given 4 to 10. Under greedy decoding a token's fate
    is fixed by the text, so ending a block early only moves the block boundary: when the token
    would have been rejected it saves a draft step and a verify column (together delta), and when
    it would have been accepted it costs one more call pair (c: a target call's fixed part and
    the draft's). Drafting on pays while Q >= delta / c; p* is a setting rather than read off
    the cost lines, since the confidence cuts blocks at too few distinct lengths for their slopes
    to be trusted. The joint product rather than each token's confidence, because a block that
    has passed an unsure token is less likely to reach the next one. The measurements behind
    these choices: docs/text-llms.md.

    Block lengths follow the clock, so a seeded sampling run is only repeatable with the other,
    clock-free policies (greedy output is the same whatever the policy).
    """

    stop_joint = True  # confidence_stop bounds the block's joint confidence

    def __init__(
        self,
        k_max: int = 12,
        decay: float = 0.9,
        prior_alpha: float = 0.7,
        prior_cost: float = 0.1,
        prior_weight: float = 4.0,
        probe_every: int = 8,
        confidence_stop: float = 0.0,
    ) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1) (got {decay})")
        if not 0 < prior_alpha < 1:
            raise ValueError(f"prior_alpha must be in (0, 1) (got {prior_alpha})")
        if not 0 <= confidence_stop < 1:
            raise ValueError(f"confidence_stop must be in [0, 1) (got {confidence_stop})")
        self.k_max = _check_k("k_max", k_max)
        self.stop_below = confidence_stop
        self.probe_every = _check_k("probe_every", probe_every)
        self.decay = decay
        self.prior_cost = prior_cost
        self.prior_weight = prior_weight
        self.successes = prior_alpha * prior_weight
        self.failures = (1 - prior_alpha) * prior_weight
        self.position_reached = [0.0] * self.k_max  # forgetful counts per drafted position
        self.position_kept = [0.0] * self.k_max
        # Per rows in the call: draft steps taken -> seconds per draft call, and drafted
        # columns -> seconds per target call. A call of 8 windows costs several times one of 1,
        # and rows leave a batch as their windows end, so one table for all would slope the
        # wrong way (long blocks measured late, on few rows, look cheap).
        self._costs: dict[int, _CallCosts] = {}
        self._rows = 1  # rows of the call being decided
        self._plain_steps = 0
        self._probe_sent = 0  # length of the probe that next_k last returned (0: none)
        self._probe_next = 0  # length of the probe to send next (0: none)

    @property
    def draft(self) -> dict[int, float]:
        """Seconds per draft call by steps taken, for calls of the current rows."""
        return self._table().draft

    @draft.setter
    def draft(self, table: dict[int, float]) -> None:
        self._costs.setdefault(self._rows, _CallCosts()).draft = table

    @property
    def verify(self) -> dict[int, float]:
        """Seconds per target call by drafted columns, for calls of the current rows."""
        return self._table().verify

    @verify.setter
    def verify(self, table: dict[int, float]) -> None:
        self._costs.setdefault(self._rows, _CallCosts()).verify = table

    def _table(self) -> _CallCosts:
        """Costs measured at the current row count, else at the nearest one measured."""
        if self._rows in self._costs or not self._costs:
            return self._costs.get(self._rows, _CallCosts())
        return self._costs[min(self._costs, key=lambda rows: (abs(rows - self._rows), rows))]

    @property
    def alpha(self) -> float:
        return self.successes / (self.successes + self.failures)

    def survival_rates(self) -> list[float]:
        """a_i for the 0-based drafted positions 0..k_max-1: each measured rate shrunk towards
        the one before it (the first towards the pooled alpha)."""
        rates, previous = [], self.alpha
        for reached, kept in zip(self.position_reached, self.position_kept, strict=True):
            previous = (kept + self.prior_weight * previous) / (reached + self.prior_weight)
            rates.append(previous)
        return rates

    def expected_tokens(self) -> list[float]:
        """E(k) for k = 0..k_max."""
        expected, surviving = [1.0], 1.0
        for rate in self.survival_rates():
            surviving *= min(rate, 1.0)
            expected.append(expected[-1] + surviving)
        return expected

    def seconds(self, k: int) -> float:
        """Estimated time of a step that drafts k tokens (relative units before measurements)."""
        if not self.verify:
            return k * self.prior_cost + 1
        return self.draft_seconds(k) + self.verify_seconds(k)

    def verify_seconds(self, width: int) -> float:
        """v(width): flat while only one width is measured."""
        if len(self.verify) == 1:
            return next(iter(self.verify.values()))
        # Extrapolating below the cheapest measured call must not make short blocks look free.
        return max(_line(self.verify, width), min(self.verify.values()) / 2)

    def draft_seconds(self, k: int) -> float:
        """d(k): nothing for k = 0, proportional to k while only one block length is measured."""
        if k == 0:
            return 0.0
        if not self.draft:
            return k * self.prior_cost * self.verify_seconds(k)
        if len(self.draft) == 1:
            ((measured, seconds),) = self.draft.items()
            return seconds * k / measured
        return max(_line(self.draft, k), 0.0)

    def next_k(self, rows: int = 1) -> int:
        self._rows = rows
        expected = self.expected_tokens()
        best = max(range(self.k_max + 1), key=lambda k: expected[k] / self.seconds(k))
        self._probe_sent = 0
        if best > 0:
            self._probe_next = 0
            return self.k_max if self.stop_below else best
        if self._probe_next:  # the last probe was accepted whole: a longer one now
            self._probe_sent, self._probe_next = self._probe_next, 0
        else:
            self._plain_steps += 1
            if self._plain_steps % self.probe_every == 0:
                self._probe_sent = 1
        return self._probe_sent

    def update(self, outcome: BlockOutcome) -> None:
        if self._probe_sent and outcome.k == self._probe_sent:
            if outcome.proposed and outcome.accepted == outcome.proposed:
                self._probe_next = min(2 * outcome.k, self.k_max)
            self._probe_sent = 0
        if outcome.proposed:
            self.successes = self.decay * self.successes + outcome.accepted
            self.failures = self.decay * self.failures + outcome.rejections
            self.position_reached = self._forget_and_add(self.position_reached, outcome.reached)
            self.position_kept = self._forget_and_add(self.position_kept, outcome.kept)
        if outcome.includes_prefill:
            return
        self._rows = outcome.rows
        self._costs.setdefault(outcome.rows, _CallCosts())
        if outcome.k:  # keyed by the steps taken: a confidence stop can end the call early
            steps = outcome.draft_steps or outcome.k
            expected = self.draft_seconds(steps) if self.draft else None
            previous = self.draft.get(steps)
            self.draft[steps] = self._average(previous, outcome.draft_seconds, expected)
        expected = self.verify_seconds(outcome.width) if self.verify else None
        previous = self.verify.get(outcome.width)
        self.verify[outcome.width] = self._average(previous, outcome.verify_seconds, expected)

    def _forget_and_add(self, counts: list[float], observed: tuple[int, ...]) -> list[float]:
        """Per-position counts decayed, plus this block's (positions it did not reach add 0)."""
        padded = (tuple(observed) + (0,) * self.k_max)[: self.k_max]
        return [self.decay * count + new for count, new in zip(counts, padded, strict=True)]

    def _average(self, average: float | None, observed: float, expected: float | None) -> float:
        """The moving average with one more call time. A time above SPIKE_FACTOR times what the
        costs measured so far give (`expected`) counts as that much: the first call of a new
        shape sets up its kernels (in a batch of windows, each count of rows times block width
        is a new shape), and one such time, tens of times the usual, kept the policy off that
        block length for the rest of a run. A lasting rise is still learned, in a few calls."""
        if expected is not None:
            observed = min(observed, SPIKE_FACTOR * expected)
        if average is None:
            return observed
        return self.decay * average + (1 - self.decay) * observed


@dataclass
class _CallCosts:
    """Moving averages of call times at one row count (`Adaptive`)."""

    draft: dict[int, float] = field(default_factory=dict)
    verify: dict[int, float] = field(default_factory=dict)


def _line(points: dict[int, float], x: int) -> float:
    """The least-squares line through {x_i: y_i} (two or more x_i), slope at least 0, at x."""
    mean_x = sum(points) / len(points)
    mean_y = sum(points.values()) / len(points)
    spread = sum((x_i - mean_x) ** 2 for x_i in points)
    slope = sum((x_i - mean_x) * (y_i - mean_y) for x_i, y_i in points.items()) / spread
    return mean_y + max(slope, 0.0) * (x - mean_x)


PolicyName = Literal["constant", "heuristic", "confidence", "adaptive"]
POLICY_NAMES: tuple[PolicyName, ...] = ("constant", "heuristic", "confidence", "adaptive")


def make_policy(name: str, k: int, confidence: float) -> LookaheadPolicy:
    """A fresh policy by name: the one factory behind every front's policy option.

    k: the block length of constant and confidence, where heuristic starts, adaptive's k_max.
    confidence: the confidence policy's per-token stop, adaptive's joint stop (0: none);
    constant and heuristic ignore it. No defaults: the text-LLM front (app.llm.draft_policy)
    and the ASR benchmark (bench.asr.parse_policy) start from different ones, each stated there.
    """
    makers = {
        "constant": lambda: ConstantK(k),
        # k past the usual ceiling of 16 raises it: a user's --k 32 starts at 32.
        "heuristic": lambda: Heuristic(start=k, high=max(HEURISTIC_HIGH, k)),
        "confidence": lambda: ConfidenceStop(k, confidence),
        "adaptive": lambda: Adaptive(k_max=k, confidence_stop=confidence),
    }
    if name not in makers:
        raise ValueError(f"policy must be one of {', '.join(POLICY_NAMES)} (got {name!r})")
    return makers[name]()

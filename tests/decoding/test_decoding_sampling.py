"""Speculative sampling draws exactly from the target distribution p.

The check: total variation between the empirical distribution of many vectorised samples and
the exact one stays under TOLERANCE. Its power is tested too: a verifier that resamples from p
instead of normalize(max(p - q, 0)) after a rejection must fail the same check.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from decoding import (
    CausalLM,
    ConfidenceStop,
    ConstantK,
    Draft,
    ModelDrafter,
    SamplingOptions,
    apply_sampling,
    generate,
    speculative_sample,
)
from decoding import verify as verify_module
from decoding.protocols import NO_TOKEN
from tests.decoding.conftest import PROMPTS, tiny_llama

TOLERANCE = 0.02
VOCAB = 4
# Rows: the current token; columns: next-token probabilities. p and q deliberately disagree.
P = torch.tensor(
    [[0.55, 0.25, 0.15, 0.05], [0.10, 0.60, 0.20, 0.10], [0.30, 0.10, 0.10, 0.50], [0.25] * 4]
)
Q = torch.tensor(
    [[0.05, 0.15, 0.30, 0.50], [0.40, 0.10, 0.40, 0.10], [0.10, 0.70, 0.10, 0.10], [0.7, 0.1] * 2]
)


def total_variation(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """samples: (n,) indices into probs.flatten(); probs: any shape summing to 1."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    return 0.5 * (counts / len(samples) - probs.flatten().double()).abs().sum().item()


def wrong_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return p


def block_samples(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Verifies n two-token blocks drafted from rows 0 and 1 of Q against rows 0, 1, 2 of P."""
    generator = torch.Generator().manual_seed(seed)
    q = Q[:2].expand(n, 2, VOCAB)
    drafts = torch.multinomial(Q[:2], n, replacement=True, generator=generator).T
    verdict = speculative_sample(drafts, q, P[:3].expand(n, 3, VOCAB), generator)
    return verdict.tokens, verdict.accepted


def test_speculative_sample_matches_p_at_every_position():
    tokens, accepted = block_samples(200_000, seed=0)

    assert total_variation(tokens[:, 0], P[0]) < TOLERANCE
    # Given the first draft was kept, the second committed token must follow p_2 (= P[1]).
    assert total_variation(tokens[accepted >= 1, 1], P[1]) < TOLERANCE
    assert 0 < accepted.float().mean() < 2


def test_resampling_from_p_after_rejection_fails_the_check(monkeypatch):
    monkeypatch.setattr(verify_module, "residual_distribution", wrong_residual)

    tokens, _ = block_samples(200_000, seed=0)

    assert total_variation(tokens[:, 0], P[0]) > 3 * TOLERANCE


def test_deterministic_draft_is_verified_as_one_hot_q():
    n = 200_000
    drafts = torch.full((n, 1), 3)  # always propose the target's least likely token
    verdict = speculative_sample(drafts, None, P[:2].expand(n, 2, VOCAB), torch.Generator())

    assert total_variation(verdict.tokens[:, 0], P[0]) < TOLERANCE
    assert abs(verdict.accepted.float().mean().item() - P[0, 3].item()) < 0.01


def test_rows_without_proposals_sample_the_bonus_from_p():
    n = 200_000
    drafts = torch.full((n, 2), NO_TOKEN)
    q = torch.full((n, 2, VOCAB), 1 / VOCAB)
    verdict = speculative_sample(drafts, q, P[:3].expand(n, 3, VOCAB), torch.Generator())

    assert verdict.accepted.max() == 0
    assert total_variation(verdict.tokens[:, 0], P[0]) < TOLERANCE


class MarkovTarget:
    """A Target whose next-token distribution depends on the current token only: table[token]."""

    device = torch.device("cpu")

    def __init__(self, table: torch.Tensor = P) -> None:
        self.log_table = table.log()

    def reset(self) -> None:
        """No cache."""

    def score(self, tokens, positions, mask, keep):
        return self.log_table[tokens[:, -keep:]]

    def rollback(self, lengths) -> None:
        """No cache."""

    def keep_rows(self, rows) -> None:
        """No cache."""


class MarkovDrafter:
    """Samples each draft token from Q[previous token] under the sampler's rules; returns q."""

    def __init__(self, deterministic: bool = False) -> None:
        self.deterministic = deterministic

    def reset(self) -> None:
        """Stateless."""

    def propose(self, request):
        committed, lengths, sampler = request.committed, request.lengths, request.sampler
        token = committed.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
        tokens, qs = [], []
        for _ in range(request.k):
            if self.deterministic:
                token = Q[token].argmax(dim=-1)
            else:
                q = sampler.probs(Q.log()[token])
                token = sampler.draw(q)
                qs.append(q)
            tokens.append(token)
        q = torch.stack(qs, dim=1) if qs else None
        return Draft(tokens=torch.stack(tokens, dim=1), q=q, steps=request.k)

    def rollback(self, committed, lengths) -> None:
        """Stateless."""

    def keep_rows(self, rows) -> None:
        """Stateless."""


def markov_sequences(stop: int | None, length: int) -> torch.Tensor:
    """Exact probability of every continuation of token 0, as a (VOCAB,) * length tensor; a
    sequence that stops early is counted on its continuation by token `stop` repeated."""
    probs = torch.zeros((VOCAB,) * length, dtype=torch.float64)
    for sequence in itertools.product(range(VOCAB), repeat=length):
        previous, chance = 0, 1.0
        for position, token in enumerate(sequence):
            if stop is not None and position and sequence[position - 1] == stop:
                chance *= token == stop
            else:
                chance *= P[previous, token].item()
            previous = token
        probs[sequence] = chance
    return probs


def generated_cells(tokens: tuple[tuple[int, ...], ...], stop: int | None, length: int):
    """Index of each row's continuation in a flattened (VOCAB,) * length tensor."""
    padded = torch.tensor([row + (stop,) * (length - len(row)) for row in tokens])
    weights = VOCAB ** torch.arange(length - 1, -1, -1)
    return (padded * weights).sum(dim=1)


DRAFTERS = {
    "sampled-q": lambda: (MarkovDrafter(), ConstantK(2)),
    "deterministic": lambda: (MarkovDrafter(deterministic=True), ConstantK(2)),
    # draft_block's own sampling, early stops and cache bookkeeping, over a Markov "model" Q
    "model-confidence-stop": lambda: (
        ModelDrafter(MarkovTarget(Q)),
        ConfidenceStop(k=3, threshold=0.45),
    ),
}


@pytest.mark.parametrize(
    ("drafter_name", "stop"),
    [("sampled-q", None), ("sampled-q", 3), ("deterministic", 3), ("model-confidence-stop", 3)],
)
def test_generate_samples_the_target_chain(drafter_name, stop):
    rows = 100_000
    drafter, policy = DRAFTERS[drafter_name]()
    result = generate(
        MarkovTarget(),
        torch.zeros((rows, 1), dtype=torch.long),
        drafter,
        policy,
        sampling=SamplingOptions(seed=0),
        max_new_tokens=3,
        eos_token_id=stop,
    )

    cells = generated_cells(result.tokens, stop, 3)
    assert total_variation(cells, markov_sequences(stop, 3)) < TOLERANCE
    assert sum(result.stats.accepted_histogram[1:]) > 0


def test_generate_with_wrong_residual_fails_the_check(monkeypatch):
    monkeypatch.setattr(verify_module, "residual_distribution", wrong_residual)
    result = generate(
        MarkovTarget(),
        torch.zeros((100_000, 1), dtype=torch.long),
        MarkovDrafter(),
        ConstantK(2),
        sampling=SamplingOptions(seed=0),
        max_new_tokens=3,
    )

    cells = generated_cells(result.tokens, None, 3)
    assert total_variation(cells, markov_sequences(None, 3)) > 3 * TOLERANCE


def test_plain_sampling_without_drafter():
    result = generate(
        MarkovTarget(),
        torch.zeros((100_000, 1), dtype=torch.long),
        sampling=SamplingOptions(seed=1),
        max_new_tokens=2,
    )

    cells = generated_cells(result.tokens, None, 2)
    assert total_variation(cells, markov_sequences(None, 2)) < TOLERANCE


def test_sampling_with_models_is_reproducible_from_the_seed():
    target = CausalLM(tiny_llama(layers=2, seed=3))
    drafter = ModelDrafter(CausalLM(tiny_llama(layers=1, seed=4)))
    options = SamplingOptions(temperature=0.8, top_k=20, top_p=0.9, seed=5)

    def run(seed: int) -> tuple:
        sampling = SamplingOptions(options.temperature, options.top_k, options.top_p, seed)
        return generate(target, PROMPTS, drafter, sampling=sampling, max_new_tokens=12).tokens

    first = run(5)
    assert run(5) == first
    assert run(6) != first
    assert all(len(row) == 12 for row in first)


def test_apply_sampling_temperature_top_k_top_p():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).log_softmax(dim=-1)

    assert torch.allclose(apply_sampling(logits, 1.0), logits.softmax(dim=-1))
    assert torch.allclose(apply_sampling(logits, 0.5), (logits * 2).softmax(dim=-1))
    top2 = apply_sampling(logits, 1.0, top_k=2)
    assert (top2[2:] == 0).all() and torch.isclose(top2.sum(), torch.tensor(1.0))
    probs = logits.softmax(dim=-1)  # ~ [0.64, 0.24, 0.09, 0.03]
    nucleus = apply_sampling(logits, 1.0, top_p=0.8)
    assert (nucleus[:2] > 0).all() and (nucleus[2:] == 0).all()
    assert torch.allclose(nucleus[:2], probs[:2] / probs[:2].sum())
    assert (apply_sampling(logits, 1.0, top_p=0.01) == torch.tensor([1.0, 0, 0, 0])).all()
    # a top_p that rounds to 0 in float32 dropped the best token too: NaN probabilities
    assert (apply_sampling(logits, 1.0, top_p=1e-46) == torch.tensor([1.0, 0, 0, 0])).all()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (SamplingOptions(temperature=0.0), "temperature"),
        (SamplingOptions(temperature=float("inf")), "temperature must be finite"),
        (SamplingOptions(temperature=float("nan")), "temperature"),
        (SamplingOptions(temperature=1e-38), "temperature must be at least 1e-30"),  # NaN
        (SamplingOptions(top_k=-1), "top_k"),
        (SamplingOptions(top_p=0.0), "top_p"),
        (SamplingOptions(top_p=1.5), "top_p"),
    ],
)
def test_sampling_options_validate_names_the_bad_field(options, field):
    with pytest.raises(ValueError, match=field):
        options.validate()

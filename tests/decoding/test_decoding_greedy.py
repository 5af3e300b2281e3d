"""Greedy speculative decoding is the target's greedy decoding, token for token."""

from __future__ import annotations

import pytest
import torch

from decoding import (
    Adaptive,
    CausalLM,
    ConfidenceStop,
    ConstantK,
    DecodeStats,
    EarlyExitDrafter,
    Heuristic,
    ModelDrafter,
    PromptLookupDrafter,
    generate,
)
from tests.decoding.conftest import MAX_NEW, PROMPTS, hf_greedy, tiny_llama

DRAFTERS = {
    "small-model": lambda target, models: ModelDrafter(CausalLM(models.draft)),
    "draft-is-target": lambda target, models: ModelDrafter(CausalLM(models.target)),
    "unrelated-model": lambda target, models: ModelDrafter(CausalLM(models.unrelated)),
    "prompt-lookup": lambda target, models: PromptLookupDrafter(max_ngram=3, min_ngram=1),
    "early-exit": lambda target, models: EarlyExitDrafter(target.early_exit(2)),
}
POLICIES = {
    "constant": lambda: ConstantK(3),
    "heuristic": lambda: Heuristic(start=2, high=8),
    "confidence": lambda: ConfidenceStop(k=5, threshold=0.5),
    "adaptive": lambda: Adaptive(k_max=6),
    "adaptive-confident": lambda: Adaptive(k_max=6, confidence_stop=0.5),
}


def truncate_at(tokens: tuple[int, ...], eos: int) -> tuple[int, ...]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("drafter_name", DRAFTERS)
def test_speculative_equals_greedy_batched_and_alone(models, references, drafter_name, policy_name):
    target = CausalLM(models.target)
    drafter = DRAFTERS[drafter_name](target, models)
    policy = POLICIES[policy_name]()

    batched = generate(target, PROMPTS, drafter, policy, max_new_tokens=MAX_NEW)
    alone = [
        generate(target, [prompt], drafter, policy, max_new_tokens=MAX_NEW).tokens[0]
        for prompt in PROMPTS
    ]

    assert batched.tokens == references
    assert tuple(alone) == references
    assert batched.stats.generated_tokens == MAX_NEW * len(PROMPTS)


def test_plain_greedy_equals_transformers_generate_float32():
    model = tiny_llama(layers=3, seed=7, dtype=torch.float32)
    target = CausalLM(model)
    expected = tuple(hf_greedy(model, list(prompt), 24) for prompt in PROMPTS)

    alone = tuple(generate(target, [prompt], max_new_tokens=24).tokens[0] for prompt in PROMPTS)
    batched = generate(target, PROMPTS, max_new_tokens=24)

    assert alone == expected
    assert batched.tokens == expected
    assert batched.stats.target_calls == 24
    assert batched.stats.accepted_histogram == (24 * len(PROMPTS),)


class RecordingPolicy(ConstantK):
    """ConstantK that keeps every BlockOutcome it is given."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.outcomes = []

    def update(self, outcome) -> None:
        self.outcomes.append(outcome)


def test_block_outcomes_count_each_drafted_position_per_row(models):
    target = CausalLM(models.target)
    policy = RecordingPolicy(3)

    generate(target, PROMPTS, ModelDrafter(CausalLM(models.unrelated)), policy, max_new_tokens=9)

    drafted = [outcome for outcome in policy.outcomes if outcome.width]
    assert drafted
    for outcome in drafted:
        reached, kept = outcome.reached, outcome.kept
        assert len(reached) == len(kept) == outcome.width
        assert reached[0] <= len(PROMPTS)
        # A row verifies a later draft only if it kept every one before it.
        assert all(later <= earlier for later, earlier in zip(reached[1:], kept, strict=False))
        assert sum(kept) == outcome.accepted
        # A row verified a draft it did not keep exactly where its block was rejected.
        assert sum(r - k for r, k in zip(reached, kept, strict=True)) == outcome.rejections


def test_draft_equal_to_target_accepts_every_token(models, references):
    target = CausalLM(models.target)
    drafter = ModelDrafter(CausalLM(models.target))

    result = generate(target, PROMPTS, drafter, ConstantK(3), max_new_tokens=MAX_NEW)

    assert result.tokens == references
    # 16 tokens per row: the prompt's call commits 1 (nothing is drafted before the prompt is
    # cached), 3 blocks of 3 accepted drafts + the target's own token commit 12, and the last
    # block drafts the 2 the budget leaves before its own token.
    rows = len(PROMPTS)
    assert result.stats.accepted_histogram == (rows, 0, rows, 3 * rows)
    assert result.stats.target_calls == 5
    assert result.stats.tokens_per_target_call == MAX_NEW * rows / 5


def test_a_width_invariant_target_verifies_a_draft_in_the_prompts_call(models, references):
    # A target whose positions score alike in any block (Whisper's exact mode) saves the call
    # that would score the prompts alone: 4 blocks of 3 accepted drafts + its own token.
    class WidthInvariant(CausalLM):
        width_invariant = True

    target = WidthInvariant(models.target)
    drafter = ModelDrafter(CausalLM(models.target))

    result = generate(target, PROMPTS, drafter, ConstantK(3), max_new_tokens=MAX_NEW)

    assert result.tokens == references
    assert result.stats.accepted_histogram == (0, 0, 0, 4 * len(PROMPTS))
    assert result.stats.target_calls == 4
    unrelated = generate(
        target, PROMPTS, ModelDrafter(CausalLM(models.unrelated)), ConstantK(3),
        max_new_tokens=MAX_NEW,
    )  # fmt: skip
    assert unrelated.tokens == references


def test_unrelated_draft_accepts_almost_nothing_and_changes_nothing(models, references):
    target = CausalLM(models.target)
    drafter = ModelDrafter(CausalLM(models.unrelated))

    result = generate(target, PROMPTS, drafter, ConstantK(4), max_new_tokens=MAX_NEW)

    histogram = result.stats.accepted_histogram
    assert result.tokens == references
    assert histogram[0] >= 0.8 * sum(histogram)


@pytest.mark.parametrize("drafter_name", ["draft-is-target", "small-model", "prompt-lookup"])
def test_eos_inside_a_drafted_block_stops_the_row_there(models, references, drafter_name):
    eos = references[0][6]  # 7th token: inside the second block of 5 when everything is kept
    expected = tuple(truncate_at(row, eos) for row in references)
    target = CausalLM(models.target)
    drafter = DRAFTERS[drafter_name](target, models)

    batched = generate(
        target, PROMPTS, drafter, ConstantK(4), max_new_tokens=MAX_NEW, eos_token_id=eos
    )
    alone = [
        generate(
            target, [p], drafter, ConstantK(4), max_new_tokens=MAX_NEW, eos_token_id=[eos]
        ).tokens[0]
        for p in PROMPTS
    ]
    plain = generate(target, PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=eos)

    assert batched.tokens == expected
    assert tuple(alone) == expected
    assert plain.tokens == expected
    assert len(expected[0]) == references[0].index(eos) + 1 <= 7


@pytest.mark.parametrize("max_new_tokens", [1, 2, 6, 7])
@pytest.mark.parametrize("drafter_name", ["draft-is-target", "small-model"])
def test_max_new_tokens_reached_inside_a_block(models, references, drafter_name, max_new_tokens):
    target = CausalLM(models.target)
    drafter = DRAFTERS[drafter_name](target, models)

    result = generate(target, PROMPTS, drafter, ConstantK(4), max_new_tokens=max_new_tokens)

    assert result.tokens == tuple(row[:max_new_tokens] for row in references)


def test_rows_of_different_lengths_leave_the_batch_independently(models, references):
    """One row stops at EOS early, the others run on; results come back in prompt order."""
    eos = references[1][2]
    expected = tuple(truncate_at(row, eos) for row in references)
    target = CausalLM(models.target)
    drafter = ModelDrafter(CausalLM(models.draft))

    result = generate(
        target, PROMPTS, drafter, Heuristic(), max_new_tokens=MAX_NEW, eos_token_id=eos
    )

    assert result.tokens == expected
    assert result.stats.generated_tokens == sum(len(row) for row in expected)


def test_prompt_as_tensor_and_argument_checks(models, references):
    target = CausalLM(models.target)
    prompt = torch.tensor([PROMPTS[0]])

    assert generate(target, prompt, max_new_tokens=MAX_NEW).tokens == references[:1]
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, prompt, max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(target, [[1], []])


def test_decode_stats_add():
    a = DecodeStats(2, 5, (1, 0, 1), 7, 0.5, 1.0)
    b = DecodeStats(1, 0, (3,), 1, 0.25, 0.5)

    total = a + b

    assert total == DecodeStats(3, 5, (4, 0, 1), 8, 0.75, 1.5)
    assert total.tokens_per_target_call == 8 / 3
    assert DecodeStats().tokens_per_target_call == 0.0


def test_sum_logprobs_are_the_target_log_probabilities_of_the_new_tokens(models, references):
    target = CausalLM(models.target)
    drafter = ModelDrafter(CausalLM(models.draft))

    plain = generate(target, PROMPTS, max_new_tokens=MAX_NEW)
    speculative = generate(target, PROMPTS, drafter, ConstantK(3), max_new_tokens=MAX_NEW)

    for row, (prompt, new) in enumerate(zip(PROMPTS, references, strict=True)):
        sequence = torch.tensor([list(prompt) + list(new)])
        with torch.no_grad():
            logprobs = models.target(input_ids=sequence).logits[0].log_softmax(dim=-1)
        expected = sum(logprobs[len(prompt) - 1 + i, token].item() for i, token in enumerate(new))
        assert abs(plain.sum_logprobs[row] - expected) < 1e-4  # float32 log-softmax
        assert abs(speculative.sum_logprobs[row] - expected) < 1e-4  # float32 log-softmax


def test_one_token_prompt_next_to_long_ones(models):
    """The short row's block is mostly padding on the first step; it must not leak."""
    prompts = ([3], *PROMPTS)
    expected = tuple(hf_greedy(models.target, list(prompt), 10) for prompt in prompts)
    target = CausalLM(models.target)

    plain = generate(target, prompts, max_new_tokens=10)
    speculative = generate(
        target, prompts, EarlyExitDrafter(target.early_exit(2)), ConstantK(3), max_new_tokens=10
    )

    assert plain.tokens == expected
    assert speculative.tokens == expected


def test_on_step_sees_every_committed_token_in_order_and_can_stop(models, references):
    """Each row's tokens, step by step, add up to its result; stopping keeps what was
    committed, with every row's own tokens (a server streams and stops on this)."""
    target = CausalLM(models.target)
    drafter = ModelDrafter(CausalLM(models.draft))
    seen: list[list[int]] = [[] for _ in PROMPTS]

    def record(new: tuple[tuple[int, ...], ...]) -> bool:
        assert len(new) == len(PROMPTS)
        for row, tokens in enumerate(new):
            seen[row].extend(tokens)
        return False

    result = generate(
        target, PROMPTS, drafter, ConstantK(3), max_new_tokens=MAX_NEW, on_step=record
    )
    assert result.tokens == references
    assert tuple(map(tuple, seen)) == references

    steps = []

    def stop_after_three(new: tuple[tuple[int, ...], ...]) -> bool:
        steps.append(new)
        return len(steps) == 3

    stopped = generate(
        target, PROMPTS, drafter, ConstantK(3), max_new_tokens=MAX_NEW, on_step=stop_after_three
    )
    assert len(steps) == 3
    for row, tokens in enumerate(stopped.tokens):
        assert tokens == tuple(t for step in steps for t in step[row])
        assert tokens == references[row][: len(tokens)] and len(tokens) < MAX_NEW


def test_the_policy_learns_no_price_from_the_drafts_first_block(models, references):
    """The draft's first block of a generation also feeds it the whole prompt (and in a fresh
    process sets up its kernels): its times must not price k, its acceptance still counts."""

    class Recording(ConstantK):
        def __init__(self) -> None:
            super().__init__(3)
            self.outcomes = []

        def update(self, outcome) -> None:
            self.outcomes.append(outcome)

    target = CausalLM(models.target)
    policy = Recording()
    result = generate(
        target, PROMPTS[:1], ModelDrafter(CausalLM(models.draft)), policy, max_new_tokens=MAX_NEW
    )

    assert result.tokens[0] == references[0]
    drafted = [outcome for outcome in policy.outcomes if outcome.k > 0]
    assert len(drafted) >= 2
    assert drafted[0].includes_prefill and drafted[0].proposed == 3
    assert not any(outcome.includes_prefill for outcome in drafted[1:])


def test_a_tree_needs_a_drafter_greedy_decoding_and_a_target_that_copies_positions(models):
    from decoding import SamplingOptions

    target = CausalLM(models.target)
    drafter = ModelDrafter(CausalLM(models.draft))
    with pytest.raises(ValueError, match="branches must be >= 1"):
        generate(target, PROMPTS, drafter, branches=0)
    with pytest.raises(ValueError, match="needs a drafter and greedy decoding"):
        generate(target, PROMPTS, None, branches=2)
    with pytest.raises(ValueError, match="needs a drafter and greedy decoding"):
        generate(target, PROMPTS, drafter, sampling=SamplingOptions(0.7), branches=2)
    with pytest.raises(ValueError, match="CausalLM cannot copy cached positions"):
        generate(target, PROMPTS, drafter, branches=2)


def test_every_chain_of_a_group_takes_its_groups_longest_accepted_chain():
    from decoding.generate import _best_chains
    from decoding.verify import Verdict

    # Two prompts, three chains each: the first prompt's second chain accepted most; the
    # second prompt's chains tie, and the draft's own choice (the first) wins the tie.
    accepted = torch.tensor([1, 2, 0, 1, 1, 0])
    tokens = torch.arange(18).view(6, 3)
    logits = torch.arange(6.0).view(6, 1, 1).expand(6, 3, 4)
    proposals = torch.arange(12).view(6, 2)
    verdict, followed_logits, followed_proposals, source = _best_chains(
        Verdict(accepted=accepted, tokens=tokens), logits, proposals, 3
    )

    assert source.tolist() == [1, 1, 1, 3, 3, 3]
    assert verdict.accepted.tolist() == [2, 2, 2, 1, 1, 1]
    assert torch.equal(verdict.tokens, tokens[source])
    assert torch.equal(followed_logits, logits[source])
    assert torch.equal(followed_proposals, proposals[source])

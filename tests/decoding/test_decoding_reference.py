"""The batched loop (`decoding.generate`) against the one-row reference loop
(`decoding.reference.speculative_greedy`), token for token and target call for target call."""

from __future__ import annotations

import pytest

from decoding import (
    CausalLM,
    ConstantK,
    EarlyExitDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    generate,
)
from decoding.reference import speculative_greedy
from tests.decoding.conftest import MAX_NEW, PROMPTS

DRAFTERS = {
    "none": lambda target, models: None,
    "small-model": lambda target, models: ModelDrafter(CausalLM(models.draft)),
    "unrelated-model": lambda target, models: ModelDrafter(CausalLM(models.unrelated)),
    "prompt-lookup": lambda target, models: PromptLookupDrafter(max_ngram=3, min_ngram=1),
    "early-exit": lambda target, models: EarlyExitDrafter(target.early_exit(2)),
}


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("drafter_name", DRAFTERS)
def test_generate_equals_the_reference_loop(models, references, drafter_name, k):
    target = CausalLM(models.target)
    drafter = DRAFTERS[drafter_name](target, models)

    alone = [speculative_greedy(target, drafter, prompt, k, MAX_NEW) for prompt in PROMPTS]
    batched = generate(target, PROMPTS, drafter, ConstantK(k), max_new_tokens=MAX_NEW)
    one_row = [
        generate(target, [prompt], drafter, ConstantK(k), max_new_tokens=MAX_NEW)
        for prompt in PROMPTS
    ]

    assert tuple(result.tokens for result in alone) == references  # transformers' greedy
    assert batched.tokens == references
    # One row at a time, the loops also take the same steps: the same drafts were accepted.
    assert [r.stats.target_calls for r in one_row] == [r.target_calls for r in alone]


@pytest.mark.parametrize("drafter_name", ["small-model", "prompt-lookup"])
def test_generate_stops_where_the_reference_loop_stops(models, references, drafter_name):
    target = CausalLM(models.target)
    drafter = DRAFTERS[drafter_name](target, models)
    stop = references[0][6]  # met by the first prompt, perhaps by the others

    alone = [speculative_greedy(target, drafter, p, 4, MAX_NEW, (stop,)) for p in PROMPTS]
    batched = generate(
        target, PROMPTS, drafter, ConstantK(4), max_new_tokens=MAX_NEW, eos_token_id=stop
    )

    assert batched.tokens == tuple(result.tokens for result in alone)
    assert alone[0].tokens == references[0][: references[0].index(stop) + 1]

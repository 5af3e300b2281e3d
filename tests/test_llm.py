"""Speculative decoding on the real embedded LMs: every drafter gives the target's greedy output."""

from __future__ import annotations

import pytest
import torch

from app.cli import main
from app.llm import DraftOptions, prompt_ids, run_generation

pytestmark = pytest.mark.slow

PROMPTS = [
    "The history of the printing press begins in",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]
NEW_TOKENS = 24


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Block widths change the summation order inside matmuls; one thread keeps runs repeatable.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def greedy(gemma):
    return run_generation(gemma, PROMPTS, DraftOptions(), max_new_tokens=NEW_TOKENS).tokens


def test_plain_greedy_equals_transformers_generate(gemma, greedy):
    for prompt, ours in zip(PROMPTS, greedy, strict=True):
        ids = torch.tensor([prompt_ids(gemma, prompt)])
        with torch.inference_mode():
            theirs = gemma.model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        assert tuple(theirs[0, ids.shape[1] :].tolist()) == ours


@pytest.mark.parametrize("policy", ["constant", "heuristic", "confidence", "adaptive"])
def test_int8_self_draft_is_lossless_with_every_policy(gemma, gemma_int8, greedy, policy):
    options = DraftOptions(assistant=gemma_int8.name, policy=policy)
    result = run_generation(gemma, PROMPTS, options, gemma_int8, max_new_tokens=NEW_TOKENS)
    assert result.tokens == greedy
    if policy != "adaptive":  # adaptive may decide not to draft at all
        assert result.stats.tokens_per_target_call > 1.5  # the int8 copy agrees most of the time


@pytest.mark.parametrize(
    "options",
    [DraftOptions(prompt_lookup=4), DraftOptions(early_exit=6, policy="constant", k=2)],
    ids=["prompt-lookup", "early-exit"],
)
def test_prompt_lookup_and_early_exit_are_lossless(gemma, greedy, options):
    result = run_generation(gemma, PROMPTS, options, max_new_tokens=NEW_TOKENS)
    assert result.tokens == greedy
    assert result.stats.target_calls < 2 * NEW_TOKENS + 2  # one call per step, both rows


def test_cross_tokenizer_assistant_is_lossless(gemma, smollm2, greedy):
    assert smollm2.vocabulary != gemma.vocabulary
    options = DraftOptions(assistant=smollm2.name)
    result = run_generation(gemma, PROMPTS, options, smollm2, max_new_tokens=NEW_TOKENS)
    assert result.tokens == greedy
    assert result.stats.draft_calls > 0


def test_each_row_alone_equals_the_batch(gemma, gemma_int8, greedy):
    options = DraftOptions(assistant=gemma_int8.name)
    for prompt, batched in zip(PROMPTS, greedy, strict=True):
        alone = run_generation(gemma, [prompt], options, gemma_int8, max_new_tokens=NEW_TOKENS)
        assert alone.tokens == (batched,)


def test_cli_generate_prints_text_and_stats(capsys, gemma, greedy):
    code = main(
        ["generate", "--prompt-lookup", "3", "--max-new-tokens", str(NEW_TOKENS), PROMPTS[0]]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert captured.out.rstrip("\n") == gemma.tokenizer.decode(greedy[0], skip_special_tokens=True)
    assert f"{NEW_TOKENS} tokens" in captured.err and "tokens per target call" in captured.err


def test_conflicting_draft_options_are_refused():
    with pytest.raises(ValueError, match="choose one drafter, not assistant and prompt_lookup"):
        DraftOptions(assistant="x", prompt_lookup=3).validate()
    with pytest.raises(ValueError, match="k must be >= 1"):
        DraftOptions(k=0).validate()

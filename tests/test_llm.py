"""Speculative decoding on the real embedded LMs: every drafter gives the target's greedy output."""

from __future__ import annotations

import pytest
import torch

from app.cli import main
from app.llm import DraftOptions, draft_policy, prompt_ids, run_generation, run_generation_ids
from tests.conftest import torch_threads

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

PROMPTS = [
    "The history of the printing press begins in",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def greedy(gemma):
    with torch_threads(1):  # as the tests that compare against it
        return run_generation(gemma, PROMPTS, DraftOptions(), max_new_tokens=NEW_TOKENS).tokens


def test_plain_greedy_equals_transformers_generate(gemma, greedy):
    for prompt, ours in zip(PROMPTS, greedy, strict=True):
        ids = torch.tensor([prompt_ids(gemma, prompt)])
        with torch.inference_mode():
            theirs = gemma.model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        assert tuple(theirs[0, ids.shape[1] :].tolist()) == ours


POLICIES = ["constant", "heuristic", "confidence", "adaptive"]
DRAFTERS = {
    "int8-self-draft": lambda models: (DraftOptions(assistant="int8"), models["int8"]),
    "prompt-lookup": lambda models: (DraftOptions(prompt_lookup=4), None),
    "early-exit": lambda models: (DraftOptions(early_exit=6, k=2), None),
    "smollm2-cross-tokenizer": lambda models: (DraftOptions(assistant="smollm2"), models["cross"]),
}


@pytest.fixture(scope="module")
def models(gemma_int8, smollm2):
    return {"int8": gemma_int8, "cross": smollm2}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_every_drafter_and_policy_is_lossless(gemma, models, greedy, drafter, policy):
    options, assistant = DRAFTERS[drafter](models)
    options = DraftOptions(**{**options.__dict__, "policy": policy})
    result = run_generation(gemma, PROMPTS, options, assistant, max_new_tokens=NEW_TOKENS)
    assert result.tokens == greedy
    if drafter == "int8-self-draft" and policy != "adaptive":  # adaptive may stop drafting
        # Both rows commit per call: the int8 copy mostly agrees, so well over 1 each.
        assert result.stats.tokens_per_target_call > 2 * 1.5


def test_draft_equal_to_target_accepts_everything(gemma, greedy):
    options = DraftOptions(assistant=gemma.name, policy="constant", k=4)
    result = run_generation(gemma, PROMPTS[:1], options, gemma, max_new_tokens=NEW_TOKENS - 4)
    assert result.tokens == (greedy[0][: NEW_TOKENS - 4],)
    histogram = result.stats.accepted_histogram
    # Only the prompt's call (nothing drafted before the prompt is cached) and the last block,
    # cut by the token budget, accept fewer than k.
    assert sum(histogram[:-1]) <= 2 and histogram[-1] >= 3


def test_random_draft_is_rejected_yet_lossless(gemma, greedy):
    from transformers import AutoModelForCausalLM

    from app.llm import LanguageModel

    config = type(gemma.model.config)(**{
        **gemma.model.config.to_dict(), "num_hidden_layers": 1, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 32, "layer_types": ["full_attention"],
    })  # fmt: skip
    torch.manual_seed(0)
    random = AutoModelForCausalLM.from_config(config).eval()
    draft = LanguageModel("random", random, gemma.tokenizer)
    options = DraftOptions(assistant="random", policy="constant", k=3)
    result = run_generation(gemma, PROMPTS, options, draft, max_new_tokens=NEW_TOKENS)
    assert result.tokens == greedy
    histogram = result.stats.accepted_histogram  # per row and step: drafts accepted
    assert sum(n * count for n, count in enumerate(histogram)) <= 2


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


def test_cli_generate_takes_the_servers_drafter_words(capsys, gemma, greedy):
    """`--assistant none | prompt-lookup:N | early-exit:L`, as `serve --text-assistant` takes
    them: the same text, drafted as the flags of their own would draft it."""
    import re

    base = ["generate", "--max-new-tokens", str(NEW_TOKENS), PROMPTS[0]]
    expected = gemma.tokenizer.decode(greedy[0], skip_special_tokens=True)
    # The histogram holds a bucket per accepted length, 0..k: its length tells the drafter.
    for words, buckets in (("none", 1), ("prompt-lookup:3", 4), ("early-exit:6", 5)):
        assert main([*base, "--assistant", words]) == 0, words
        captured = capsys.readouterr()
        assert captured.out.rstrip("\n") == expected, words
        histogram = re.search(r"accepted-length histogram \[([^\]]*)\]", captured.err).group(1)
        assert len(histogram.split(",")) == buckets, (words, captured.err)
    with pytest.raises(SystemExit) as refused:  # one drafter flag at a time (argparse)
        main([*base, "--assistant", "prompt-lookup", "--prompt-lookup", "3"])
    assert refused.value.code == 2
    assert "not allowed with argument --assistant" in capsys.readouterr().err
    assert main([*base, "--assistant", "early-exit:x"]) == 2
    said = capsys.readouterr().err  # the option given is named, not serve's
    assert "--assistant early-exit:x: 'x' is not a whole number" in said
    assert "--text-assistant" not in said
    assert main([*base, "--assistant", "none", "--k", "3"]) == 2
    assert "--k only applies with a drafter" in capsys.readouterr().err


def test_cli_refuses_sampling_options_without_sample(capsys):
    assert main(["generate", "Once upon a time", "--temperature", "0.5", "--seed", "3"]) == 2
    assert "--temperature, --seed only apply with --sample" in capsys.readouterr().err
    assert main(["generate", "Once upon a time", "--seed", "3"]) == 2
    assert (
        "--seed only applies with --sample (greedy decoding ignores it)" in capsys.readouterr().err
    )


def test_cli_refuses_draft_options_that_would_change_nothing(capsys):
    # Refused before a model loads, as sampling options without --sample are (they were
    # ignored: a user tuning --k without a drafter saw no difference and no reason).
    refused = {
        ("--k", "7"): "--k only applies with a drafter",
        ("--policy", "adaptive", "--k", "7"): "--k and --policy only apply with a drafter",
        ("--ngram", "2"): "--ngram only applies with --prompt-lookup",
        ("--prompt-lookup", "4", "--k", "9"): "--prompt-lookup N sets the draft length",
        # named as given (it spoke of --prompt-lookup N, which a user of this form never wrote)
        ("--assistant", "prompt-lookup:4", "--k", "9"): "--assistant prompt-lookup:4 sets the "
        "draft length (4): leave --k out",
        # a block far past any draft's agreement ran 20 times slower than plain decoding
        ("--early-exit", "6", "--k", "100"): "k must be from 1 to 32 tokens (got 100)",
        ("--prompt-lookup", "33"): "--prompt-lookup must be from 1 to 32 tokens (got 33)",
    }
    for extra, message in refused.items():
        assert main(["generate", "Once upon a time", *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra


def test_bare_prompt_lookup_takes_its_length_from_k():
    import argparse

    from app.cli import _drafter_words

    given = argparse.Namespace(assistant="prompt-lookup", k=6, prompt_lookup=None, early_exit=None)
    moved = _drafter_words(given)
    assert (moved.assistant, moved.prompt_lookup, moved.k) == (None, 6, None)
    given = argparse.Namespace(assistant="prompt-lookup", k=None, prompt_lookup=None)
    assert _drafter_words(given).prompt_lookup == 4  # its default


@pytest.mark.slow
def test_cli_chat_puts_the_prompt_through_the_chat_template(capsys, smollm2):
    # An instruct model prompted with bare text ended at once (EOS: a blank line); as a user's
    # message it answers. A base model has no template to use.
    question = "What is the capital of France? Answer in one word."
    assert (
        main(["generate", "--model", "smollm2-135m", "--chat", question, "--max-new-tokens", "12"])
        == 0
    )
    assert "Paris" in capsys.readouterr().out
    assert main(["generate", "--chat", question, "--max-new-tokens", "4"]) == 2
    assert "gemma-3-270m has no chat template" in capsys.readouterr().err


def test_cli_reads_the_prompt_from_stdin(capsys, monkeypatch, gemma, greedy):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPTS[0]))
    assert main(["generate", "-", "--max-new-tokens", str(NEW_TOKENS)]) == 0
    assert capsys.readouterr().out.rstrip("\n") == gemma.tokenizer.decode(
        greedy[0], skip_special_tokens=True
    )


def test_an_int8_target_is_not_drafted_for(capsys, gemma_int8):
    """Its layers quantize a call's rows together, so a drafted block scored its positions
    otherwise than plain steps: "The capital of France is" went on "full of history" alone and
    "has been inhabited" with prompt lookup (hunt). Refused before a model loads, and by the
    Python API."""
    for drafter in (("--prompt-lookup", "3"), ("--early-exit", "4"), ("--assistant", "gemma")):
        command = ["generate", "Paris is", "--model", "gemma-3-270m:int8", *drafter]
        assert main(command) == 2, drafter
        assert "gemma-3-270m:int8 cannot be drafted for losslessly" in capsys.readouterr().err
    with pytest.raises(ValueError, match="its int8 layers quantize a call's rows together"):
        run_generation(gemma_int8, PROMPTS, DraftOptions(prompt_lookup=3), max_new_tokens=4)
    plain = run_generation(gemma_int8, PROMPTS[:1], DraftOptions(), max_new_tokens=2)
    assert len(plain.tokens[0]) == 2  # decoded alone, it runs


def test_cli_takes_a_prompt_that_is_not_utf8_and_refuses_a_model_it_cannot_have(capsys):
    """Latin-1 bytes in a prompt ended in the tokenizer's TypeError, and a hub id not in the
    cache in transformers' traceback (hunt)."""
    from app.cli import _as_text

    latin1 = b"caf\xe9 \xff is".decode("utf-8", "surrogateescape")  # as argv or stdin give it
    assert _as_text(latin1) == "caf\ufffd \ufffd is"
    assert _as_text("caf\u00e9 \ud800") == "caf\u00e9 ?"  # a surrogate no decoding made
    assert main(["generate", latin1, "--max-new-tokens", "1"]) == 0
    for option in ("--model", "--assistant"):
        assert main(["generate", "hi", option, "org/no-such-model"]) == 2
        assert "org/no-such-model is neither a folder nor a model" in capsys.readouterr().err


def test_conflicting_draft_options_are_refused():
    with pytest.raises(ValueError, match="choose one drafter, not assistant and prompt_lookup"):
        DraftOptions(assistant="x", prompt_lookup=3).validate()
    with pytest.raises(ValueError, match="k must be from 1 to 32 tokens"):
        DraftOptions(k=0).validate()


def test_a_request_longer_than_the_context_is_refused_before_decoding(capsys):
    from app.cli import main

    assert main(["generate", "Hello there", "--max-new-tokens", "100000000000"]) == 2
    err = capsys.readouterr().err
    # Gemma 3's sliding-window layers bound a sequence before its 32768-token context does.
    assert "(100000000000) exceed gemma-3-270m's sliding attention window of 512 tokens" in err
    assert main(["generate", "Hello there", "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens must be at least 1, not 0" in capsys.readouterr().err


def test_a_sequence_may_fill_the_sliding_window_exactly(gemma):
    prompt = prompt_ids(gemma, "The quick brown fox jumps over the lazy dog. " * 50)
    assert 480 < len(prompt) < 512
    new = 512 - len(prompt)  # its last token is never fed: the cache holds at most 511
    result = run_generation_ids(gemma, [prompt], DraftOptions(), max_new_tokens=new)
    assert 0 < len(result.tokens[0]) <= new


def test_a_draft_with_a_shorter_context_stops_drafting_where_it_fills(smollm2, gemma):
    # SmolLM2 holds 8192 positions, a Gemma 3 draft 512 (its sliding window): the generation
    # ended in NotImplementedError once the draft's re-encoded sequence reached 512 tokens.
    prompt = prompt_ids(smollm2, "The quick brown fox jumps over the lazy dog. " * 50)
    assert len(prompt) + 40 > 512
    plain = run_generation_ids(smollm2, [prompt], DraftOptions(), max_new_tokens=40)
    options = DraftOptions(assistant=gemma.name, policy="constant", k=4)
    drafted = run_generation_ids(smollm2, [prompt], options, gemma, max_new_tokens=40)
    assert drafted.tokens == plain.tokens
    assert drafted.stats.draft_calls > 0  # it drafted while the draft had room


@pytest.mark.slow
def test_a_seeded_adaptive_sampling_run_is_said_not_to_repeat(capsys):
    from app.cli import main

    command = ["generate", "Once", "--max-new-tokens", "2", "--sample", "--seed", "1"]
    assert main([*command, "--prompt-lookup", "2", "--policy", "adaptive"]) == 0
    assert "--seed does not make this sampled run repeatable" in capsys.readouterr().err
    assert main([*command, "--prompt-lookup", "2", "--policy", "constant"]) == 0
    assert "repeatable" not in capsys.readouterr().err


def test_draft_policy_starts_from_the_options_block_and_caps_adaptive_per_drafter():
    assert draft_policy(DraftOptions(prompt_lookup=7)).next_k() == 7  # heuristic starts there
    assert draft_policy(DraftOptions(assistant="a", policy="constant", k=3)).next_k() == 3
    modelled = draft_policy(DraftOptions(assistant="a", policy="adaptive", confidence=0.3))
    assert (modelled.k_max, modelled.stop_below) == (20, 0.3)
    looked_up = draft_policy(DraftOptions(prompt_lookup=3, policy="adaptive"))
    assert (looked_up.k_max, looked_up.stop_below) == (16, 0.0)  # no confidence to stop on


def test_an_int8_draft_of_the_target_shares_its_weights_and_tokenizer(registry, gemma):
    from app.llm import load_language_model

    draft = load_language_model(registry, "gemma-3-270m:int8", loaded=gemma)
    assert draft.tokenizer is gemma.tokenizer
    assert draft.model.get_input_embeddings().weight is gemma.model.get_input_embeddings().weight
    assert isinstance(draft.model.lm_head, torch.ao.nn.quantized.dynamic.Linear)
    assert type(gemma.model.lm_head) is torch.nn.Linear  # the target keeps its float layers

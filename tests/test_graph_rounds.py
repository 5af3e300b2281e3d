"""asr.graph_rounds: greedy decoding in whole rounds on the device decodes as
`decoding.generate` does, drafted or not, and a round reads nothing on the host (so it can be
recorded as one CUDA graph; the capture itself is tested in tests/test_cuda.py)."""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
import torch

from asr.audio import load_audio
from asr.logit_rules import LogitRules, Prefixes
from asr.whisper import N_FRAMES
from asr.window_decoder import WindowBatch, WindowDecoder
from tests.conftest import SAMPLES

WINDOWS = (
    "jfk.wav",
    "librispeech_1089-134686-0002.wav",
    "librispeech_61-70968-0000.flac",
    "pyannote_sample.wav",
)


def test_prefixes_advanced_token_by_token_equal_those_read_from_the_history():
    begin, rows, steps = 100, 6, 12
    rng = random.Random(3)
    history = [[rng.choice([5, 7, 100, 101, 104, 120]) for _ in range(steps)] for _ in range(rows)]
    tensor = torch.tensor(history)
    state = Prefixes.empty(rows, "cpu")
    take = torch.tensor([rng.random() < 0.8 for _ in range(rows)])
    kept = [[] for _ in range(rows)]
    for step in range(steps):
        take = torch.tensor([rng.random() < 0.8 for _ in range(rows)])
        state = state.after(tensor[:, step], begin, take)
        for row in range(rows):
            if take[row]:
                kept[row].append(history[row][step])
        # What from_history reads of each row's kept tokens (padded with a token after them).
        width = max(map(len, kept)) + 1
        padded = torch.tensor([tokens + [0] * (width - len(tokens)) for tokens in kept])
        ends = torch.tensor([[len(tokens)] for tokens in kept])
        expected = Prefixes.from_history(padded, torch.zeros(rows, dtype=torch.long), ends, begin)
        for name in ("count", "last", "penultimate", "last_timestamp"):
            assert torch.equal(getattr(state, name), getattr(expected, name)), (step, name)


def test_a_prefix_chain_compiled_or_not_equals_advancing_column_by_column():
    """What a fused round compiles (asr.graph_rounds._prefix_chain) gives the prefixes that
    `Prefixes.after` gives column by column, before each column and after the last."""
    from asr.graph_rounds import _prefix_chain

    begin, rows, width = 100, 5, 4
    generator = torch.Generator().manual_seed(7)
    start = Prefixes.of([[5, 101], [], [102], [7, 7, 104], [103, 9]], begin, "cpu")
    tokens = torch.tensor([5, 7, 100, 101, 104, 120])[
        torch.randint(0, 6, (rows, width), generator=generator)
    ]
    take = torch.rand((rows, width), generator=generator) < 0.7
    expected = [start]
    for column in range(width):
        expected.append(expected[-1].after(tokens[:, column], begin, take[:, column]))
    compiled = torch.compile(_prefix_chain, fullgraph=True, dynamic=False)
    for chain in (_prefix_chain, compiled):
        fields = chain(*start.tensors(), tokens, take, begin)
        for column, prefixes in enumerate(expected):
            for mine, theirs in zip(fields, prefixes.tensors(), strict=True):
                assert torch.equal(mine[:, column], theirs)


@pytest.fixture(scope="module")
def windows(whisper_base, registry):
    """Four real windows as the target and the shipped draft see them; the last row's prompt
    carries previous text, so prompts differ in length."""
    from asr.whisper_drafters import load_draft

    target = whisper_base
    assistant = load_draft(target, registry.resolve("whisper-base-draft"))
    mels = []
    for name in WINDOWS:
        mel = target.log_mel(load_audio(SAMPLES / name))[:, :N_FRAMES]
        mels.append(torch.nn.functional.pad(mel, (0, N_FRAMES - mel.shape[1])))
    encoded = target.cross_attention(target.encode(torch.stack(mels)))
    sot = tuple(target.sot_sequence("en", "transcribe", True))
    previous = (target.special.sot_prev, *target.tokenizer.encode(" Good evening."))
    prompts = (sot, sot, sot, previous + sot)
    batch = WindowBatch(encoded, prompts, assistant.encode(encoded, None))
    return target, assistant, batch


def _decode(
    target,
    assistant,
    batch,
    in_rounds: bool,
    max_new_tokens=224,
    k=4,
    rows=None,
    grammar=True,
    fused=False,
):
    rules = LogitRules(target.special, target.suppress_tokens, timestamps=True)
    decoder = WindowDecoder(
        target,
        rules,
        "en",
        "transcribe",
        max_new_tokens,
        assistant,
        in_rounds=in_rounds,
        round_draft_tokens=k,
        round_draft_grammar=grammar,
        round_rows=rows,
        round_fused=fused,
    )
    return decoder.decode(batch)


@pytest.mark.slow
@pytest.mark.parametrize("max_new_tokens", [224, 5])
def test_rounds_decode_real_windows_as_generate_does_drafted_or_not(windows, max_new_tokens):
    target, assistant, batch = windows
    expected, plain_stats = _decode(target, None, batch, False, max_new_tokens)
    plain, plain_rounds = _decode(target, None, batch, True, max_new_tokens)
    drafted, drafted_rounds = _decode(target, assistant, batch, True, max_new_tokens, k=3)
    if max_new_tokens == 224:
        assert "ask not what your country can do for you" in expected[0].text
    for ours in (plain, drafted):
        # Tokens, their log-probabilities and the no-speech probabilities, bit for bit: with
        # row-invariant kernels every round scores a position as a plain step does.
        assert [(r.tokens, r.avg_logprob, r.no_speech_prob) for r in ours] == [
            (r.tokens, r.avg_logprob, r.no_speech_prob) for r in expected
        ]
    if max_new_tokens == 5:
        assert all(len(r.tokens) <= 5 for r in expected)
        assert any(len(r.tokens) == 5 for r in expected)
    assert plain_rounds.target_calls == plain_stats.target_calls
    assert plain_rounds.generated_tokens == plain_stats.generated_tokens
    assert drafted_rounds.generated_tokens == plain_stats.generated_tokens
    if max_new_tokens == 224:
        assert drafted_rounds.target_calls * 1.5 < plain_rounds.target_calls
        assert drafted_rounds.draft_calls == 3 * (drafted_rounds.target_calls - 1)
        assert sum(drafted_rounds.accepted_histogram) >= drafted_rounds.target_calls


@pytest.mark.slow
def test_windows_passing_through_fewer_rows_decode_as_in_one_batch(windows):
    """Four windows through a pool of two rows (a row whose window stops takes the next),
    drafted with the draft's suppression alone: the same tokens and probabilities."""
    target, assistant, batch = windows
    expected, _ = _decode(target, None, batch, False)
    plain, plain_stats = _decode(target, None, batch, True, rows=2)
    drafted, drafted_stats = _decode(target, assistant, batch, True, k=3, rows=2, grammar=False)
    for ours in (plain, drafted):
        assert [r.tokens for r in ours] == [r.tokens for r in expected]
        for mine, theirs in zip(ours, expected, strict=True):
            assert mine.avg_logprob == pytest.approx(theirs.avg_logprob, abs=1e-6)
            assert mine.no_speech_prob == pytest.approx(theirs.no_speech_prob, abs=1e-6)
    # Three prompt calls (the first two windows, then one per window taking a freed row), then
    # one round per token after each window's first: two rows work at once, so the rounds stay
    # within what a list schedule of the four windows on two rows takes.
    rounds = plain_stats.target_calls - 3
    per_window = [len(r.tokens) for r in expected]  # + the end token - the prompt call's
    assert max(per_window) <= rounds <= sum(per_window) / 2 + max(per_window)
    assert rounds < sum(per_window) - 10
    assert drafted_stats.target_calls * 1.5 < plain_stats.target_calls


@pytest.mark.slow
def test_a_compiled_draft_proposes_within_rounds_and_changes_nothing_committed(windows, registry):
    """The draft's steps through torch.compile (inductor; F.linear products, as on a GPU):
    every window decodes as plain greedy decoding does, with as few target calls as drafting
    eagerly takes, give or take what fused arithmetic changes in the proposals."""
    from asr.whisper_drafters import load_draft

    target, _, batch = windows
    assistant = load_draft(target, registry.resolve("whisper-base-draft"), int8=False)
    assistant.model.use_linear_kind("dense")
    expected, _ = _decode(target, None, batch, False)
    eager, eager_stats = _decode(target, assistant, batch, True, k=3, grammar=False)
    fused, fused_stats = _decode(target, assistant, batch, True, k=3, grammar=False, fused=True)
    for ours in (eager, fused):
        assert [(r.tokens, r.avg_logprob) for r in ours] == [
            (r.tokens, r.avg_logprob) for r in expected
        ]
    assert abs(fused_stats.target_calls - eager_stats.target_calls) <= 3
    # The model's switch (SPECSCRIBE_FUSED_ROUNDS, set by the service) fuses them too.
    target.fused_rounds = True
    try:
        switched, _ = _decode(target, assistant, batch, True, k=3, grammar=False)
    finally:
        target.fused_rounds = False
    assert [r.tokens for r in switched] == [r.tokens for r in expected]
    assert any(pool.fused for pool in target.round_pools.values())
    with pytest.raises(ValueError, match="masks only its suppressed ids"):
        _decode(target, assistant, batch, True, k=3, grammar=True, fused=True)


@contextmanager
def _no_host_reads():
    """Makes every read of a tensor's values on the host fail (what a CUDA graph cannot
    record)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a round read a tensor on the host")

    names = ("__bool__", "item", "tolist", "__int__", "__float__", "numpy")
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


@pytest.mark.slow
def test_a_round_reads_nothing_on_the_host(windows):
    """As a round runs where it is captured (every slot attended to; on a CPU it reads the
    positions to attend to fewer)."""
    from asr.graph_rounds import RoundGraphs

    target, assistant, batch = windows
    rules = LogitRules(target.special, target.suppress_tokens, timestamps=True)
    for draft, k in ((None, 0), (assistant.model, 2)):
        pool = RoundGraphs(target, rules, 2, draft, k, capture=False, every_slot=True)
        part = batch.rows([0, 1])
        pool.decode(part.encoded, part.prompts, 3, part.draft_encoded if draft else None)
        lengths = pool.lengths.clone()
        with torch.inference_mode(), _no_host_reads():
            pool._round()  # every row has stopped: the round computes and commits nothing
        assert torch.equal(pool.lengths, lengths)
        assert bool(pool.all_done)


def test_a_pool_refuses_more_windows_than_rows_and_a_draft_without_tokens(whisper_base):
    from asr.graph_rounds import RoundGraphs

    rules = LogitRules(whisper_base.special, whisper_base.suppress_tokens, timestamps=True)
    with pytest.raises(ValueError, match="draft_tokens"):
        RoundGraphs(whisper_base, rules, 1, draft=whisper_base, draft_tokens=0, capture=False)


@pytest.mark.slow
def test_a_draft_without_its_grammar_masks_only_the_suppressed_ids(windows):
    """asr.logit_rules.DRAFT_GRAMMAR: after a closed timestamp pair the grammar forbids every
    timestamp; a draft scoring without it still masks the suppressed ids, nothing else."""
    from asr.whisper_target import WhisperTarget

    target, _, batch = windows
    rules = LogitRules(target.special, target.suppress_tokens, timestamps=True)
    begin = target.special.timestamp_begin
    sot = list(target.sot_sequence("en", "transcribe", True))
    block = [*sot, begin, 400, 370, begin + 20, begin + 20]  # "<0.00> And so <0.40><0.40>"
    tokens = torch.tensor([block])
    positions = torch.arange(len(block))[None]
    mask = torch.ones_like(tokens, dtype=torch.bool)
    scored = {}
    for grammar in (True, False):
        model = WhisperTarget(target, batch.encoded.rows(torch.tensor([0])), rules, grammar=grammar)
        scored[grammar] = model.score(tokens, positions, mask, keep=1)[0, -1]
    assert torch.isinf(scored[True][begin:]).all()  # a closed pair: text must follow
    assert torch.isfinite(scored[False][begin:]).all()
    suppressed = [*rules.suppress_tokens, target.special.no_timestamps]
    assert torch.isinf(scored[False][suppressed]).all()
    finite = torch.isfinite(scored[False])
    assert int((~finite).sum()) == len(set(suppressed))

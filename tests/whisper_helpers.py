"""Tiny random Whisper models for the three draft shapes, and a reference greedy loop.

The random models reuse whisper-base's vocabulary, rules and mel filters and run in float64,
so that rows scored in different block shapes (last-bit differences) never flip a greedy choice.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import (
    WhisperConfig,
    WhisperForCausalLM,
    WhisperForConditionalGeneration,
)

from asr.logit_rules import LogitRules
from asr.whisper import WhisperModel, transformers_cache
from asr.window_decoder import WindowBatch, WindowDecoder, WindowResult

# The target's layers after the first add little to the residual stream, so that a draft made
# of its first layers agrees with it often, but not always: both verification paths run.
LATER_LAYER_SCALE = 0.1


def random_config(**overrides) -> WhisperConfig:
    settings = {
        "vocab_size": 51865,
        "num_mel_bins": 80,
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 3,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
        "max_source_positions": 1500,
        "max_target_positions": 448,
        "init_std": 0.2,  # peaked, varied predictions rather than near-uniform ones
    }
    return WhisperConfig(**{**settings, **overrides})


def wrap(model: torch.nn.Module, like: WhisperModel, name: str) -> WhisperModel:
    """A WhisperModel around a random model, with `like`'s tokenizer and rules."""
    model = model.to(torch.float64).eval()
    model.generation_config = copy.deepcopy(like.model.generation_config)
    return WhisperModel.from_transformers(model, like.tokenizer, name)


@dataclass(frozen=True)
class RandomWhispers:
    target: WhisperModel
    shared_encoder: WhisperModel  # the target's encoder and first decoder layer
    decoder_only: WhisperModel  # the same first decoder layer as a WhisperForCausalLM
    own_encoder: WhisperModel  # first encoder layer and first decoder layer: its own encoder
    narrow: WhisperModel  # d_model 32: cannot read the target's encoder output
    wide_mel: WhisperModel  # 128 mel bins (as large-v3): its own encoder hears its own mel


def random_whispers(like: WhisperModel, seed: int = 0) -> RandomWhispers:
    torch.manual_seed(seed)
    full = WhisperForConditionalGeneration(random_config())
    with torch.no_grad():
        layers = [*full.model.encoder.layers[1:], *full.model.decoder.layers[1:]]
        for layer in layers:
            attention = getattr(layer, "encoder_attn", layer.self_attn)
            for linear in (layer.fc2, layer.self_attn.out_proj, attention.out_proj):
                linear.weight.mul_(LATER_LAYER_SCALE)
                linear.bias.mul_(LATER_LAYER_SCALE)

    first_layer = copy.deepcopy(full)
    first_layer.model.decoder.layers = first_layer.model.decoder.layers[:1]
    first_layer.config.decoder_layers = 1
    own = copy.deepcopy(first_layer)
    own.model.encoder.layers = own.model.encoder.layers[:1]
    own.config.encoder_layers = 1
    causal = WhisperForCausalLM(random_config(decoder_layers=1))
    causal.model.decoder.load_state_dict(first_layer.model.decoder.state_dict())
    causal.proj_out.weight.data.copy_(first_layer.proj_out.weight.data)
    narrow = WhisperForConditionalGeneration(random_config(d_model=32, decoder_layers=1))
    wide_mel = WhisperForConditionalGeneration(random_config(num_mel_bins=128, decoder_layers=1))
    wide_mel.model.decoder.load_state_dict(first_layer.model.decoder.state_dict())
    return RandomWhispers(
        target=wrap(full, like, "random-target"),
        shared_encoder=wrap(first_layer, like, "random-first-layer"),
        decoder_only=wrap(causal, like, "random-decoder-only"),
        own_encoder=wrap(own, like, "random-own-encoder"),
        narrow=wrap(narrow, like, "random-narrow"),
        wide_mel=wrap(wide_mel, like, "random-wide-mel"),
    )


def reference_greedy(
    model: WhisperModel,
    audio_features: torch.Tensor,
    prompt: list[int],
    rules: LogitRules,
    max_new_tokens: int,
) -> tuple[tuple[int, ...], float, float]:
    """The per-token greedy loop that decode_window ran before it used decoding.generate,
    on transformers' own cache and cross-attention: (tokens, avg_logprob, no_speech_prob)."""
    special = model.special
    cache = transformers_cache()
    logits = transformers_decode(model, torch.tensor([prompt]), audio_features, cache)
    no_speech_prob = float(logits[0, prompt.index(special.sot)].softmax(-1)[special.no_speech])
    next_logits = logits[:, -1]
    tokens: list[int] = []
    sum_logprob = 0.0
    while True:
        masked = rules.apply(next_logits, [tokens])[0]
        token = int(masked.argmax())
        sum_logprob += float(torch.log_softmax(masked, dim=-1)[token])
        if token == special.eot:
            break
        tokens.append(token)
        if len(tokens) >= max_new_tokens or len(prompt) + len(tokens) >= model.max_context:
            break
        next_logits = transformers_decode(model, torch.tensor([[token]]), audio_features, cache)[
            :, -1
        ]
    return tuple(tokens), sum_logprob / (len(tokens) + 1), no_speech_prob


@torch.inference_mode()
def transformers_decode(
    model: WhisperModel, tokens: torch.Tensor, audio_features: torch.Tensor, cache
) -> torch.Tensor:
    """transformers' own decoder and head on a block after what `cache` holds (which it
    extends): float32 logits, Tensor, shape = (batch, n_new, vocab)."""
    out = model.model.model.decoder(
        input_ids=tokens,
        encoder_hidden_states=audio_features,
        past_key_values=cache,
        use_cache=True,
    )
    return model.model.proj_out(out.last_hidden_state).float()


def decode_window(
    model: WhisperModel,
    audio_features: torch.Tensor,
    prompt: list[int],
    rules: LogitRules,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> WindowResult:
    """Plain decoding of one window. audio_features: Tensor, shape = (1, 1500, d_model)."""
    decoder = WindowDecoder(model, rules, None, "transcribe", max_new_tokens)
    batch = WindowBatch(model.cross_attention(audio_features), (tuple(prompt),))
    results, _ = decoder.decode(batch, temperature, seed)
    return results[0]

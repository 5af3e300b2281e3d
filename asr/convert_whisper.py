"""CTranslate2 Whisper checkpoint -> transformers Whisper directory (safetensors).

The embedded Whisper weights come as CTranslate2 files (model.bin, config.json,
tokenizer.json). transformers cannot read them, so they are converted once into a regular
`WhisperForConditionalGeneration` directory that loads offline with `from_pretrained`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from asr.ct2_reader import read_ct2_model

TIME_PRECISION = 0.02
MAX_INITIAL_TIMESTAMP_INDEX = 50  # OpenAI's max_initial_timestamp = 1.0 s
MULTILINGUAL_VOCAB_SIZE = 51865  # OpenAI tells English-only vocabularies (51864) apart by size


def _linear(state: dict, prefix: str, ct2: dict, name: str) -> None:
    state[f"{prefix}.weight"] = ct2[f"{name}/weight"]
    if f"{name}/bias" in ct2:
        state[f"{prefix}.bias"] = ct2[f"{name}/bias"]


def _layer_norm(state: dict, prefix: str, ct2: dict, name: str) -> None:
    state[f"{prefix}.weight"] = ct2[f"{name}/gamma"]
    state[f"{prefix}.bias"] = ct2[f"{name}/beta"]


def _split_fused(
    state: dict, prefix: str, projections: tuple[str, ...], ct2: dict, name: str
) -> None:
    """CTranslate2 fuses q/k/v (or k/v) into one linear; transformers keeps them apart.

    Whisper's key projection has no bias: CTranslate2 stores zeros there, which we drop.
    """
    weights = ct2[f"{name}/weight"].chunk(len(projections), dim=0)
    biases = ct2[f"{name}/bias"].chunk(len(projections), dim=0)
    for projection, weight, bias in zip(projections, weights, biases, strict=True):
        state[f"{prefix}.{projection}.weight"] = weight
        if projection != "k_proj":
            state[f"{prefix}.{projection}.bias"] = bias
        elif bias.abs().max() > 0:
            raise ValueError(f"{name}: unexpected non-zero key bias")


def _count_layers(ct2: dict, side: str) -> int:
    layer = re.compile(rf"^{side}/layer_(\d+)/")
    return len({match.group(1) for key in ct2 if (match := layer.match(key))})


def _self_attention_and_ffn(state: dict, dst: str, ct2: dict, src: str) -> None:
    """The parts encoder and decoder layers share: fused self-attention, its norm, the FFN."""
    _split_fused(
        state, f"{dst}.self_attn", ("q_proj", "k_proj", "v_proj"), ct2,
        f"{src}/self_attention/linear_0",
    )  # fmt: skip
    _linear(state, f"{dst}.self_attn.out_proj", ct2, f"{src}/self_attention/linear_1")
    _layer_norm(state, f"{dst}.self_attn_layer_norm", ct2, f"{src}/self_attention/layer_norm")
    _linear(state, f"{dst}.fc1", ct2, f"{src}/ffn/linear_0")
    _linear(state, f"{dst}.fc2", ct2, f"{src}/ffn/linear_1")
    _layer_norm(state, f"{dst}.final_layer_norm", ct2, f"{src}/ffn/layer_norm")


def convert_state_dict(ct2: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    enc, dec = "model.encoder", "model.decoder"
    for conv in ("conv1", "conv2"):
        _linear(state, f"{enc}.{conv}", ct2, f"encoder/{conv}")
    state[f"{enc}.embed_positions.weight"] = ct2["encoder/position_encodings/encodings"]
    for i in range(_count_layers(ct2, "encoder")):
        _self_attention_and_ffn(state, f"{enc}.layers.{i}", ct2, f"encoder/layer_{i}")
    _layer_norm(state, f"{enc}.layer_norm", ct2, "encoder/layer_norm")

    state[f"{dec}.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    state[f"{dec}.embed_positions.weight"] = ct2["decoder/position_encodings/encodings"]
    for i in range(_count_layers(ct2, "decoder")):
        src, dst = f"decoder/layer_{i}", f"{dec}.layers.{i}"
        _self_attention_and_ffn(state, dst, ct2, src)
        _linear(state, f"{dst}.encoder_attn.q_proj", ct2, f"{src}/attention/linear_0")
        _split_fused(
            state, f"{dst}.encoder_attn", ("k_proj", "v_proj"), ct2, f"{src}/attention/linear_1"
        )
        _linear(state, f"{dst}.encoder_attn.out_proj", ct2, f"{src}/attention/linear_2")
        _layer_norm(state, f"{dst}.encoder_attn_layer_norm", ct2, f"{src}/attention/layer_norm")
    _layer_norm(state, f"{dec}.layer_norm", ct2, "decoder/layer_norm")
    return state


def _special_tokens(tokenizer_json: dict) -> dict[str, int]:
    return {t["content"]: t["id"] for t in tokenizer_json["added_tokens"] if t["special"]}


def _build_tokenizer(tokenizer_json: dict, vocab_size: int):
    """A WhisperTokenizer whose special and timestamp tokens have OpenAI's ids.

    The special tokens must be registered as such: transformers derives the first timestamp
    id from the last special id, and without them `<|0.00|>` decodes as `<|2.12|>`.
    Timestamp tokens fill the ids after `<|notimestamps|>` up to the model's vocabulary size.
    """
    from transformers import AddedToken, WhisperTokenizer

    model = tokenizer_json["model"]
    specials = sorted(_special_tokens(tokenizer_json).items(), key=lambda item: item[1])
    # tokenizer.json writes a merge as "a b" (older) or ["a", "b"] (newer).
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = WhisperTokenizer(vocab=model["vocab"], merges=merges)
    tokenizer.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(content, special=True, normalized=False) for content, _ in specials
            ]
        }
    )
    first_timestamp = specials[-1][1] + 1
    timestamps = [
        AddedToken(f"<|{i * TIME_PRECISION:.2f}|>", special=False, normalized=True)
        for i in range(vocab_size - first_timestamp)
    ]
    tokenizer.add_tokens(timestamps)
    for content, token_id in specials:
        actual = tokenizer.convert_tokens_to_ids(content)
        if actual != token_id:
            raise ValueError(
                f"tokenizer conversion: {content} got id {actual}, expected {token_id}"
            )
    if len(tokenizer) != vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, the model {vocab_size}")
    return tokenizer


def _generation_config(
    ct2_config: dict, specials: dict[str, int], vocab_size: int, decoder_layers: int
) -> dict:
    languages = {
        content: token_id
        for content, token_id in specials.items()
        if token_id in ct2_config["lang_ids"]
    }
    # English-only checkpoints still carry the language tokens; OpenAI tells them apart by size.
    multilingual = vocab_size >= MULTILINGUAL_VOCAB_SIZE
    eos = specials["<|endoftext|>"]
    config = {
        "alignment_heads": ct2_config["alignment_heads"],
        "begin_suppress_tokens": ct2_config["suppress_ids_begin"],
        "bos_token_id": eos,
        "decoder_start_token_id": specials["<|startoftranscript|>"],
        "eos_token_id": eos,
        "pad_token_id": eos,
        "is_multilingual": multilingual,
        "max_initial_timestamp_index": MAX_INITIAL_TIMESTAMP_INDEX,
        "max_length": 448,
        "no_timestamps_token_id": specials["<|notimestamps|>"],
        "prev_sot_token_id": specials["<|startofprev|>"],
        "suppress_tokens": ct2_config["suppress_ids"],
        "return_timestamps": False,
    }
    if multilingual:
        config["lang_to_id"] = languages
        config["task_to_id"] = {
            "transcribe": specials["<|transcribe|>"],
            "translate": specials["<|translate|>"],
        }
    if any(layer >= decoder_layers for layer, _ in config["alignment_heads"]):
        raise ValueError("alignment heads refer to a decoder layer the model does not have")
    return config


def convert_whisper(ct2_dir: Path, out_dir: Path) -> None:
    """Writes a transformers Whisper model, tokenizer, feature extractor and generation config."""
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
    )

    spec, ct2 = read_ct2_model(ct2_dir / "model.bin")
    if spec != "WhisperSpec":
        raise ValueError(f"{ct2_dir}/model.bin holds a {spec}, not a Whisper model")
    if any(name.endswith("/weight_scale") for name in ct2):
        raise ValueError(
            f"{ct2_dir}/model.bin holds quantized (int8) weights; specscribe reads float16 and "
            f"float32 CTranslate2 models (ct2-transformers-converter --quantization float16) "
            f"and quantizes by itself (--precision int8)"
        )
    ct2_config = json.loads((ct2_dir / "config.json").read_text())
    tokenizer_json = json.loads((ct2_dir / "tokenizer.json").read_text(encoding="utf-8"))
    specials = _special_tokens(tokenizer_json)

    vocab_size, d_model = ct2["decoder/embeddings/weight"].shape
    encoder_layers = _count_layers(ct2, "encoder")
    decoder_layers = _count_layers(ct2, "decoder")
    ffn_dim = ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0]
    eos = specials["<|endoftext|>"]
    config = WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=ct2["encoder/conv1/weight"].shape[1],
        d_model=d_model,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        encoder_attention_heads=int(ct2["encoder/num_heads"]),
        decoder_attention_heads=int(ct2["decoder/num_heads"]),
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        max_source_positions=ct2["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=ct2["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=eos,
        bos_token_id=eos,
        eos_token_id=eos,
        decoder_start_token_id=specials["<|startoftranscript|>"],
        tie_word_embeddings=True,
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    # Kept in the checkpoint's own fp16 (half the disk); loaders choose the compute dtype.
    state = {name: tensor.to(torch.float16) for name, tensor in convert_state_dict(ct2).items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [name for name in missing if name != "proj_out.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise ValueError(f"conversion mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        **_generation_config(ct2_config, specials, vocab_size, decoder_layers)
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    _build_tokenizer(tokenizer_json, vocab_size).save_pretrained(out_dir)
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(out_dir)

"""Whisper: transformers' encoder once per window, our decoder runtime on a slot cache.

This module owns everything that depends on Whisper's vocabulary (special tokens, the
timestamp grid) and on the transformers model classes; the long-form loop in
`asr/transcribe.py` only sees `WhisperModel`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from asr.audio import SAMPLE_RATE
from asr.convert_whisper import MULTILINGUAL_VOCAB_SIZE
from asr.cuda_graphs import StepGraphs, pool_size
from asr.int8 import (
    Int8Linear,
    QuantizedRows,
    dynamic_int8_linear,
    quantize_rows,
    smoothing_divisor,
)
from asr.int8_store import Int8Store, fingerprint
from asr.linears import DenseLinear, PackedLinear, packed_linear_available
from asr.static_decoder import LinearFactory, SlotCache, StaticDecoder
from asr.static_encoder import StaticEncoder
from asr.traced_step import TracedSteps
from asr.whisper_checkpoint import (
    Checkpoint,
    config_namespace,
    local_directory,
    mel_filters,
    read_checkpoint,
    read_json,
    weight_files,
)
from decoding.projection import OutputProjection
from decoding.verify import best_tokens

N_FFT = 400
MEL_CHUNK_FRAMES = 6000  # 60 s of audio a chunk (`WhisperModel.log_mel`)
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window
FRAMES_PER_SECOND = SAMPLE_RATE / HOP_LENGTH  # 100
INPUT_STRIDE = 2  # mel frames per encoder output position (conv2 stride)
TIME_PRECISION = INPUT_STRIDE / FRAMES_PER_SECOND  # 0.02 s per timestamp token
MAX_TEXT_CONTEXT = 448


@dataclass(frozen=True)
class SpecialTokens:
    eot: int
    sot: int
    sot_prev: int
    no_speech: int
    no_timestamps: int
    timestamp_begin: int
    transcribe: int | None
    translate: int | None
    language_ids: dict[str, int]  # "en" -> id of <|en|>

    @property
    def multilingual(self) -> bool:
        return self.transcribe is not None


def _special_tokens(tokenizer, generation: dict, vocab_size: int) -> SpecialTokens:
    """generation: the checkpoint's generation_config.json; where it leaves out whether the
    model is multilingual (or has no such file), the vocabulary's size says, and the language
    tokens are those between <|startoftranscript|> and <|translate|>."""

    def token_id(content: str) -> int:
        found = tokenizer.convert_tokens_to_ids(content)
        if found is None:
            raise ValueError(f"the tokenizer has no {content} token")
        return found

    no_timestamps = token_id("<|notimestamps|>")
    multilingual = bool(generation.get("is_multilingual", vocab_size >= MULTILINGUAL_VOCAB_SIZE))
    lang_to_id = generation.get("lang_to_id") or (
        _language_tokens(tokenizer) if multilingual else {}
    )
    return SpecialTokens(
        eot=token_id("<|endoftext|>"),
        sot=token_id("<|startoftranscript|>"),
        sot_prev=token_id("<|startofprev|>"),
        # English-only vocabularies call it <|nocaptions|>, multilingual ones <|nospeech|>.
        no_speech=token_id("<|nospeech|>" if multilingual else "<|nocaptions|>"),
        no_timestamps=no_timestamps,
        timestamp_begin=no_timestamps + 1,
        transcribe=token_id("<|transcribe|>") if multilingual else None,
        translate=token_id("<|translate|>") if multilingual else None,
        language_ids={code.strip("<|>"): i for code, i in lang_to_id.items()}
        if multilingual
        else {},
    )


def _language_tokens(tokenizer) -> dict[str, int]:
    """The language tokens ("<|de|>": id) of a multilingual Whisper vocabulary: every token
    after <|startoftranscript|> and before <|translate|>."""
    sot = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    translate = tokenizer.convert_tokens_to_ids("<|translate|>")
    if sot is None or translate is None:
        return {}
    return {
        token: token_id
        for token, token_id in tokenizer.get_vocab().items()
        if sot < token_id < translate
    }


@dataclass(frozen=True)
class EncodedAudio:
    """What one decoder attends to for a batch of 30 s windows, computed once per window.

    features: Tensor, shape = (batch, 1500, d_model); the encoder output.
    cross: per decoder layer, (keys, values), each Tensor, shape = (batch, heads, frames,
    head_dim), frames = 1500 (fewer in a draft's view: `first_frames`); the decoder's
    cross-attention projections of `features`, which every decoder call would otherwise
    recompute (they depend on the decoder's weights, so each model has its own). The keys are
    transposed views of contiguous (batch, heads, head_dim, frames) tensors, the layout
    `asr.static_decoder` multiplies by.
    """

    features: torch.Tensor
    cross: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    def first_frames(self, frames: int) -> EncodedAudio:
        """The cross-attention of the first `frames` encoder frames alone (all when there are
        no more), in the stored layouts; for a draft, whose proposals may differ from what all
        1500 frames would give."""
        if frames >= self.features.shape[1]:
            return self
        return self.frames_between(0, frames)

    def frames_between(self, start: int, end: int) -> EncodedAudio:
        """The cross-attention of encoder frames [start, end) alone, in the stored layouts:
        a decoder attending to it attends to that stretch of audio only (each frame's key and
        value are projections of that frame's features alone, so this is the other frames
        masked). `features` stay whole."""
        return EncodedAudio(
            features=self.features,
            cross=tuple(
                (
                    keys.transpose(-1, -2)[..., start:end].contiguous().transpose(-1, -2),
                    values[..., start:end, :].contiguous(),
                )
                for keys, values in self.cross
            ),
        )

    @staticmethod
    def joined(parts: Iterable[EncodedAudio], windows: int) -> EncodedAudio:
        """The windows of `parts` (`windows` of them in all), in order, as one batch (keys stay
        transposed views). Each part is copied in as it comes and then dropped, so a lazy
        iterable (one that encodes each part when asked) never holds every part and the
        batch at once: for 8 windows the parts alone are about 300 MB."""
        parts = iter(parts)
        first = next(parts)
        if len(first.features) == windows:
            return first

        def batch_of(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.new_empty((windows, *tensor.shape[1:]))

        # keys are filled in their stored (batch, heads, head_dim, frames) layout
        joined = EncodedAudio(
            features=batch_of(first.features),
            cross=tuple(
                (batch_of(keys.transpose(-1, -2)).transpose(-1, -2), batch_of(values))
                for keys, values in first.cross
            ),
        )
        filled = joined._fill(first, 0)
        del first
        for part in parts:
            filled = joined._fill(part, filled)
            del part  # its tensors go before the next part is made
        if filled != windows:
            raise ValueError(f"parts held {filled} windows, not {windows}")
        return joined

    def _fill(self, part: EncodedAudio, start: int) -> int:
        """Copies `part`'s windows into this batch's rows from `start`; returns the row after."""
        rows = slice(start, start + len(part.features))
        self.features[rows] = part.features
        for (keys, values), (part_keys, part_values) in zip(self.cross, part.cross, strict=True):
            keys.transpose(-1, -2)[rows] = part_keys.transpose(-1, -2)
            values[rows] = part_values
        return rows.stop

    def row(self, index: int) -> EncodedAudio:
        """Window `index` alone, as views of these tensors (no copy)."""
        rows = slice(index, index + 1)
        return EncodedAudio(
            features=self.features[rows],
            cross=tuple((keys[rows], values[rows]) for keys, values in self.cross),
        )

    def rows(self, rows: torch.Tensor) -> EncodedAudio:
        """These windows, in this order. rows: Tensor, shape = (n,). The first windows are
        views of these tensors (no copy); other selections are copies."""
        count = len(rows)
        if rows.tolist() == list(range(count)):
            return EncodedAudio(
                features=self.features[:count],
                cross=tuple((keys[:count], values[:count]) for keys, values in self.cross),
            )
        return EncodedAudio(
            features=self.features[rows],
            # keys: indexed in their stored layout, so they stay transposed views
            cross=tuple(
                (keys.transpose(-1, -2)[rows].transpose(-1, -2), values[rows])
                for keys, values in self.cross
            ),
        )


def transformers_cache(encoded: EncodedAudio | None = None):
    """An empty transformers EncoderDecoderCache, for code that runs transformers' own decoder
    (draft training, reference tests); its cross-attention part is `encoded`'s when given."""
    from transformers import DynamicCache, EncoderDecoderCache

    if encoded is None:
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    empty = [(keys[..., :0, :], values[..., :0, :]) for keys, values in encoded.cross]
    cross = DynamicCache(ddp_cache_data=empty)
    for layer, (keys, values) in zip(cross.layers, encoded.cross, strict=True):
        # Shared, not copied (filling the cache would copy them): this cache only reads them.
        layer.keys, layer.values = keys, values
    # EncoderDecoderCache marks layers whose cross-attention cache is filled as up to date,
    # so the decoder reuses them instead of projecting the encoder output again.
    return EncoderDecoderCache(DynamicCache(), cross)


LinearKind = str
"""How a decoder's products run: "packed" (float32 on CPU, `asr.linears.PackedLinear`), "int8"
(`asr.int8.Int8Linear`, the "int8" precision's target), "dynamic-int8" (fbgemm, a draft's),
"dense" (`F.linear`: GPUs, half precision)."""

# The kinds whose products hold their own (quantized) weights, not the checkpoint's.
QUANTIZED_KINDS = ("int8", "dynamic-int8")


def default_linear_kind(device: torch.device, dtype: torch.dtype) -> LinearKind:
    if dtype == torch.float32 and packed_linear_available(device):
        return "packed"
    return "dense"


def linear_factory(kind: LinearKind) -> LinearFactory:
    if kind == "packed":
        return PackedLinear
    if kind == "int8":
        return Int8Linear
    if kind == "dynamic-int8":
        return dynamic_int8_linear
    if kind == "dense":
        return DenseLinear
    raise ValueError(f"unknown linear kind {kind!r}")


def _transformers_module(checkpoint: Checkpoint):
    """transformers' model class for a checkpoint, built on its tensors (assigned, not
    copied): WhisperForCausalLM for a decoder-only draft, else WhisperForConditionalGeneration."""
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperForCausalLM,
        WhisperForConditionalGeneration,
    )

    config = WhisperConfig.from_dict(vars(checkpoint.config))
    model_class = WhisperForConditionalGeneration if checkpoint.has_encoder else WhisperForCausalLM
    with torch.device("meta"):
        model = model_class(config)
    state = dict(checkpoint.tensors)
    state.setdefault("proj_out.weight", checkpoint.output_weight)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"{checkpoint.path}: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig.from_dict(checkpoint.generation)
    return model.eval()


class WhisperModel:
    """A loaded Whisper checkpoint: its tensors, tokenizer and mel filters, and the runtimes
    that transcribe with them (`asr.static_encoder`, `asr.static_decoder`, the latter over the
    kernels `linear_kind` names). Loading imports nothing from transformers.

    A draft (`load_draft`) is decoder-only: it attends to another model's encoder output.
    `model` builds the transformers module on the same tensors, on first use, for what
    transformers itself runs (draft training, reference tests, the benchmark's baselines).
    """

    def __init__(self, checkpoint: Checkpoint, tokenizer, name: str) -> None:
        self.checkpoint = checkpoint
        self.tokenizer = tokenizer
        self.name = name
        self.config = checkpoint.config
        embeddings = checkpoint.tensors["model.decoder.embed_tokens.weight"]
        self.device = embeddings.device
        # The decoder's: a "mixed" model (asr.precision) has a half-precision encoder.
        self.dtype = embeddings.dtype
        self.mel_filters = mel_filters(self.config.num_mel_bins).to(self.device)
        try:
            self.special = _special_tokens(tokenizer, checkpoint.generation, self.config.vocab_size)
        except ValueError as error:  # a tokenizer.json from another model
            raise ValueError(
                f"{name}: its tokenizer.json does not fit its weights ({error}; the weights "
                f"score a vocabulary of {self.config.vocab_size} tokens)"
            ) from None
        self.suppress_tokens = tuple(checkpoint.generation.get("suppress_tokens") or ())
        # Heads the decoder has (a generation config copied from a deeper model names others,
        # and word timing cannot read a layer that does not exist).
        self.alignment_heads = tuple(
            (layer, head)
            for layer, head in checkpoint.generation.get("alignment_heads") or ()
            if layer < self.config.decoder_layers and head < self.config.decoder_attention_heads
        )
        # A distilled draft scores only these token ids (asr.draft_checkpoint); None: all.
        self.output_vocabulary: torch.Tensor | None = None
        self.linear_kind: LinearKind = default_linear_kind(self.device, self.dtype)
        self._runtime: StaticDecoder | None = None  # made on first use, for linear_kind
        self._encoder: StaticEncoder | None = None
        self._head: torch.nn.Module | OutputProjection | None = None
        # The "int8" precision's cross-attention key products, one per layer.
        self._cross_int8: _Int8CrossProjections | None = None
        self._module = None  # transformers' model, made on first use of `model`
        self._int8_store = Int8Store(None, "")  # where the "int8" layers come from
        # A distilled draft's layer i reads the target's layer cross_from_target[i] keys/values.
        self.cross_from_target: tuple[int, ...] | None = None
        self._step_graphs_mode = "auto"
        # Greedy rounds on CUDA fused (asr.graph_rounds: compiled once per pool, then faster);
        # for processes that decode for long, as the compilation costs seconds.
        self.fused_rounds = False
        self.attention_dtype_override: torch.dtype | None = None
        self._pools: dict[int, StepGraphs] = {}
        # Short fast-mode blocks on CPU traced (asr.traced_step: a draft's); False: eager.
        self.trace_steps = True
        self._traced_steps: TracedSteps | None = None  # made on first use
        # asr.graph_rounds pools of this model as a target, by rows, draft, length and rules.
        self.round_pools: dict = {}

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        encoder_dtype: torch.dtype | None = None,
        int8_decoder: bool = False,
        int8_store: Path | None = None,
    ):
        """path: a checkpoint directory or hub id. dtype: the weights' and activations' dtype;
        encoder_dtype: the encoder's when it differs ("mixed"); int8_decoder: the decoder's
        linear layers and head in int8 ("int8"); all from `asr.precision.resolve_precision`.
        int8_store: a file that keeps the int8 layers once quantized (`asr.int8_store`).
        The log-mel is always float32 (cast at the encoder input) and logits leave in
        float32."""
        from asr.tokenizer import WhisperTokenizer

        directory = local_directory(path)
        config_file = directory / "config.json"
        config = read_json(config_file) if config_file.is_file() else {}
        model_type = config.get("model_type")
        if model_type is None:
            raise ValueError(
                f"{path} holds no transformers config.json (one naming its model_type): not a "
                f"model checkpoint. A faster-whisper (CTranslate2) model works as a local folder"
            )
        if model_type != "whisper":
            raise ValueError(f"{path} holds a {model_type} model, not a Whisper model")
        if config.get("architectures") == ["WhisperForCausalLM"]:  # a distilled draft
            raise ValueError(
                f"{path} is a draft (a Whisper decoder without an encoder): it serves as "
                f"--assistant beside a Whisper model, not as the model"
            )
        if int8_decoder and torch.device(device).type != "cpu":
            raise ValueError(f"an int8 decoder runs on CPU only, not on {device}")
        checkpoint = read_checkpoint(directory, device, dtype, encoder_dtype)
        whisper = cls(checkpoint, WhisperTokenizer(directory), name=str(path))
        if int8_decoder:
            whisper.linear_kind = "int8"
            whisper._int8_store = Int8Store(int8_store, fingerprint(*weight_files(directory)))
        return whisper

    @classmethod
    def from_transformers(cls, module, tokenizer, name: str) -> WhisperModel:
        """A model on the tensors of a transformers Whisper module (tests' random models)."""
        state = dict(module.state_dict())
        checkpoint = Checkpoint(
            Path(name),
            config_namespace(module.config.to_dict()),
            module.generation_config.to_dict(),
            {k: v.detach() for k, v in state.items()},
        )
        whisper = cls(checkpoint, tokenizer, name)
        whisper._module = module
        return whisper

    @classmethod
    def load_draft(cls, path: str | Path, target: WhisperModel) -> WhisperModel:
        """A distilled draft (asr.draft_checkpoint) on the target's device and dtype, with the
        target's embeddings."""
        from asr.draft_checkpoint import read_draft

        checkpoint, vocabulary, layers = read_draft(path, target.checkpoint)
        draft = cls(checkpoint, target.tokenizer, name=str(path))
        draft.cross_from_target = layers
        draft.output_vocabulary = vocabulary
        return draft

    @property
    def model(self):
        """transformers' WhisperForConditionalGeneration (a draft: WhisperForCausalLM) on this
        model's tensors (shared, not copied), in eval mode."""
        if self._module is None:
            self._module = _transformers_module(self.checkpoint)
        return self._module

    @property
    def int8_decoder(self) -> bool:
        """Whether the decoder runs in the "int8" precision (`asr.int8.Int8Linear`)."""
        return self.linear_kind == "int8"

    @property
    def exact_steps(self) -> bool:
        """Whether this decoder's steps can score a position with the same bits in any call
        (`asr.static_decoder`'s exact mode over row-invariant kernels)."""
        return self.linear_kind in ("packed", "int8")

    def use_linear_kind(self, kind: LinearKind) -> None:
        """Runs the decoder and head on other kernels from now on (`asr.precision`)."""
        linear_factory(kind)  # refuses unknown kinds
        self.linear_kind = kind
        self._runtime = self._head = self._traced_steps = None
        self._pools, self.round_pools = {}, {}

    @property
    def step_graphs_mode(self) -> str:
        """Decoder steps as CUDA graphs (asr.cuda_graphs): "auto" (captured on CUDA), "off", or
        "eager" (the same static pools, uncaptured: what tests run on CPU)."""
        return self._step_graphs_mode

    @step_graphs_mode.setter
    def step_graphs_mode(self, mode: str) -> None:
        if mode not in ("auto", "off", "eager"):
            raise ValueError(f"step_graphs_mode is auto, off or eager, not {mode!r}")
        self._step_graphs_mode = mode
        # Pools made under another mode are captured, or not, the other way.
        self._pools, self.round_pools = {}, {}

    @property
    def static_steps(self) -> bool:
        """Whether decoder steps run on asr.cuda_graphs' static pools (captured or eager),
        whose cross-attention buffers hold all 1500 frames."""
        mode = self.step_graphs_mode
        return mode == "eager" or (mode == "auto" and self.device.type == "cuda")

    def step_graphs(self, rows: int) -> StepGraphs | None:
        """The pool of captured decoder steps that holds `rows` windows (asr.cuda_graphs), or
        None where steps are not captured (CPUs, step_graphs_mode "off")."""
        if not self.static_steps:
            return None
        mode = self.step_graphs_mode
        size = pool_size(rows)
        if size not in self._pools:
            self._pools[size] = StepGraphs(self, size, capture=mode == "auto")
        return self._pools[size]

    @property
    def runtime(self) -> StaticDecoder:
        if self._runtime is None:
            int8 = self.linear_kind == "int8"
            self._runtime = StaticDecoder(
                self.checkpoint.with_prefix("model.decoder."),
                self.config,
                self._int8_store.linear if int8 else linear_factory(self.linear_kind),
                self.attention_dtype,
            )
            if int8:  # the head and cross products too, so the store is complete when saved
                self.logits(self.embed_tokens[:1])
                self._cross_int8 = self._cross_int8_products()
                self._int8_store.save()
            if self.linear_kind in QUANTIZED_KINDS:
                self.checkpoint.release(self._replaced_decoder_weights())
        return self._runtime

    def _replaced_decoder_weights(self) -> list[str]:
        """The float weights a quantized decoder's products replaced, which nothing reads
        while it runs (about 85 MB of whisper-base's 290): every layer's products but the
        cross-attention keys' and values' (`cross_attention` computes the values in float,
        and a distilled draft, loaded once the speech repays it, takes both from its target:
        reading them back then would make a long run depend on the model file staying as it
        was)."""
        products = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
        products += ["self_attn.out_proj", "encoder_attn.q_proj", "encoder_attn.out_proj"]
        products += ["fc1", "fc2"]
        return [
            f"model.decoder.layers.{index}.{product}.weight"
            for index in range(self.config.decoder_layers)
            for product in products
        ]

    @property
    def traced_steps(self) -> TracedSteps:
        """This model's short fast-mode blocks on CPU, traced (asr.traced_step)."""
        if self._traced_steps is None:
            self._traced_steps = TracedSteps(self)
        return self._traced_steps

    @property
    def attention_dtype(self) -> torch.dtype:
        """The dtype this decoder's attention reads keys and values in: the decoder's (an int8
        decoder's activations are float32); a distilled draft reads its target's cross-attention
        in the target's."""
        if self.attention_dtype_override is not None:
            return self.attention_dtype_override
        return self.dtype

    @property
    def embed_tokens(self) -> torch.Tensor:
        return self.checkpoint.tensors["model.decoder.embed_tokens.weight"]

    @property
    def max_context(self) -> int:
        return self.config.max_target_positions

    @property
    def n_mels(self) -> int:
        return self.config.num_mel_bins

    @property
    def has_encoder(self) -> bool:
        return self.checkpoint.has_encoder

    def log_mel(self, samples: np.ndarray) -> torch.Tensor:
        """OpenAI's log-mel over the whole recording, padded with one window of silence.

        Returns Tensor, shape = (n_mels, n_frames); n_frames = len(samples) // 160 + 3000.
        The dynamic-range clamp uses the whole recording's maximum, as OpenAI's transcribe does.
        """
        # The samples, one window of silence, and N_FFT // 2 samples at each end reflected as
        # torch.stft(center=True) pads them (the end's reflect silence), in one allocation.
        # The STFT's power then runs MEL_CHUNK_FRAMES frames at a time: taken at once, its
        # complex values and their powers added 443 MB at the peak for 16 minutes of audio
        # (240 MB now). Each chunk's frames are the ones `torch.stft` with `center=True`
        # makes, and the powers sit in the layout its transposed result has, so the mel
        # product, and the features, are bit-identical to the one-shot STFT's
        # (`tests/test_audio.py`).
        edge = N_FFT // 2
        padded = torch.zeros(len(samples) + N_SAMPLES + 2 * edge, device=self.device)
        if padded.device.type == "cpu":  # no copy of the samples, read-only arrays too
            padded.numpy()[edge : edge + len(samples)] = samples
        else:
            padded[edge : edge + len(samples)] = torch.tensor(samples, dtype=torch.float32)
        padded[:edge] = padded[edge + 1 : 2 * edge + 1].flip(0)
        window = torch.hann_window(N_FFT, device=self.device)
        frames = (len(samples) + N_SAMPLES) // HOP_LENGTH  # the STFT's but its last (OpenAI's)
        powers = torch.empty((frames, N_FFT // 2 + 1), device=self.device)
        for first in range(0, frames, MEL_CHUNK_FRAMES):
            last = min(first + MEL_CHUNK_FRAMES, frames)
            piece = padded[first * HOP_LENGTH : (last - 1) * HOP_LENGTH + N_FFT]
            stft = torch.stft(
                piece, N_FFT, HOP_LENGTH, window=window, center=False, return_complex=True
            )
            powers[first:last] = (stft.abs() ** 2).T
        # (n_fft // 2 + 1, frames), strided as torch.stft's result; the rest in place
        log_spec = (self.mel_filters @ powers.T).clamp_(min=1e-10).log10_()
        del powers
        log_spec = log_spec.clamp_(min=log_spec.max() - 8.0)
        return log_spec.add_(4.0).div_(4.0)

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: Tensor, shape = (batch, n_mels, 3000) -> Tensor, shape = (batch, 1500, d_model)."""
        first = self._encoder is None
        if first:
            if not self.has_encoder:
                raise ValueError(f"{self.name} has no encoder (a decoder-only draft)")
            heads = self.config.encoder_attention_heads
            self._encoder = StaticEncoder(self.checkpoint.with_prefix("model.encoder."), heads)
        if mel.device.type == "cpu" and mel.shape[0] > 1:
            # oneDNN blocks a CPU product by its row count (on AMX, bf16 features moved by up to
            # 1.2 between a window encoded alone and beside another), and a window's text must
            # not depend on the windows decoded with it; on a CPU batching saves little here.
            features = torch.cat([self._encoder(mel[row : row + 1]) for row in range(len(mel))])
        else:
            features = self._encoder(mel)
        if first and self._encoder.packed:  # its products read their copies in oneDNN's layout
            self.checkpoint.release(f"model.encoder.{name}" for name in self._encoder.products)
        return features.to(self.dtype)

    @torch.inference_mode()
    def cross_attention(self, features: torch.Tensor) -> EncodedAudio:
        """The decoder's cross-attention keys and values for encoder output `features`.

        features: Tensor, shape = (batch, 1500, d_model), from this model's encoder or from an
        encoder this decoder was trained against (a shared-encoder draft).
        """
        # A draft of another dtype reads the target's encoder output in its own dtype.
        features = features.to(self.dtype)
        tensors, heads = self.checkpoint.tensors, self.config.decoder_attention_heads
        width = self.config.d_model
        if self.int8_decoder and self._cross_int8 is None:
            _ = self.runtime  # makes them in asr.int8_store's order
        # int8 keys: the features quantized once for every layer (the same bits as each
        # layer's own product: tests/test_int8_decoder.py).
        quantized = self._cross_int8.quantize(features) if self._cross_int8 is not None else None
        cross = []
        for index in range(self.config.decoder_layers):
            prefix = f"model.decoder.layers.{index}.encoder_attn."
            shape = (features.shape[0], -1, heads, width // heads)
            if quantized is not None:
                keys = self._cross_int8.keys(quantized, index, features.shape)
            else:
                keys = F.linear(features, tensors[f"{prefix}k_proj.weight"])
            values = F.linear(
                features, tensors[f"{prefix}v_proj.weight"], tensors[f"{prefix}v_proj.bias"]
            )
            # keys stored (batch, heads, head_dim, 1500), handed out transposed (see EncodedAudio);
            # heads first, then each head's (1500, head_dim) block transposed: the same values
            # as one permute's copy, 3-4x faster on a CPU (that copy's every read is strided)
            keys = keys.view(shape).transpose(1, 2).contiguous().transpose(2, 3).contiguous()
            values = values.view(shape).transpose(1, 2).contiguous()
            # in the dtype attention reads them in: no copy per generation
            keys, values = keys.to(self.attention_dtype), values.to(self.attention_dtype)
            cross.append((keys.transpose(-1, -2), values))
        return EncodedAudio(features=features, cross=tuple(cross))

    def _cross_int8_products(self) -> _Int8CrossProjections:
        """The "int8" precision's cross-attention key projections (below)."""
        tensors = self.checkpoint.tensors
        weights = [
            tensors[f"model.decoder.layers.{index}.encoder_attn.k_proj.weight"]
            for index in range(self.config.decoder_layers)
        ]
        # The features are the encoder's final layer norm's output: its gain and bias bound
        # each channel's range (the encoder may be absent: a decoder reading another's output).
        norm = tensors.get("model.encoder.layer_norm.weight")
        channel_range = (
            norm.float().abs() + tensors["model.encoder.layer_norm.bias"].float().abs()
            if norm is not None
            else torch.ones(self.config.d_model)
        )
        divisor = smoothing_divisor(channel_range, torch.cat(weights))
        products = tuple(self._int8_store.linear(weight * divisor) for weight in weights)
        return _Int8CrossProjections(divisor.to(self.device), products)

    def new_cache(self, encoded: EncodedAudio, group: int = 1) -> SlotCache:
        """An empty self-attention cache for `encoded`'s windows, `group` rows each (the
        chains of a drafted tree), holding their cross-attention keys and values (shared, not
        copied)."""
        return self.runtime.new_cache(encoded.cross, group)

    def decoder_states(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SlotCache,
        *,
        exact: bool = False,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Runs the decoder on a block after what `cache` holds (which it extends).

        tokens, positions: Tensor, shape = (batch, n_new); valid: Tensor[bool], shape =
        (batch, n_new), False for padding, or None. exact: `asr.static_decoder`'s exact mode
        (only where `exact_steps`). Returns Tensor, shape = (batch, n_new, d_model); `logits`
        turns it into logits.
        """
        return self.runtime.forward(tokens, positions, cache, exact=exact, valid=valid)

    @torch.inference_mode()
    def alignment_scores(
        self, tokens: torch.Tensor, encoded: EncodedAudio
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder pass over whole rows, with the alignment heads' cross-attention scores.

        tokens: Tensor, shape = (batch, n), each row from position 0, padded at its end (causal
        attention keeps padding out of every earlier position); `encoded` holds the rows' K/V.
        Returns the decoder states, Tensor, shape = (batch, n, d_model), and float32 scores,
        Tensor, shape = (batch, len(alignment_heads), n, 1500): query . key / sqrt(head_dim),
        before the softmax, for each (layer, head) of `alignment_heads`.
        """
        queries: dict[int, torch.Tensor] = {layer: None for layer, _ in self.alignment_heads}
        batch, n = tokens.shape
        positions = torch.arange(n, device=tokens.device).expand(batch, n)
        cache = self.new_cache(encoded)
        states = self.runtime.forward(tokens, positions, cache, cross_queries=queries)
        scores = [
            queries[layer][:, head].float() @ cache.cross_keys[layer][:, head].float()
            for layer, head in self.alignment_heads
        ]
        return states, torch.stack(scores, dim=1)

    @torch.inference_mode()
    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Tensor, shape = (..., d_model) -> logits, Tensor, shape = (..., vocab); at least
        float32 (half-precision models), float64 for float64 models (tests keep ties away)."""
        return self.compute_logits(states)

    def compute_logits(self, states: torch.Tensor) -> torch.Tensor:
        """`logits` in the caller's autograd mode (asr.graph_rounds' fused rounds run outside
        inference mode); callers turn gradients off."""
        head = self.output_head()(states)
        if self.output_vocabulary is None:
            return head.to(torch.promote_types(head.dtype, torch.float32))
        # A reduced head: tokens outside it get -inf, so they are never drafted.
        dtype = torch.promote_types(head.dtype, torch.float32)
        logits = head.new_full(
            (*states.shape[:-1], self.config.vocab_size), -torch.inf, dtype=dtype
        )
        # index_copy_ rather than an indexed assignment, whose traced shape would stay the first
        # call's batch (asr.traced_step).
        return logits.index_copy_(-1, self.output_vocabulary, head.to(dtype))

    def greedy_tokens(self, states: torch.Tensor, suppressed_columns: torch.Tensor) -> torch.Tensor:
        """The argmax of `compute_logits(states)` with the ids of `suppressed_columns` masked,
        taken over the head's own columns: a reduced head's tokens outside it are -inf in the
        logits, never the argmax, and its columns keep the vocabulary's order, so ties go to
        the same (lowest) id. states: Tensor, shape = (..., d_model); suppressed_columns: the
        head's columns to mask (`head_columns`). Returns token ids, Tensor, shape = (...)."""
        head = self.output_head()(states)
        scores = head.to(torch.promote_types(head.dtype, torch.float32))
        best = best_tokens(scores.index_fill_(-1, suppressed_columns, -torch.inf))
        return best if self.output_vocabulary is None else self.output_vocabulary[best]

    def head_columns(self, ids: torch.Tensor) -> torch.Tensor:
        """The head's columns that score these token ids (ids outside a reduced head have
        none). Tensor, shape = (n,), long -> Tensor, shape = (m,), long, m <= n."""
        if self.output_vocabulary is None:
            return ids
        vocabulary = self.output_vocabulary.to(ids.device)
        columns = torch.searchsorted(vocabulary, ids).clamp(max=len(vocabulary) - 1)
        return columns[vocabulary[columns] == ids]

    def output_head(self) -> torch.nn.Module:
        """The head's product, made on first use for `linear_kind`: states (..., d_model) ->
        scores (..., len(output_vocabulary) or vocab)."""
        if self._head is None and self.linear_kind == "int8" and self._runtime is None:
            _ = self.runtime  # makes the head after the layers (asr.int8_store's order)
        if self._head is None:
            weight = self.checkpoint.output_weight
            if self.output_vocabulary is not None:
                weight = weight[self.output_vocabulary]
            if self.linear_kind == "int8":
                # Most of an int8 target's error is its head's input rounding, so the target
                # quantizes it twice (Int8Linear: rows independent of the call, as verification
                # needs).
                self._head = self._int8_store.linear(weight, input_passes=2)
            elif self.linear_kind == "dynamic-int8":
                # A draft's head only proposes, so it may depend on its call: fbgemm's dynamic
                # int8 reads the head at twice Int8Linear's speed for one row from memory.
                self._head = dynamic_int8_linear(weight)
            elif self.linear_kind == "packed":
                self._head = PackedLinear(weight)
            else:
                self._head = OutputProjection(weight)
        return self._head

    def language_code(self, token_id: int) -> str:
        return next(code for code, i in self.special.language_ids.items() if i == token_id)

    def sot_sequence(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        special = self.special
        sequence = [special.sot]
        if special.multilingual:
            sequence.append(special.language_ids[language or "en"])
            sequence.append(special.translate if task == "translate" else special.transcribe)
        if not timestamps:
            sequence.append(special.no_timestamps)
        return sequence

    def text_of(self, tokens: list[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t < self.special.eot])


@dataclass(frozen=True)
class _Int8CrossProjections:
    """Each decoder layer's cross-attention key projection as an int8 product, as the "int8"
    precision runs it; the values stay float32 products.

    After the encoder's layers the twelve key and value products of 1500 rows are a window's
    largest fixed cost: about 62 ms on this project's 2-core CPU in float32, 33 of them for the
    keys, which take 18 ms in int8. The encoder's output has outlier channels, so the features
    are divided per channel by `divisor` and the weights multiplied by it
    (`asr.int8.smoothing_divisor`): the keys' error against float32 falls from about 2 % to
    1.3 %. Values in int8 as well (4.5 % -> 2.3 % error) would save 20 ms more, but changed
    more transcripts, among them the shipped JFK sample's punctuation, which the keys alone do
    not. Rows are quantized one by one, so a window's keys are the same alone as beside other
    windows. Measured: docs/decoder-runtime.md ("Kept").
    """

    divisor: torch.Tensor  # (d_model,)
    products: tuple[Int8Linear, ...]  # per layer: d_model -> d_model

    def quantize(self, features: torch.Tensor) -> QuantizedRows:
        """features: Tensor, shape = (batch, frames, d_model), quantized once for every layer's
        keys (each layer quantized them again: 11 of a window's 70 ms on one thread)."""
        return quantize_rows(features / self.divisor)

    def keys(self, features: QuantizedRows, layer: int, shape: torch.Size) -> torch.Tensor:
        """That layer's keys of `quantize`'s features (batch, frames, d_model): Tensor, float32,
        in the features' shape."""
        return self.products[layer].on_rows(features).view(shape)

"""Distil a cheap draft from a Whisper target (distil-whisper's recipe at embedded scale).

The draft is decoder-only and reads the target's encoder output, so a window is encoded once.
It keeps a few of the target's decoder layers (first and last by default, as distil-whisper
keeps), shares the target's token and position embeddings (frozen, and not stored: the draft
file holds only its own layers), and may score a reduced output vocabulary: the target's most
frequent output tokens plus every special and timestamp token. A token outside that head is
simply never drafted; verification then takes the target's own token, so nothing is lost.
Training always scores the whole vocabulary (the head's rows are the target's frozen
embeddings, so the saved head is any subset of them). What the recipe's choices (head size and
filling, layers, training speech) measured: docs/drafts.md.

Training is knowledge distillation on pseudo-labels: the target transcribes each training
window greedily (as transcription will: with and without timestamps, with and without previous
text as a prompt); the draft learns cross-entropy on those tokens plus KL to the target's
distribution at each position. Encoder outputs and the target's distributions are computed once
and cached in memory, so an epoch only runs the draft's few layers.

Steps (`distill`): 1. training speech, 2. pseudo-labels and teacher distributions, 3. the output
vocabulary, 4. the draft initialised from the target, 5. training, 6. the saved draft.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from asr.audio import SAMPLE_RATE
from asr.distill_data import PromptContinuer
from asr.draft_checkpoint import (
    FROZEN_PARTS,
    SHARED_TENSORS,
    check_replaceable,
    save_draft,
    share_target_tensors,
)
from asr.logit_rules import LogitRules
from asr.types import ProgressHook, no_progress
from asr.whisper import N_FRAMES, WhisperModel
from asr.window_decoder import WindowBatch, WindowDecoder


@dataclass(frozen=True)
class DistillConfig:
    keep_layers: tuple[int, ...] | None = None  # target decoder layers kept; None: first, last
    head_tokens: int = 32768  # text tokens in the saved head (see choose_vocabulary); 0: all
    synthetic_sentences: int = 0  # the shipped draft: real speech only (docs/drafts.md)
    speech_engines: tuple[str, ...] = ("espeak-ng",)  # asr.distill_data.ENGINES speaking them
    real_speech: bool = True
    epochs: int = 8  # the best held-out epoch is kept
    batch_size: int = 8
    learning_rate: float = 3e-4
    kl_weight: float = 0.8  # distil-whisper's weighting of KL against pseudo-label CE
    validation_fraction: float = 0.1
    seed: int = 0

    def validate(self, target: WhisperModel) -> DistillConfig:
        layers = target.config.decoder_layers
        if self.keep_layers is not None:
            if not self.keep_layers or any(not 0 <= i < layers for i in self.keep_layers):
                raise ValueError(f"keep_layers must be target layers in 0..{layers - 1}")
            if list(self.keep_layers) != sorted(set(self.keep_layers)):
                raise ValueError("keep_layers must be increasing and distinct")
        if self.synthetic_sentences < 0:
            raise ValueError(f"synthetic_sentences must be >= 0, not {self.synthetic_sentences}")
        if self.head_tokens < 0:
            raise ValueError(f"head_tokens must be >= 0, not {self.head_tokens}")
        if self.epochs < 1 or self.batch_size < 1 or not self.learning_rate > 0:
            raise ValueError("epochs, batch_size and learning_rate must be positive")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError("validation_fraction must be in [0, 1)")
        from asr.distill_data import voices_of

        voices_of(self.speech_engines)  # raises on an unknown or empty list
        return self

    def layers_of(self, target: WhisperModel) -> tuple[int, ...]:
        return self.keep_layers or (0, target.config.decoder_layers - 1)


TEACHER_TOP = 64  # the target's most probable tokens kept per position for the KL term


@dataclass(frozen=True)
class LabelledWindow:
    """One training window: what the draft reads of its audio and the target's transcription.

    cross: per draft layer, (keys, values), each Tensor, shape = (heads, 1500, head_dim),
    float16: the target's cross-attention projections for the kept layers, which the draft
    shares (so training never touches the encoder output again).
    tokens: prompt + SOT sequence + the target's greedy tokens + <|endoftext|>.
    first_loss: the position whose next token is the first generated one (the SOT sequence's
    last position); the draft is trained on every position from there on.
    teacher_logprobs, teacher_ids: Tensor, shape = (trained positions, TEACHER_TOP): the
    target's most probable next tokens at each trained position and their log-probabilities.
    """

    name: str
    source: str
    cross: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    tokens: tuple[int, ...]
    first_loss: int
    teacher_logprobs: torch.Tensor
    teacher_ids: torch.Tensor

    @property
    def labels(self) -> tuple[int, ...]:
        return self.tokens[self.first_loss + 1 :]


@dataclass(frozen=True)
class DistillReport:
    windows: int
    training_windows: int
    validation_windows: int
    real_seconds: float
    synthetic_seconds: float
    labelled_tokens: int
    head_size: int
    head_coverage: float  # share of validation labels the head can draft
    agreement_before: float  # validation top-1 agreement with the pseudo-labels, every token
    agreement_after: float
    agreement_after_with_head: float  # the same, scored by the saved head only
    epochs: list[dict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


# 1. Training speech ---------------------------------------------------------------------


def training_clips(
    config: DistillConfig,
    speech_dir: Path | None,
    sentence_writer: Callable[[], PromptContinuer] | None,
    work_dir: Path | None = None,
) -> list:
    """Real windows (unless config.real_speech is off) and synthetic ones. With work_dir, the
    generated sentences are kept there and reused (writing them is the slow part).
    sentence_writer: loads the language model that writes the synthetic sentences, called only
    when sentences are needed and not saved."""
    import json

    from asr.distill_data import generate_sentences, real_clips, synthetic_clips

    clips = []
    if config.real_speech and speech_dir is not None:
        clips.extend(real_clips(speech_dir))
    if config.synthetic_sentences:
        saved = work_dir / f"sentences-{config.seed}.json" if work_dir is not None else None
        sentences = json.loads(saved.read_text()) if saved and saved.is_file() else []
        if len(sentences) < config.synthetic_sentences:
            if sentence_writer is None:
                raise ValueError("synthetic sentences need a language model to write them")
            sentences = generate_sentences(
                sentence_writer(), config.synthetic_sentences, config.seed
            )
            if saved is not None:
                saved.parent.mkdir(parents=True, exist_ok=True)
                saved.write_text(json.dumps(sentences, indent=0))
        sentences = sentences[: config.synthetic_sentences]
        clips.extend(synthetic_clips(sentences, config.seed, config.speech_engines))
    return clips


# 2. Pseudo-labels -------------------------------------------------------------------------


def label_windows(
    target: WhisperModel,
    clips: list,
    keep_layers: tuple[int, ...],
    seed: int,
    progress: ProgressHook = no_progress,
    batch_size: int = 8,
) -> list[LabelledWindow]:
    """Each clip encoded once and transcribed greedily by the target, as transcription would:
    two windows in three with timestamps, and half of them prompted with an earlier window's
    text (seek mode's <|startofprev|> context). Windows that share a SOT sequence decode as one
    batch."""
    from asr.transcribe import detect_language

    rng = random.Random(seed)
    windows: list[LabelledWindow] = []
    for first in range(0, len(clips), batch_size):
        group = clips[first : first + batch_size]
        mels = torch.stack([target.log_mel(clip.samples)[:, :N_FRAMES] for clip in group])
        encoded = target.cross_attention(target.encode(mels))
        # 1. Each window's decoding mode and prompt.
        modes, prompts = [], []
        for row in range(len(group)):
            language = detect_language(target, encoded.rows(torch.tensor([row])))
            timestamps = rng.random() < 2 / 3
            sot = target.sot_sequence(language, "transcribe", timestamps)
            context: list[int] = []
            if windows and rng.random() < 0.5:
                earlier = rng.choice(windows)
                context = [t for t in earlier.labels if t < target.special.eot]
                context = context[-(target.max_context // 2 - 1) :]
            modes.append((language, timestamps))
            prompts.append(([target.special.sot_prev, *context] if context else []) + sot)
        # 2. Greedy transcriptions, one batch per mode.
        generated: dict[int, tuple[int, ...]] = {}
        for language, timestamps in sorted(set(modes)):
            rows = [r for r, mode in enumerate(modes) if mode == (language, timestamps)]
            rules = LogitRules(target.special, target.suppress_tokens, timestamps=timestamps)
            decoder = WindowDecoder(target, rules, language, "transcribe", 224)
            batch = WindowBatch(
                encoded.rows(torch.tensor(rows)), tuple(tuple(prompts[r]) for r in rows)
            )
            results, _ = decoder.decode(batch)
            for row, result in zip(rows, results, strict=True):
                generated[row] = result.tokens
        # 3. The target's distributions along its own tokens (teacher forcing).
        for row, clip in enumerate(group):
            # The end token too, unless the window used up Whisper's text context.
            tokens = (*prompts[row], *generated[row], target.special.eot)[: target.max_context]
            first_loss = len(prompts[row]) - 1
            one = encoded.rows(torch.tensor([row]))
            logprobs, ids = _teacher(target, one, tokens, first_loss)
            windows.append(
                LabelledWindow(
                    name=clip.name,
                    source=clip.source,
                    cross=tuple(
                        (one.cross[layer][0][0].half(), one.cross[layer][1][0].half())
                        for layer in keep_layers
                    ),
                    tokens=tokens,
                    first_loss=first_loss,
                    teacher_logprobs=logprobs,
                    teacher_ids=ids,
                )
            )
        progress("label", min(first + batch_size, len(clips)), len(clips))
    return windows


@torch.inference_mode()
def _teacher(target: WhisperModel, encoded, tokens: tuple[int, ...], first_loss: int):
    """The target's top TEACHER_TOP next tokens and log-probabilities (raw logits) at every
    position from first_loss to the one before the last token."""
    ids = torch.tensor([tokens], device=target.device)
    positions = torch.arange(len(tokens), device=target.device)[None]
    states = target.decoder_states(ids, positions, target.new_cache(encoded))[0, first_loss:-1]
    logprobs = torch.log_softmax(target.logits(states).float(), dim=-1)
    top = logprobs.topk(TEACHER_TOP, dim=-1)
    return top.values.half(), top.indices.int()


# 3. The output vocabulary -----------------------------------------------------------------


def choose_vocabulary(
    target: WhisperModel, windows: list[LabelledWindow], head_tokens: int
) -> torch.Tensor:
    """Sorted token ids the draft can propose: every special and timestamp token, the text
    tokens the target emitted most often in training, then the remaining tokens of printable
    ASCII text in id order (BPE merges are numbered roughly by frequency). The training speech
    is English, and a multilingual vocabulary's low ids are full of other scripts that such a
    draft never proposes: filling with the lowest ids of any script left 6.5 % of the
    benchmark's real-speech tokens outside a 16384-token head, and words as common as "curtain"
    or "forty" could never be drafted. head_tokens=0: the whole vocabulary."""
    vocab_size = target.config.vocab_size
    eot = target.special.eot
    if head_tokens == 0 or head_tokens >= eot:
        return torch.arange(vocab_size)
    counts: dict[int, int] = {}
    for window in windows:
        for token in window.labels:
            if token < eot:
                counts[token] = counts.get(token, 0) + 1
    frequent = sorted(counts, key=lambda t: (-counts[t], t))[:head_tokens]
    chosen = set(frequent)
    for token in range(eot):
        if len(chosen) >= head_tokens:
            break
        if _is_ascii_text(target.tokenizer.decode([token])):
            chosen.add(token)
    return torch.tensor(sorted(chosen | set(range(eot, vocab_size))))


def _is_ascii_text(text: str) -> bool:
    """Printable ASCII (spaces included); a token holding part of a multi-byte character
    decodes to U+FFFD and is not."""
    return bool(text) and text.isascii() and text.isprintable()


# 4. The draft, initialised from the target ------------------------------------------------


def build_draft(target: WhisperModel, keep_layers: tuple[int, ...]):
    """A WhisperForCausalLM whose layers are copies of the target's `keep_layers` and whose
    embeddings are the target's (shared tensors)."""
    from transformers import WhisperConfig, WhisperForCausalLM

    config = WhisperConfig.from_dict(
        {
            **vars(target.config),
            "decoder_layers": len(keep_layers),
            "architectures": ["WhisperForCausalLM"],
            "is_encoder_decoder": False,
        }
    )
    draft = WhisperForCausalLM(config).to(target.dtype).eval()
    source = target.model.model.decoder
    state = {}
    for new, old in enumerate(keep_layers):
        for name, tensor in source.layers[old].state_dict().items():
            state[f"model.decoder.layers.{new}.{name}"] = tensor.clone()
    for name, tensor in source.layer_norm.state_dict().items():
        state[f"model.decoder.layer_norm.{name}"] = tensor.clone()
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or set(missing) - set(SHARED_TENSORS):
        raise RuntimeError(f"draft initialisation: missing {missing}, unexpected {unexpected}")
    share_target_tensors(draft, source)
    draft.generation_config = target.model.generation_config
    return draft


def trainable_parameters(draft) -> list[torch.nn.Parameter]:
    """The draft's own layers and final norm. Frozen: the embeddings (shared with the target)
    and the cross-attention key/value projections, which stay the target's so that the draft
    reuses the target's projected encoder output for its layers instead of computing its own."""
    chosen = []
    for name, parameter in draft.named_parameters():
        frozen = any(part in name for part in FROZEN_PARTS)
        parameter.requires_grad_(not frozen)
        if not frozen:
            chosen.append(parameter)
    return chosen


# 5. Training ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Head:
    """The draft's output head: token ids, their (frozen) weights, and id -> head row."""

    vocabulary: torch.Tensor  # (head,)
    weight: torch.Tensor  # (head, d_model)
    row_of: torch.Tensor  # (vocab,), -1 outside the head

    @classmethod
    def of(cls, draft, vocabulary: torch.Tensor) -> _Head:
        row_of = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
        row_of[vocabulary] = torch.arange(len(vocabulary))
        weight = draft.model.decoder.embed_tokens.weight[vocabulary].detach()
        return cls(vocabulary, weight, row_of)


def _draft_states(draft, target: WhisperModel, windows) -> torch.Tensor:
    """The draft's last hidden states along each window's tokens (teacher forcing), shape =
    (windows, longest window, d_model); rows past a window's end are padding."""
    from asr.whisper import EncodedAudio, transformers_cache

    width = max(len(w.tokens) for w in windows)
    tokens = torch.zeros((len(windows), width), dtype=torch.long)
    mask = torch.zeros((len(windows), width), dtype=torch.long)
    for row, window in enumerate(windows):
        tokens[row, : len(window.tokens)] = torch.tensor(window.tokens)
        mask[row, : len(window.tokens)] = 1
    dtype = draft.model.decoder.embed_tokens.weight.dtype
    cross = tuple(
        (
            torch.stack([w.cross[layer][0] for w in windows]).to(dtype),
            torch.stack([w.cross[layer][1] for w in windows]).to(dtype),
        )
        for layer in range(len(windows[0].cross))
    )
    keys = cross[0][0]
    # The cache already holds the cross-attention keys/values; the decoder only needs a tensor
    # of the encoder output's shape to take its cross-attention path.
    features = keys.new_zeros(()).expand(len(windows), keys.shape[2], draft.config.d_model)
    cache = transformers_cache(EncodedAudio(features, cross))
    return draft.model.decoder(
        input_ids=tokens,
        attention_mask=mask,
        encoder_hidden_states=features,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state


def _batch_loss(draft, target: WhisperModel, windows, head: _Head, kl_weight: float):
    """Mean over trained positions of CE(pseudo-label) + kl_weight * KL(teacher || draft),
    the teacher restricted to its top tokens inside the head and renormalised; also returns
    (positions where the draft's top token is the label, positions)."""
    states = _draft_states(draft, target, windows)
    total, agree, count = states.new_zeros(()), 0, 0
    for row, window in enumerate(windows):
        trained = states[row, window.first_loss : len(window.tokens) - 1]
        log_q = torch.log_softmax(trained @ head.weight.T, dim=-1)
        labels = torch.tensor(window.labels)
        label_rows = head.row_of[labels]
        known = label_rows >= 0
        ce = -log_q[known, label_rows[known]].sum()
        teacher_rows = head.row_of[window.teacher_ids.long()]
        inside = teacher_rows >= 0
        p = window.teacher_logprobs.float().exp() * inside
        p = p / p.sum(dim=-1, keepdim=True).clamp(min=1e-9)
        log_q_teacher = log_q.gather(1, teacher_rows.clamp(min=0))
        kl = (p * (p.clamp(min=1e-9).log() - log_q_teacher)).sum()
        total = total + ce + kl_weight * kl
        predicted = head.vocabulary[log_q.argmax(dim=-1)]
        agree += int((predicted == labels).sum())
        count += len(labels)
    return total / max(count, 1), agree, count


@torch.no_grad()
def draft_predictions(
    draft, target, windows, vocabulary=None, batch_size: int = 8, top: int = 1
) -> list:
    """The draft's top token at each labelled position of each window, with the target's tokens
    as context (teacher forcing): one Tensor per window, aligned with `window.labels`, shape =
    (positions,); with top > 1 its `top` best tokens, best first, shape = (positions, top).
    vocabulary: the token ids its head scores (`WhisperModel.output_vocabulary`); None: all."""
    if vocabulary is None:
        vocabulary = torch.arange(draft.config.vocab_size)
    head = _Head.of(draft, vocabulary)
    predicted = []
    for first in range(0, len(windows), batch_size):
        group = windows[first : first + batch_size]
        states = _draft_states(draft, target, group)
        for row, window in enumerate(group):
            trained = states[row, window.first_loss : len(window.tokens) - 1]
            scores = trained @ head.weight.T
            best = scores.argmax(dim=-1) if top == 1 else scores.topk(top, dim=-1).indices
            predicted.append(head.vocabulary[best])
    return predicted


def agreement(draft, target, windows, head: _Head, batch_size: int = 8) -> float:
    """Top-1 agreement of the draft with the pseudo-labels (teacher-forced): a proxy for the
    share of drafted tokens the target accepts."""
    predicted = draft_predictions(draft, target, windows, head.vocabulary, batch_size)
    hits = sum(
        int((guesses == torch.tensor(w.labels)).sum())
        for guesses, w in zip(predicted, windows, strict=True)
    )
    return hits / max(sum(len(w.labels) for w in windows), 1)


def train_draft(
    draft,
    target: WhisperModel,
    train: list[LabelledWindow],
    validation: list[LabelledWindow],
    head: _Head,
    config: DistillConfig,
    progress: ProgressHook = no_progress,
) -> tuple[list[dict], float, float]:
    """AdamW with warm-up and cosine decay; keeps the epoch with the best validation agreement.

    Returns (per-epoch history, validation agreement before training, and of the kept draft).
    """
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    parameters = trainable_parameters(draft)
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=0.01)
    total_steps = math.ceil(len(train) / config.batch_size) * config.epochs
    warmup = max(1, total_steps // 20)

    def learning_rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate)
    history = []
    before = agreement(draft, target, validation, head)
    best_score, best_state, score = before, None, before
    step = 0
    for epoch in range(config.epochs):
        draft.train()
        order = list(train)
        rng.shuffle(order)
        losses = []
        for first in range(0, len(order), config.batch_size):
            batch = order[first : first + config.batch_size]
            loss, _, _ = _batch_loss(draft, target, batch, head, config.kl_weight)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            step += 1
            progress("train", step, total_steps)
        draft.eval()
        score = agreement(draft, target, validation, head)
        history.append(
            {
                "epoch": epoch + 1,
                "loss": round(sum(losses) / len(losses), 4),
                "agreement": round(score, 4),
            }
        )
        if score > best_score:
            best_score = score
            best_state = {k: v.detach().clone() for k, v in draft.state_dict().items()}
    if best_state is not None:
        draft.load_state_dict(best_state)
        score = best_score
    return history, before, score


# 6. The whole recipe ----------------------------------------------------------------------


def portable_name(name: str) -> str:
    """What a saved draft records as its target: a hub id or model name as given, a local
    directory by its last component (a path on the machine that trained it means nothing to
    the draft's users, and a model cache's directory is named after its model)."""
    path = Path(name)
    return path.name if path.is_absolute() else name


def _speech_identity(speech_dir: Path | None) -> list[str] | None:
    """What a work folder's saved windows were labelled from: the speech folder and its
    manifest's digest (the recordings it lists)."""
    if speech_dir is None:
        return None
    from asr.models import sha256_of

    return [str(Path(speech_dir).resolve()), sha256_of(Path(speech_dir) / "manifest.tsv")]


def prepare_windows(
    target: WhisperModel,
    config: DistillConfig,
    speech_dir: Path | None,
    sentence_writer: Callable[[], PromptContinuer] | None,
    work_dir: Path | None = None,
    progress: ProgressHook = no_progress,
) -> tuple[list[LabelledWindow], dict[str, float]]:
    """Steps 1-2: training speech and its pseudo-labels, with the seconds of speech and of
    labelling per source (sentence_writer: `training_clips`). With work_dir, the result is
    saved there and reused by a later run with the same target, layers, data options (the
    speech folder and its manifest among them) and seed (training options may change)."""
    key = {
        "target": target.name,
        "layers": list(config.layers_of(target)),
        "synthetic_sentences": config.synthetic_sentences,
        "speech_engines": list(config.speech_engines),
        "real_speech": _speech_identity(speech_dir) if config.real_speech else False,
        "seed": config.seed,
    }
    saved = work_dir / "labelled-windows.pt" if work_dir is not None else None
    if saved is not None and saved.is_file():
        stored = torch.load(saved, weights_only=False)
        if stored["key"] == key:
            return stored["windows"], stored["seconds"]
    started = time.perf_counter()
    clips = training_clips(config, speech_dir, sentence_writer, work_dir)
    seconds = {
        "real_speech": _seconds(clips, "real"),
        "synthetic_speech": _seconds(clips, "synthetic"),
        "make_speech": time.perf_counter() - started,
    }
    started = time.perf_counter()
    windows = label_windows(target, clips, config.layers_of(target), config.seed, progress)
    seconds["label"] = time.perf_counter() - started
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        partial = saved.with_suffix(".partial")
        torch.save({"key": key, "windows": windows, "seconds": seconds}, partial)
        partial.replace(saved)
    return windows, seconds


def distill(
    target: WhisperModel,
    target_dir: Path,
    out_dir: Path,
    config: DistillConfig,
    windows: list[LabelledWindow],
    data_seconds: dict[str, float],
    progress: ProgressHook = no_progress,
) -> DistillReport:
    """Steps 3-6 on labelled windows (`prepare_windows`): vocabulary, draft, training and the
    saved draft. Writes out_dir atomically, with recipe.json describing the run. Raises
    ValueError where there are no windows to train on or out_dir holds other files."""
    config.validate(target)
    check_replaceable(out_dir)
    if not windows:
        raise ValueError(
            "no training windows: the speech folder lists no recording a benchmark does not "
            "report on, and no synthetic sentences were asked for"
        )
    layers = config.layers_of(target)

    order = random.Random(config.seed).sample(range(len(windows)), len(windows))
    held = set(order[: round(len(windows) * config.validation_fraction)])
    train = [w for i, w in enumerate(windows) if i not in held]
    validation = [w for i, w in enumerate(windows) if i in held] or train
    vocabulary = choose_vocabulary(target, train, config.head_tokens)

    draft = build_draft(target, layers)
    every_token = _Head.of(draft, torch.arange(draft.config.vocab_size))
    started = time.perf_counter()
    history, before, after = train_draft(
        draft, target, train, validation, every_token, config, progress
    )
    train_seconds = time.perf_counter() - started
    head = _Head.of(draft, vocabulary)
    after_head = agreement(draft, target, validation, head)  # what drafting will see

    labels = torch.tensor([t for w in validation for t in w.labels])
    report = DistillReport(
        windows=len(windows),
        training_windows=len(train),
        validation_windows=len(validation),
        real_seconds=data_seconds["real_speech"],
        synthetic_seconds=data_seconds["synthetic_speech"],
        labelled_tokens=sum(len(w.labels) for w in windows),
        head_size=len(vocabulary),
        head_coverage=round(float((head.row_of[labels] >= 0).float().mean()), 4),
        agreement_before=round(before, 4),
        agreement_after=round(after, 4),
        agreement_after_with_head=round(after_head, 4),
        epochs=history,
        seconds={
            "make_speech": round(data_seconds["make_speech"], 1),
            "label": round(data_seconds["label"], 1),
            "train": round(train_seconds, 1),
        },
    )
    recipe = {
        "target": portable_name(target.name),
        "config": asdict(config),
        "layers": list(layers),
        "report": asdict(report),
        "real_training_windows": sorted({w.name for w in windows if w.source == "real"}),
        "synthetic": "SmolLM2-135M sentences (seeded sampling) spoken by "
        + " and ".join(config.speech_engines),
    }
    save_draft(draft, vocabulary, layers, target_dir, out_dir, recipe)
    return report


def _seconds(clips: list, source: str) -> float:
    return round(sum(len(c.samples) for c in clips if c.source == source) / SAMPLE_RATE, 1)

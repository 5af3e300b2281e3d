"""Long-form transcription: sequential 30 s windows that seek to the last timestamp.

This follows OpenAI's transcribe(): each window is decoded with the previous window's text as
a prompt, split into segments at its timestamp pairs, and the next window starts at the last
complete segment's end. Each window is decoded greedily here; the speculative decoder slots in
at `decode_window` without changing its output.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch

from asr.audio import SAMPLE_RATE
from asr.logit_rules import LogitRules
from asr.types import ProgressHook, Segment, Transcript, no_progress
from asr.whisper import FRAMES_PER_SECOND, INPUT_STRIDE, N_FRAMES, TIME_PRECISION, WhisperModel

Task = Literal["transcribe", "translate"]


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None  # None: detected from the first window
    task: Task = "transcribe"
    timestamps: bool = True
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    # Temperature fallback: a window whose greedy text repeats itself (compression ratio) or
    # is improbable (average log-probability) is decoded again by sampling, hotter each time.
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    max_new_tokens: int = 224  # OpenAI's sample_len: half the text context
    seed: int = 0  # makes the sampled fallbacks repeatable

    def validate(self, model: WhisperModel) -> None:
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', not {self.task!r}")
        special = model.special
        if special.multilingual and self.language not in (None, *special.language_ids):
            known = ", ".join(sorted(special.language_ids))
            raise ValueError(f"language {self.language!r} is not one of: {known}")
        if not special.multilingual:
            if self.language not in (None, "en"):
                raise ValueError(f"language {self.language!r}: model {model.name} is English-only")
            if self.task == "translate":
                raise ValueError(f"task 'translate': model {model.name} is English-only")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be non-negative, not {self.temperatures}")
        if not 1 <= self.max_new_tokens <= 224:
            raise ValueError(f"max_new_tokens must be in 1..224, not {self.max_new_tokens}")


@dataclass(frozen=True)
class WindowResult:
    tokens: tuple[int, ...]  # generated tokens, without the prompt and the end token
    text: str
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    decoder_calls: int

    @property
    def compression_ratio(self) -> float:
        return compression_ratio(self.text)


def compression_ratio(text: str) -> float:
    """How well zlib compresses the text: repetition loops score high (OpenAI: > 2.4)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def detect_language(model: WhisperModel, audio_features: torch.Tensor) -> str:
    """The most probable language token after <|startoftranscript|>."""
    special = model.special
    if not special.multilingual:
        return "en"
    logits = model.decode(torch.tensor([[special.sot]]), audio_features, model.new_cache())[0, -1]
    language_ids = torch.tensor(list(special.language_ids.values()))
    return model.language_code(int(language_ids[logits[language_ids].argmax()]))


def decode_window(
    model: WhisperModel,
    audio_features: torch.Tensor,
    prompt: list[int],
    rules: LogitRules,
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> WindowResult:
    """Decodes one window: greedy at temperature 0, else by sampling.

    audio_features: Tensor, shape = (1, 1500, d_model).
    """
    special = model.special
    cache = model.new_cache()
    logits = model.decode(torch.tensor([prompt]), audio_features, cache)
    no_speech_prob = float(logits[0, prompt.index(special.sot)].softmax(-1)[special.no_speech])
    next_logits = logits[:, -1]
    tokens: list[int] = []
    sum_logprob = 0.0
    calls = 1
    while True:
        masked = rules.apply(next_logits, [tokens])[0]
        if temperature == 0.0:
            token = int(masked.argmax())
        else:
            probs = torch.softmax(masked / temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
        sum_logprob += float(torch.log_softmax(masked, dim=-1)[token])
        if token == special.eot:
            break
        tokens.append(token)
        if len(tokens) >= max_new_tokens or len(prompt) + len(tokens) >= model.max_context:
            break
        next_logits = model.decode(torch.tensor([[token]]), audio_features, cache)[:, -1]
        calls += 1
    return WindowResult(
        tokens=tuple(tokens),
        text=model.text_of(tokens),
        avg_logprob=sum_logprob / (len(tokens) + 1),
        no_speech_prob=no_speech_prob,
        temperature=temperature,
        decoder_calls=calls,
    )


def _is_silent(result: WindowResult, options: TranscribeOptions) -> bool:
    return (
        options.no_speech_threshold is not None
        and result.no_speech_prob > options.no_speech_threshold
        and (options.logprob_threshold is None or result.avg_logprob < options.logprob_threshold)
    )


def _needs_fallback(result: WindowResult, options: TranscribeOptions) -> bool:
    if _is_silent(result, options):
        return False  # a silent window is skipped, whatever its text
    too_repetitive = (
        options.compression_ratio_threshold is not None
        and result.compression_ratio > options.compression_ratio_threshold
    )
    too_improbable = (
        options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold
    )
    return too_repetitive or too_improbable


def decode_with_fallback(
    model: WhisperModel,
    audio_features: torch.Tensor,
    prompt: list[int],
    rules: LogitRules,
    options: TranscribeOptions,
    generator: torch.Generator,
) -> tuple[WindowResult, int]:
    """The first temperature whose result passes the checks (else the last); total calls."""
    calls = 0
    for temperature in options.temperatures:
        result = decode_window(
            model, audio_features, prompt, rules, options.max_new_tokens, temperature, generator
        )
        calls += result.decoder_calls
        if not _needs_fallback(result, options):
            break
    return result, calls


def _segments_of(
    model: WhisperModel,
    result: WindowResult,
    time_offset: float,
    window_frames: int,
    duration: float,
) -> tuple[list[Segment], int]:
    """Splits a window's tokens at timestamp pairs; returns segments and frames consumed."""
    begin = model.special.timestamp_begin
    tokens = list(result.tokens)
    is_timestamp = [t >= begin for t in tokens]
    # A pair of consecutive timestamps closes one segment and opens the next.
    boundaries = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]
    single_timestamp_ending = (
        len(tokens) >= 1 and is_timestamp[-1] and not (len(tokens) >= 2 and is_timestamp[-2])
    )

    def segment(sliced: list[int], start: float, end: float) -> Segment:
        # A window near the end holds padding: no segment may run past the recording.
        return Segment(
            start=round(min(start, duration), 3),
            end=round(min(end, duration), 3),
            text=model.text_of(sliced),
            avg_logprob=result.avg_logprob,
            no_speech_prob=result.no_speech_prob,
        )

    if boundaries:
        slices = boundaries if not single_timestamp_ending else [*boundaries, len(tokens)]
        segments, last = [], 0
        for current in slices:
            sliced = tokens[last:current]
            start = time_offset + (sliced[0] - begin) * TIME_PRECISION
            end = time_offset + (sliced[-1] - begin) * TIME_PRECISION
            segments.append(segment(sliced, start, end))
            last = current
        if single_timestamp_ending:
            return segments, window_frames  # nothing left unfinished in this window
        # Seek to the last complete segment's end; the rest is decoded again in context.
        return segments, (tokens[last - 1] - begin) * INPUT_STRIDE

    length = window_frames / FRAMES_PER_SECOND
    timestamps = [t for t in tokens if t >= begin]
    if timestamps and timestamps[-1] != begin:
        length = (timestamps[-1] - begin) * TIME_PRECISION
    text_tokens = [t for t in tokens if t < begin]
    segments = [segment(text_tokens, time_offset, time_offset + length)] if text_tokens else []
    return segments, window_frames


def transcribe(
    model: WhisperModel,
    samples: np.ndarray,
    options: TranscribeOptions = TranscribeOptions(),
    progress: ProgressHook = no_progress,
) -> Transcript:
    """samples: float32 mono 16 kHz, shape = (n_samples,)."""
    options.validate(model)
    started = time.perf_counter()
    mel = model.log_mel(samples)
    content_frames = mel.shape[-1] - N_FRAMES
    duration = len(samples) / SAMPLE_RATE
    rules = LogitRules(model.special, model.suppress_tokens, timestamps=options.timestamps)
    special = model.special

    previous: list[int] = []
    if options.initial_prompt:
        previous = model.tokenizer.encode(
            " " + options.initial_prompt.strip(), add_special_tokens=False
        )
    language = options.language
    segments: list[Segment] = []
    generator = torch.Generator().manual_seed(options.seed)
    decoder_calls = generated = encoder_seconds = 0
    seek = 0
    progress("transcribe", 0, content_frames)
    while seek < content_frames:
        window_frames = min(N_FRAMES, content_frames - seek)
        window = mel[:, seek : seek + N_FRAMES]  # always full: log_mel appends 30 s of silence
        encode_start = time.perf_counter()
        audio_features = model.encode(window[None])
        encoder_seconds += time.perf_counter() - encode_start
        if language is None:
            language = detect_language(model, audio_features)

        context = previous[-(model.max_context // 2 - 1) :] if previous else []
        prompt = ([special.sot_prev, *context] if context else []) + model.sot_sequence(
            language, options.task, options.timestamps
        )
        result, calls = decode_with_fallback(
            model, audio_features, prompt, rules, options, generator
        )
        decoder_calls += calls
        generated += len(result.tokens) + 1

        time_offset = seek / FRAMES_PER_SECOND
        if _is_silent(result, options):
            seek += window_frames
        else:
            window_segments, consumed = _segments_of(
                model, result, time_offset, window_frames, duration
            )
            segments.extend(s for s in window_segments if s.text.strip() and s.end > s.start)
            seek += max(consumed, 1)
            # Text sampled hot is a poor prompt: OpenAI resets the context after it.
            if options.condition_on_previous_text and result.temperature <= 0.5:
                previous.extend(result.tokens)
            else:
                previous = []
        progress("transcribe", min(seek, content_frames), content_frames)

    stats = {
        "target_calls": decoder_calls,
        "draft_calls": 0,
        "generated_tokens": generated,
        "encoder_seconds": round(encoder_seconds, 3),
        "total_seconds": round(time.perf_counter() - started, 3),
    }
    return Transcript(
        segments=tuple(segments),
        language=language or "en",
        duration=round(duration, 3),
        options=asdict(options),
        stats=stats,
    )

"""One decoding pass over a batch of 30 s windows: `decoding.generate` over a WhisperTarget.

Plain and speculative decoding, greedy and sampled, share this one loop; a draft only changes
how many target calls it takes, never the tokens (greedy) or their distribution (sampled).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from asr.logit_rules import LogitRules
from asr.whisper import EncodedAudio, WhisperModel
from asr.whisper_drafters import Assistant
from asr.whisper_target import WhisperTarget
from decoding import DecodeStats, LookaheadPolicy, SamplingOptions, generate


@dataclass(frozen=True)
class WindowResult:
    tokens: tuple[int, ...]  # generated tokens, without the prompt and the end token
    text: str
    avg_logprob: float  # over the generated tokens and the end token, of rule-masked logits
    no_speech_prob: float
    temperature: float

    @property
    def compression_ratio(self) -> float:
        return compression_ratio(self.text)


def compression_ratio(text: str) -> float:
    """How well zlib compresses the text: repetition loops score high (OpenAI: > 2.4)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class WindowBatch:
    """Windows decoded together, one row each; every prompt ends in the same SOT sequence.

    encoded: the target's view of the windows; draft_encoded: the draft's (None without one).
    """

    encoded: EncodedAudio
    prompts: tuple[tuple[int, ...], ...]
    draft_encoded: EncodedAudio | None = None

    def rows(self, rows: list[int]) -> WindowBatch:
        """These windows, in this order."""
        index = torch.tensor(rows, dtype=torch.long, device=self.encoded.features.device)
        draft = self.draft_encoded
        return WindowBatch(
            encoded=self.encoded.rows(index),
            prompts=tuple(self.prompts[row] for row in rows),
            draft_encoded=None if draft is None else draft.rows(index),
        )


@dataclass(frozen=True)
class WindowDecoder:
    """How windows are decoded: the target, its rules and SOT options, and an optional draft.

    policy: the draft-length policy, shared by every batch of a transcription so that what it
    learns about the pair carries over (None: decoding.Heuristic per batch).
    """

    model: WhisperModel
    rules: LogitRules
    language: str | None
    task: str
    max_new_tokens: int
    assistant: Assistant | None = None
    policy: LookaheadPolicy | None = None

    def decode(
        self, batch: WindowBatch, temperature: float = 0.0, seed: int = 0
    ) -> tuple[tuple[WindowResult, ...], DecodeStats]:
        """Greedy at temperature 0, else sampled (seeded). One result per row of `batch`."""
        model = self.model
        target = WhisperTarget(model, batch.encoded, self.rules)
        drafter = None
        if self.assistant is not None:
            drafter = self.assistant.drafter(
                batch.draft_encoded, self.language, self.task, self.rules.timestamps
            )
        # Whisper knows max_context positions; rows of a batch share one token budget.
        longest = max(len(prompt) for prompt in batch.prompts)
        max_new_tokens = min(self.max_new_tokens, model.max_context - longest)
        sampling = None if temperature == 0 else SamplingOptions(temperature, seed=seed)
        generated = generate(
            target,
            batch.prompts,
            drafter,
            self.policy,
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            eos_token_id=model.special.eot,
        )
        results = []
        rows = zip(generated.tokens, generated.sum_logprobs, target.no_speech_probs, strict=True)
        for tokens, sum_logprob, no_speech_prob in rows:
            text_tokens = tokens[:-1] if tokens and tokens[-1] == model.special.eot else tokens
            results.append(
                WindowResult(
                    tokens=text_tokens,
                    text=model.text_of(list(text_tokens)),
                    # OpenAI divides by the token count plus one for the end token, ended or not.
                    avg_logprob=sum_logprob / (len(text_tokens) + 1),
                    no_speech_prob=no_speech_prob,
                    temperature=temperature,
                )
            )
        return tuple(results), generated.stats

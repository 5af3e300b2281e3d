"""One decoding pass over a batch of 30 s windows: `decoding.generate` over a WhisperTarget.

Plain and speculative decoding, greedy and sampled, share this one loop; a draft only changes
how many target calls it takes, never the tokens (greedy) or their distribution (sampled).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import torch

from asr.cuda_graphs import pool_size
from asr.graph_rounds import default_draft_tokens, rounds_for
from asr.logit_rules import DRAFT_GRAMMAR, LogitRules
from asr.whisper import EncodedAudio, WhisperModel
from asr.whisper_drafters import DraftSource, WhisperDraft
from asr.whisper_target import LanguageOdds, WhisperTarget
from decoding import (
    BeamOptions,
    DecodeStats,
    LookaheadPolicy,
    SamplingOptions,
    beam_search,
    generate,
)

# The most rows a pool of rounds (asr.graph_rounds) has by default: more windows pass
# through them.
MAX_ROUND_ROWS = 32
# The most rows a beam search decodes at once (windows * beam size): each row holds a
# self-attention cache of its own (11 MB for whisper-base in float32).
MAX_BEAM_ROWS = 32


@dataclass(frozen=True)
class WindowResult:
    tokens: tuple[int, ...]  # generated tokens, without the prompt and the end token
    text: str
    avg_logprob: float  # over the generated tokens and the end token, of rule-masked logits
    no_speech_prob: float
    temperature: float
    # Its languages at <|startoftranscript|> (a multilingual model's; None where the decoding
    # path does not record them: CUDA rounds).
    language_odds: LanguageOdds | None = None
    # Decoded with earlier text in its prompt, which Whisper may copy (`asr.guards`); set by
    # the transcription session, which knows the prompts.
    prompted: bool = False
    # Set by the session where every temperature of the schedule failed the quality checks
    # and this, the most probable of their results, was kept: the hottest temperature tried.
    # It decides, as a sampled text's own temperature does, whether the next window's prompt
    # may hold this text.
    fallback_exhausted_at: float | None = None

    @property
    def prompt_temperature(self) -> float:
        """The temperature that decides whether this text may prompt the next window."""
        exhausted = self.fallback_exhausted_at
        return self.temperature if exhausted is None else exhausted

    @property
    def compression_ratio(self) -> float:
        return compression_ratio(self.text)

    @property
    def sum_logprob(self) -> float:
        """The log-probability of its tokens and the end token (`avg_logprob`'s sum)."""
        return self.avg_logprob * (len(self.tokens) + 1)


def compression_ratio(text: str) -> float:
    """How well zlib compresses the text: repetition loops score high (OpenAI: > 2.4)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class WindowBatch:
    """Windows decoded together, one row each; every prompt ends in the same SOT sequence.

    encoded: the target's view of the windows; draft_encoded: the draft's (None without one);
    windows: each row's (first, end) frames in its recording, where a transcription knows them
    (`asr.window_journal` keys results by them).
    """

    encoded: EncodedAudio
    prompts: tuple[tuple[int, ...], ...]
    draft_encoded: EncodedAudio | None = None
    windows: tuple[tuple[int, int], ...] | None = None

    def rows(self, rows: list[int]) -> WindowBatch:
        """These windows, in this order."""
        index = torch.tensor(rows, dtype=torch.long, device=self.encoded.features.device)
        draft = self.draft_encoded
        return WindowBatch(
            encoded=self.encoded.rows(index),
            prompts=tuple(self.prompts[row] for row in rows),
            draft_encoded=None if draft is None else draft.rows(index),
            windows=None if self.windows is None else tuple(self.windows[row] for row in rows),
        )


@dataclass(frozen=True)
class WindowDecoder:
    """How windows are decoded: the target, its rules and SOT options, and an optional draft.

    policy: the draft-length policy, shared by every batch of a transcription so that what it
    learns about the pair carries over (None: decoding.Heuristic per batch).
    in_rounds: decode greedily in whole rounds on the device (`asr.graph_rounds`); None: where
    rounds are captured as CUDA graphs (a float32 decoder on CUDA, with no draft or one that
    shares the target's vocabulary). round_rows: windows decoded at once, a stopped one's row
    taking the next (None: all of a batch, up to MAX_ROUND_ROWS); round_draft_tokens: drafted
    per round (None: `asr.graph_rounds.default_draft_tokens` for the pool);
    round_draft_grammar: the draft applies its whole rules, not only its suppressed ids;
    round_fused: the draft's steps and the rule-state bookkeeping compiled with
    torch.compile (`asr.graph_rounds`); also where the model's `fused_rounds` is set.
    beam: beam search at temperature 0 where its beam_size is above 1 (`decoding.beam`),
    without the draft; None: greedy.
    best_of: samples drawn for a window at a temperature above 0, of which the one with the
    best log-probability per token is kept (OpenAI's best_of).
    """

    model: WhisperModel
    rules: LogitRules
    language: str | None
    task: str
    max_new_tokens: int
    draft: DraftSource | None = None
    policy: LookaheadPolicy | None = None
    in_rounds: bool | None = None
    round_rows: int | None = None
    round_draft_tokens: int | None = None
    round_draft_grammar: bool = DRAFT_GRAMMAR
    round_fused: bool = False
    beam: BeamOptions | None = None
    best_of: int = 1

    def decode(
        self, batch: WindowBatch, temperature: float = 0.0, seed: int = 0
    ) -> tuple[tuple[WindowResult, ...], DecodeStats]:
        """Greedy (or beam search) at temperature 0, else sampled (seeded). One result per row
        of `batch`."""
        model = self.model
        if temperature == 0 and self.beam is not None and self.beam.beam_size > 1:
            return self._decode_beams(batch, self.beam)
        if temperature == 0 and self._decodes_in_rounds():
            return self._decode_in_rounds(batch)
        if temperature > 0 and self.best_of > 1:
            return self._decode_best_of(batch, temperature, seed)
        sampling = None if temperature == 0 else SamplingOptions(temperature, seed=seed)
        branches = self.draft.branches if self.draft is not None and sampling is None else 1
        # A tree's chains are rows of their own, each window's consecutive, which share the
        # window's cross-attention (`asr.static_decoder.SlotCache`'s group).
        target = WhisperTarget(model, batch.encoded, self.rules, group=branches)
        drafter = None
        if self.draft is not None:
            drafter = self.draft.drafter(
                batch.draft_encoded, self.language, self.task, self.rules.timestamps, branches
            )
        max_new_tokens = self._token_budget(batch)
        generated = generate(
            target,
            batch.prompts,
            drafter,
            self.policy,
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            eos_token_id=model.special.eot,
            branches=branches,
        )
        # A tree's chains are rows of their own; the first of each window speaks for it.
        no_speech = target.no_speech_probs[::branches]
        rows = zip(generated.tokens, generated.sum_logprobs, no_speech, strict=True)
        odds = target.language_odds
        return self._results(rows, temperature, odds and odds[::branches]), generated.stats

    def _decode_best_of(
        self, batch: WindowBatch, temperature: float, seed: int
    ) -> tuple[tuple[WindowResult, ...], DecodeStats]:
        """best_of samples of every window, drawn side by side (each window's rows one after
        another, from one seeded stream), and each window's most probable per token (ranked
        as beam search ranks ended hypotheses)."""
        count = self.best_of
        repeated = batch.rows([row for row in range(len(batch.prompts)) for _ in range(count)])
        drawn, stats = replace(self, best_of=1).decode(repeated, temperature, seed)
        rank = BeamOptions(beam_size=1).ranking_score
        chosen = [
            max(
                drawn[start : start + count],
                key=lambda result: rank(result.sum_logprob, len(result.tokens)),
            )
            for start in range(0, len(drawn), count)
        ]
        return tuple(chosen), stats

    def _decode_beams(
        self, batch: WindowBatch, beam: BeamOptions
    ) -> tuple[tuple[WindowResult, ...], DecodeStats]:
        """Beam search, a few windows at a time (`MAX_BEAM_ROWS`); each window's beams are a
        group of rows that share its cross-attention."""
        size = beam.beam_size
        step = max(1, MAX_BEAM_ROWS // size)
        results: list[WindowResult] = []
        stats = DecodeStats()
        for start in range(0, len(batch.prompts), step):
            part = batch.rows(list(range(start, min(start + step, len(batch.prompts)))))
            target = WhisperTarget(self.model, part.encoded, self.rules, group=size)
            searched = beam_search(
                target, part.prompts, beam, self._token_budget(part), self.model.special.eot
            )
            rows = zip(
                searched.tokens, searched.sum_logprobs, target.no_speech_probs[::size], strict=True
            )
            odds = target.language_odds
            results += self._results(rows, 0.0, odds and odds[::size])
            stats += searched.stats
        return tuple(results), stats

    def _token_budget(self, batch: WindowBatch) -> int:
        """New tokens each row may add: Whisper knows max_context positions, and the rows of a
        batch share one budget."""
        longest = max(len(prompt) for prompt in batch.prompts)
        return min(self.max_new_tokens, self.model.max_context - longest)

    def _decodes_in_rounds(self) -> bool:
        if self.in_rounds is not None:
            return self.in_rounds
        model, draft = self.model, self.draft
        same_vocabulary = isinstance(draft, WhisperDraft) and draft.pairing != "cross-tokenizer"
        return (
            model.device.type == "cuda"
            and model.step_graphs_mode == "auto"
            and model.attention_dtype == torch.float32  # exact mode's products are float32
            and (draft is None or same_vocabulary)
        )

    def _decode_in_rounds(self, batch: WindowBatch) -> tuple[tuple[WindowResult, ...], DecodeStats]:
        """Greedy decoding in whole rounds (`asr.graph_rounds`): a pool of `round_rows` rows
        through which every window of the batch passes."""
        model = self.model
        draft_model = None if self.draft is None else self.draft.model
        max_new_tokens = self._token_budget(batch)
        rows = self.round_rows or min(len(batch.prompts), MAX_ROUND_ROWS)
        draft_tokens = self.round_draft_tokens or default_draft_tokens(pool_size(rows))
        pool = rounds_for(
            model,
            self.rules,
            rows,
            draft_model,
            draft_tokens,
            self.round_draft_grammar,
            self.round_fused or model.fused_rounds,
        )
        draft_encoded = None if draft_model is None else batch.draft_encoded
        run = pool.decode(batch.encoded, batch.prompts, max_new_tokens, draft_encoded)
        rows = zip(run.tokens, run.sum_logprobs, run.no_speech_probs, strict=True)
        return self._results(rows, 0.0), run.stats

    def _results(
        self, rows, temperature: float, language_odds: tuple[LanguageOdds, ...] | None = None
    ) -> tuple[WindowResult, ...]:
        """rows: (tokens, sum of log-probabilities, no-speech probability) per window;
        language_odds: per window, where recorded."""
        model, results = self.model, []
        for row, (tokens, sum_logprob, no_speech_prob) in enumerate(rows):
            text_tokens = tokens[:-1] if tokens and tokens[-1] == model.special.eot else tokens
            results.append(
                WindowResult(
                    tokens=text_tokens,
                    text=model.text_of(list(text_tokens)),
                    # OpenAI divides by the token count plus one for the end token, ended or not.
                    avg_logprob=sum_logprob / (len(text_tokens) + 1),
                    no_speech_prob=no_speech_prob,
                    temperature=temperature,
                    language_odds=language_odds[row] if language_odds else None,
                )
            )
        return tuple(results)

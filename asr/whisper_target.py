"""A Whisper decoder over encoded windows as a `decoding.Target` (and, wrapped, a draft model).

One instance decodes one batch of windows, one row per window, with `decoding.generate`. The
windows' cross-attention keys and values (`EncodedAudio`) are computed once per window by the
caller and only read here, so every generation over a window (temperature fallback, a draft's
own decoder) starts from them instead of projecting the encoder output again.

Whisper's logit rules are applied inside `score` to every returned position, each with that
position's own generated prefix, so verification (greedy or sampled) sees exactly the
distributions plain decoding sees, and the log-probabilities `generate` sums are the rule-masked
ones OpenAI averages. A draft Whisper applies its own vocabulary's rules the same way.

Rows keep different numbers of tokens (prompts of different lengths, different acceptance
lengths), so positions are explicit per row and the self-attention cache keeps holes that the
attention mask hides, as in `decoding.causal_lm`, whose column bookkeeping this reuses.
"""

from __future__ import annotations

import torch

from asr.logit_rules import LogitRules
from asr.whisper import EncodedAudio, WhisperModel
from decoding.causal_lm import CacheLayout, attention_mask


class WhisperTarget:
    """Scores token blocks for a batch of windows; the cache rolls back per row.

    A row's prompt is [<|startofprev|>, previous text...] + SOT sequence; the tokens after its
    SOT sequence are what the rules call "generated". The SOT sequence's length only depends on
    the vocabulary and the timestamp mode, so it is the same for every row.
    """

    def __init__(
        self,
        model: WhisperModel,
        encoded: EncodedAudio,
        rules: LogitRules,
        measure_no_speech: bool = True,
    ) -> None:
        self.model = model
        self.device = model.device
        self.rules = rules
        self.sot_length = len(model.sot_sequence(None, "transcribe", rules.timestamps))
        self.measure_no_speech = measure_no_speech
        self.encoded = encoded  # every window, in the caller's order; the cache reads its K/V
        self._no_speech: tuple[float, ...] | None = None
        self.reset()

    @property
    def no_speech_probs(self) -> tuple[float, ...]:
        """P(<|nospeech|>) at each window's <|startoftranscript|>, from a generation's first
        `score` (raw logits, before any rule, as OpenAI)."""
        if self._no_speech is None:
            raise RuntimeError("no_speech_probs is known after the first score of a window")
        return self._no_speech

    def reset(self) -> None:
        self.cache = None
        self.layout: CacheLayout | None = None
        self._features = self.encoded.features  # the rows still decoding
        self._history: torch.Tensor | None = None  # (batch, max_context): token at each position
        self._generated_from: torch.Tensor | None = None  # (batch,): position after the prompt

    def score(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: int
    ) -> torch.Tensor:
        """Appends a block to every row and returns rule-masked logits of its last `keep` columns.

        tokens, positions, mask: Tensor, shape = (batch, width); False in mask marks padding.
        Returns Tensor, shape = (batch, keep, vocab), at least float32.
        """
        # Padding and unused draft slots of rows near the end of their budget may lie past the
        # last position Whisper knows; they are rolled back, so any position will do for them.
        positions = positions.clamp(max=self.model.max_context - 1)
        first = self.layout is None
        if first:
            batch = tokens.shape[0]
            self.layout = CacheLayout(batch, self.device)
            self.cache = self.model.new_cache(self.encoded)
            self._history = torch.zeros(
                (batch, self.model.max_context), dtype=torch.long, device=self.device
            )
        mask_is_full = bool(mask.all())
        if mask_is_full:
            self._history.scatter_(1, positions, tokens)
        else:  # padding must not overwrite a real token that shares its (clamped) position
            rows, columns = mask.nonzero(as_tuple=True)
            self._history[rows, positions[rows, columns]] = tokens[rows, columns]

        states = self.model.decoder_states(
            tokens,
            positions,
            attention_mask([self.layout], mask, mask_is_full),
            self._features,
            self.cache,
        )
        self.layout.append(positions, mask, mask_is_full)
        if first:
            self._start_rows(tokens, positions, mask, states)
        logits = self.model.logits(states[:, -keep:])
        return self._apply_rules(logits, positions[:, -keep:])

    def _start_rows(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        states: torch.Tensor,
    ) -> None:
        """Finds each row's prompt end and, for a target, its no-speech probability.

        The first block holds every row's whole prompt, whose only <|startoftranscript|> starts
        the SOT sequence (text tokens and <|startofprev|> come before it).
        """
        at_sot = (tokens == self.model.special.sot) & mask
        if not bool(at_sot.any(dim=1).all()):
            raise ValueError("every prompt row needs a <|startoftranscript|> token")
        column = at_sot.int().argmax(dim=1)
        rows = torch.arange(tokens.shape[0], device=self.device)
        self._generated_from = positions[rows, column] + self.sot_length
        if self.measure_no_speech:
            # OpenAI reads it from the raw logits at the SOT position, before any rule.
            probs = self.model.logits(states[rows, column]).softmax(dim=-1)
            self._no_speech = tuple(probs[:, self.model.special.no_speech].tolist())

    def _apply_rules(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """logits[r, j] predicts the token after position positions[r, j]; the rules see the
        row's generated tokens up to and including that position. Shapes: (batch, keep, vocab),
        (batch, keep)."""
        batch, keep, vocab = logits.shape
        starts = self._generated_from.tolist()
        ends = (positions + 1).tolist()
        history = self._history[:, : max(max(row) for row in ends)].tolist()
        prefixes = [history[row][starts[row] : end] for row in range(batch) for end in ends[row]]
        masked = self.rules.apply(logits.reshape(batch * keep, vocab), prefixes)
        return masked.reshape(batch, keep, vocab)

    def rollback(self, lengths: torch.Tensor) -> None:
        """Forgets cached positions >= lengths[r]. Tensor, shape = (batch,)."""
        if self.layout is not None:
            dropped = self.layout.rollback(lengths)
            if dropped:
                self.cache.crop(-dropped)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keeps only these rows, in this order. Tensor, shape = (n,)."""
        if self.layout is None:
            return
        self.cache.batch_select_indices(rows)
        dropped = self.layout.keep_rows(rows)
        if dropped:
            self.cache.crop(-dropped)
        self._features = self._features[rows]
        self._history = self._history[rows]
        self._generated_from = self._generated_from[rows]

"""A Whisper decoder over encoded windows as a `decoding.Target` (and, wrapped, a draft model).

One instance decodes one batch of windows, one row per window, with `decoding.generate`. The
windows' cross-attention keys and values (`EncodedAudio`) are computed once per window by the
caller and only read here, so every generation over a window (temperature fallback, a draft's
own decoder) starts from them instead of projecting the encoder output again.

Whisper's logit rules are applied inside `score` to every returned position, each with that
position's own generated prefix, so verification (greedy or sampled) sees exactly the
distributions plain decoding sees, and the log-probabilities `generate` sums are the rule-masked
ones OpenAI averages. A draft Whisper applies its own vocabulary's rules the same way.

The decoder keeps position p of a row in cache slot p (`asr.static_decoder`), so rows of
different lengths need no bookkeeping and rollback costs nothing. A target's calls run in
the decoder's exact mode where the kernels allow, so a position scores the same bits alone, in
a drafted block and beside other windows whatever their prompts; there the first call, which
scores the prompts, verifies a first draft too (`width_invariant`), and elsewhere it scores
the prompts alone (`decoding.generate`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asr.logit_rules import LogitRules, Prefixes
from asr.traced_step import TracedSteps
from asr.whisper import EncodedAudio, WhisperModel
from decoding.verify import best_tokens


@dataclass(frozen=True)
class LanguageOdds:
    """A window's languages at its <|startoftranscript|> (softmax over the language tokens):
    the likeliest, its probability, and that of the language it is decoded in (`named`)."""

    heard: str
    heard_probability: float
    named: str
    named_probability: float


def language_odds(
    model: WhisperModel, sot_logits: torch.Tensor, named: torch.Tensor
) -> tuple[LanguageOdds, ...]:
    """Each row's `LanguageOdds` from its logits at <|startoftranscript|>. sot_logits: Tensor,
    shape = (rows, vocab); named: Tensor, shape = (rows,), each row's language token id."""
    languages = model.special.language_ids
    codes = sorted(languages, key=languages.__getitem__)
    ids = torch.tensor([languages[code] for code in codes], device=sot_logits.device)
    odds = sot_logits.float()[:, ids].softmax(dim=-1)
    best = odds.argmax(dim=-1)
    columns = torch.searchsorted(ids, named.to(ids.device)).clamp(max=len(ids) - 1)
    rows = zip(
        best.tolist(),
        odds.gather(1, best[:, None])[:, 0].tolist(),
        columns.tolist(),
        odds.gather(1, columns[:, None])[:, 0].tolist(),
        strict=True,
    )
    return tuple(
        LanguageOdds(codes[heard], p_heard, codes[name], p_named)
        for heard, p_heard, name, p_named in rows
    )


class WhisperTarget:
    """Scores token blocks for a batch of windows; the cache rolls back per row.

    A row's prompt is [<|startofprev|>, previous text...] + SOT sequence; the tokens after its
    SOT sequence are what the rules call "generated". The SOT sequence's length only depends on
    the vocabulary and the timestamp mode, so it is the same for every row.
    measure_no_speech: read P(<|nospeech|>) at each window's SOT (a target; not a draft).
    exact: score in the decoder's exact mode (a target; None: where the model's
    kernels allow it). A draft needs neither: verification checks what it proposes.
    grammar: apply the whole rules; False: only the suppressed ids (a draft's cheap rules,
    `asr.logit_rules.DRAFT_GRAMMAR`).
    group: rows per window of `encoded`, consecutive (the chains of a drafted tree,
    `decoding.generate`'s branches): `score` takes windows * group rows.
    store_padding: after the first block, store the padding columns too (a draft's): a draft
    block's padding is committed tokens at their own, cached positions
    (`decoding.drafters.draft_block` right-aligns the uncached tails), so storing them again
    only recomputes what the cache holds, perhaps in other last bits, which a draft's
    proposals may afford; a block with no mask can then be a traced step (asr.traced_step).
    """

    def __init__(
        self,
        model: WhisperModel,
        encoded: EncodedAudio,
        rules: LogitRules,
        measure_no_speech: bool = True,
        exact: bool | None = None,
        grammar: bool = True,
        group: int = 1,
        store_padding: bool = False,
    ) -> None:
        self.model = model
        self.device = model.device
        self.rules = rules
        self.sot_length = len(model.sot_sequence(None, "transcribe", rules.timestamps))
        self.measure_no_speech = measure_no_speech
        self.exact = model.exact_steps if exact is None else exact
        self.grammar = grammar
        self.group = group
        self.store_padding = store_padding
        self.encoded = encoded  # every window, in the caller's order; the cache reads its K/V
        self._no_speech: tuple[float, ...] | None = None
        self._language_odds: tuple[LanguageOdds, ...] | None = None
        self._prompt_languages: torch.Tensor | None = None  # (batch,): each row's language id
        self._suppressed: torch.Tensor | None = None  # _suppressed_columns, made on first use
        self.reset()

    @property
    def width_invariant(self) -> bool:
        """`decoding.Target`'s: exact mode scores a position with the bits it gets alone, so
        the prompts' first call may verify a first draft too."""
        return self.exact

    @property
    def no_speech_probs(self) -> tuple[float, ...]:
        """P(<|nospeech|>) at each window's <|startoftranscript|>, from a generation's first
        `score` (raw logits, before any rule, as OpenAI)."""
        if self._no_speech is None:
            raise RuntimeError("no_speech_probs is known after the first score of a window")
        return self._no_speech

    @property
    def language_odds(self) -> tuple[LanguageOdds, ...] | None:
        """Each window's `LanguageOdds`, from a generation's first `score` (raw logits, as
        no-speech's); None for an English-only model, or before the first score."""
        return self._language_odds

    def reset(self) -> None:
        self.cache = None
        self.graphs = None  # asr.cuda_graphs.StepGraphs holding this batch, where captured
        self._history: torch.Tensor | None = None  # (batch, max_context): token at each position
        self._generated_from: torch.Tensor | None = None  # (batch,): position after the prompt

    @torch.inference_mode()
    def score(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: int
    ) -> torch.Tensor:
        """Appends a block to every row and returns rule-masked logits of its last `keep` columns.

        tokens, positions, mask: Tensor, shape = (batch, width); False in mask marks padding.
        Returns Tensor, shape = (batch, keep, vocab), at least float32.
        """
        positions, valid, first = self._store(tokens, positions, mask)
        if self.graphs is not None and not first and valid is None:
            # A captured step computes the target's exact-mode logits (rows independent), the
            # draft's over every slot instead of the used ones.
            logits = self.graphs.step(tokens, positions)[:, -keep:].clone()
            return self._apply_rules(logits, positions[:, -keep:])
        # Traced blocks on CPU: the same bits, less Python. A draft's short fast-mode blocks,
        # and a window decoded alone's exact-mode steps and verifications.
        if self._traceable(tokens, keep, first, valid):
            logits = self.model.traced_steps.logits(tokens, positions, self.cache)
            if logits is not None:
                return self._apply_rules(logits[:, -keep:], positions[:, -keep:])
        elif self.exact and not first and self.graphs is None and valid is None:
            logits = self.model.traced_steps.exact_logits(tokens, positions, self.cache, keep)
            if logits is not None:
                return self._apply_rules(logits, positions[:, -keep:])
        return self._scored(tokens, positions, mask, valid, first, keep)

    def _greedy_stored(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        valid: torch.Tensor | None,
        first: bool,
    ) -> torch.Tensor:
        """`score(tokens, positions, mask, keep=1)[:, -1].argmax(dim=-1)` after `_store` (its
        returns), the same tokens. A draft's traced step (its rules only the suppressed ids)
        takes the argmax over its head's columns inside the trace, without the whole
        vocabulary's logits that a reduced head fills in. Returns Tensor, shape = (batch,)."""
        if self._traceable(tokens, 1, first, valid):
            best = self.model.traced_steps.greedy_tokens(
                tokens, positions, self.cache, self._suppressed_columns()
            )
            if best is not None:
                return best
        return best_tokens(self._scored(tokens, positions, mask, valid, first, 1)[:, -1])

    @torch.inference_mode()
    def greedy_chain(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, steps: int
    ) -> torch.Tensor:
        """`steps` greedy tokens (`decoding.protocols.GreedyTarget`): the block's, then that of
        each token but the last, fed at the position after it. A draft's traced steps run as
        one chained call where the block is a traced step (asr.traced_step's `_GreedyChain`):
        the same tokens and cache. Returns Tensor, shape = (batch, steps)."""
        if self.grammar or self.graphs is not None:  # the rules need the logits
            best = best_tokens(self.score(tokens, positions, mask, keep=1)[:, -1])
        else:
            stored, valid, first = self._store(tokens, positions, mask)
            if steps > 1 and self._traceable(tokens, 1, first, valid):
                chain = self.model.traced_steps.greedy_chain(
                    tokens, stored, self.cache, self._suppressed_columns(), steps
                )
                if chain is not None:
                    fed = stored[:, -1:] + torch.arange(1, steps, device=self.device)
                    self._history.scatter_(
                        1, fed.clamp(max=self.model.max_context - 1), chain[:, :-1]
                    )
                    return chain
            best = self._greedy_stored(tokens, stored, mask, valid, first)
        best = best.unsqueeze(1)
        if steps == 1:
            return best
        # The rest is a chain from this token (one call, where the block before could not be).
        every_column = torch.ones_like(best, dtype=torch.bool)
        rest = self.greedy_chain(best, positions[:, -1:] + 1, every_column, steps - 1)
        return torch.cat([best, rest], dim=1)

    def _store(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """What every block does first: makes the cache on the batch's first block and records
        the block's tokens for the rules. Returns (positions clamped to the context, the mask
        where some column is padding or None, whether this is the first block)."""
        # Padding and unused draft slots of rows near the end of their budget may lie past the
        # last position Whisper knows; they are rolled back, so any position will do for them.
        positions = positions.clamp(max=self.model.max_context - 1)
        first = self.cache is None
        if self.store_padding and not first:
            mask = torch.ones_like(mask)
        if first:
            # Captured steps hold one row per window.
            self.graphs = self.model.step_graphs(tokens.shape[0]) if self.group == 1 else None
            if self.graphs is None:
                self.cache = self.model.new_cache(self.encoded, self.group)
            else:
                self.cache = self.graphs.load(self.encoded.cross)
            self._history = torch.zeros(
                (tokens.shape[0], self.model.max_context), dtype=torch.long, device=self.device
            )
        mask_is_full = bool(mask.all())
        if mask_is_full:
            self._history.scatter_(1, positions, tokens)
        else:  # padding must not overwrite a real token that shares its (clamped) position
            rows, columns = mask.nonzero(as_tuple=True)
            self._history[rows, positions[rows, columns]] = tokens[rows, columns]
        return positions, None if mask_is_full else mask, first

    def _traceable(
        self, tokens: torch.Tensor, keep: int, first: bool, valid: torch.Tensor | None
    ) -> bool:
        """Whether this block is a traced step (asr.traced_step): a fast-mode block without
        padding after the first, where no CUDA graph holds the batch."""
        if first or self.exact or self.graphs is not None or valid is not None:
            return False
        return TracedSteps.applies(self.model, tokens, keep, self.cache)

    def _scored(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        valid: torch.Tensor | None,
        first: bool,
        keep: int,
    ) -> torch.Tensor:
        """`score`'s logits computed eagerly (or through the graphs' uncaptured forward)."""
        if self.graphs is not None:
            states = self.graphs.forward(tokens, positions, valid, exact=self.exact)
        else:
            # The prompts too: a shorter prompt is left-padded beside longer ones, and only
            # exact mode gives its positions the bits they get alone.
            states = self.model.decoder_states(
                tokens, positions, self.cache, exact=self.exact, valid=valid
            )
        kept = states[:, -keep:]
        if first:
            sot_states = self._start_rows(tokens, positions, mask, states)
            if sot_states is not None:  # one head call for both
                logits = self.model.logits(torch.cat([kept, sot_states[:, None]], dim=1))
                self._record_no_speech(logits[:, -1])
                return self._apply_rules(logits[:, :-1], positions[:, -keep:])
        return self._apply_rules(self.model.logits(kept), positions[:, -keep:])

    def _suppressed_columns(self) -> torch.Tensor:
        """The head's columns of the ids the rules always suppress (`LogitRules.suppress`);
        made once per instance. Tensor, shape = (n,), long."""
        if self._suppressed is None:
            ids = self.rules.suppressed_ids(self.device)
            self._suppressed = self.model.head_columns(ids)
        return self._suppressed

    def _start_rows(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        states: torch.Tensor,
    ) -> torch.Tensor | None:
        """Finds each row's prompt end; returns the states at each row's SOT when this model
        measures no-speech probabilities (else None).

        The first block holds every row's whole prompt, whose only <|startoftranscript|> starts
        the SOT sequence (text tokens and <|startofprev|> come before it).
        """
        at_sot = (tokens == self.model.special.sot) & mask
        if not bool(at_sot.any(dim=1).all()):
            raise ValueError("every prompt row needs a <|startoftranscript|> token")
        column = at_sot.int().argmax(dim=1)
        rows = torch.arange(tokens.shape[0], device=self.device)
        self._generated_from = positions[rows, column] + self.sot_length
        if self.model.special.multilingual:  # a multilingual SOT sequence names its language
            after = (column + 1).clamp(max=tokens.shape[1] - 1)
            self._prompt_languages = tokens[rows, after]
        return states[rows, column] if self.measure_no_speech else None

    def _record_no_speech(self, sot_logits: torch.Tensor) -> None:
        # OpenAI reads it from the raw logits at the SOT position, before any rule.
        probs = sot_logits.float().softmax(dim=-1)
        self._no_speech = tuple(probs[:, self.model.special.no_speech].tolist())
        if self._prompt_languages is not None:
            self._language_odds = language_odds(self.model, sot_logits, self._prompt_languages)

    def _apply_rules(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """logits[r, j] predicts the token after position positions[r, j]; the rules see the
        row's generated tokens up to and including that position. Shapes: (batch, keep, vocab),
        (batch, keep)."""
        batch, keep, vocab = logits.shape
        if not self.grammar:
            return self.rules.suppress(logits.reshape(batch * keep, vocab)).reshape(logits.shape)
        prefixes = Prefixes.from_history(
            self._history,
            self._generated_from,
            positions + 1,
            self.model.special.timestamp_begin,
        )
        masked = self.rules.apply_prefixes(logits.reshape(batch * keep, vocab), prefixes)
        return masked.reshape(batch, keep, vocab)

    def copy_positions(
        self, source: torch.Tensor, starts: torch.Tensor, stops: torch.Tensor
    ) -> None:
        """Row r takes row source[r]'s cached positions starts[r] .. stops[r] - 1: keys and
        values in every layer, and the tokens the rules read (the chain of a drafted tree that
        its group committed, `decoding.generate`). Rows with source[r] == r keep theirs.
        Tensors, shape = (batch,)."""
        rows = torch.arange(len(source), device=source.device)
        moved = ((source != rows) & (stops > starts)).nonzero().flatten().tolist()
        if not moved:
            return
        spans = zip(
            source[moved].tolist(), starts[moved].tolist(), stops[moved].tolist(), strict=True
        )
        triples = [
            (row, chain, slot)
            for row, (chain, start, stop) in zip(moved, spans, strict=True)
            for slot in range(start, stop)
        ]
        into, chains, slots = torch.tensor(triples, device=self.device).unbind(1)
        for keys, values in zip(self.cache.keys, self.cache.values, strict=True):
            keys[into, :, :, slots] = keys[chains, :, :, slots]
            values[into, :, slots] = values[chains, :, slots]
        self._history[into, slots] = self._history[chains, slots]

    def rollback(self, lengths: torch.Tensor) -> None:
        """Forgets cached positions >= lengths[r]. Tensor, shape = (batch,). Nothing to do: a
        rolled-back slot is rewritten before any query can see it."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keeps only these rows, in this order. Tensor, shape = (n,). Before the first call
        (a draft that has not proposed yet) only the windows to score are narrowed."""
        if self.cache is None:
            # rows keep whole groups (a tree's chains), so each group's first row names its window
            self.encoded = self.encoded.rows(rows[:: self.group] // self.group)
            return
        if self.graphs is not None:
            smaller = self.model.step_graphs(len(rows))
            self.cache = smaller.adopt(self.graphs, rows)
            self.graphs = smaller
        else:
            self.cache.keep_rows(rows)
        self._history = self._history[rows]
        self._generated_from = self._generated_from[rows]

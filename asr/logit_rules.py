"""Whisper's logit rules (OpenAI's decoding.py): suppression and timestamp grammar.

Every rule is a function of the tokens generated so far, so a speculative verifier can apply
the same rules at each drafted position with that position's own prefix, and the result stays
token-for-token the same as plain greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asr.whisper import SpecialTokens

BLANK_TOKEN = 220  # " " in both Whisper vocabularies


@dataclass(frozen=True)
class LogitRules:
    special: SpecialTokens
    suppress_tokens: tuple[int, ...]
    timestamps: bool
    max_initial_timestamp_index: int | None = 50  # 1.0 s

    def apply(self, logits: torch.Tensor, generated: list[list[int]]) -> torch.Tensor:
        """Masks logits for the next token of each row.

        logits: Tensor, shape = (batch, vocab); generated[b] are the tokens row b sampled after
        the prompt (the SOT sequence). Returns a new tensor; the input is left untouched.
        """
        logits = logits.clone()
        special = self.special
        suppressed = list(self.suppress_tokens)
        if self.timestamps:
            suppressed.append(special.no_timestamps)
        logits[:, suppressed] = -torch.inf
        for row, tokens in enumerate(generated):
            if not tokens:  # SuppressBlank: no leading space or immediate end
                logits[row, [BLANK_TOKEN, special.eot]] = -torch.inf
            if self.timestamps:
                self._timestamp_grammar(logits[row], tokens)
        if self.timestamps:
            # Sample a timestamp when their total probability beats any single text token
            # (row by row, as OpenAI; one batched log-softmax over the rows).
            begin = special.timestamp_begin
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            timestamp_wins = logprobs[:, begin:].logsumexp(dim=-1) > logprobs[:, :begin].amax(-1)
            logits[timestamp_wins, :begin] = -torch.inf
        return logits

    def _timestamp_grammar(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """Pairing, monotonic and initial-timestamp rules for one row, in place."""
        begin = self.special.timestamp_begin
        last_was_timestamp = len(tokens) >= 1 and tokens[-1] >= begin
        penultimate_was_timestamp = len(tokens) < 2 or tokens[-2] >= begin
        if last_was_timestamp:
            if penultimate_was_timestamp:  # a closed pair: text must follow
                logits[begin:] = -torch.inf
            else:  # an open timestamp: another timestamp or the end must follow
                logits[: self.special.eot] = -torch.inf

        timestamps = [t for t in tokens if t >= begin]
        if timestamps:
            # Monotonic; a closing timestamp may repeat the opening one (empty segment).
            last = timestamps[-1]
            floor = last if last_was_timestamp and not penultimate_was_timestamp else last + 1
            logits[begin:floor] = -torch.inf

        if not tokens:  # the first token is a timestamp, no later than max_initial_timestamp
            logits[:begin] = -torch.inf
            if self.max_initial_timestamp_index is not None:
                logits[begin + self.max_initial_timestamp_index + 1 :] = -torch.inf

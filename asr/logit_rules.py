"""Whisper's logit rules (OpenAI's decoding.py): suppression and timestamp grammar.

Every rule is a function of the tokens generated so far, so a speculative verifier can apply
the same rules at each drafted position with that position's own prefix, and the result stays
token-for-token the same as plain greedy decoding. What a rule reads of a prefix fits in four
numbers per position (`Prefixes`), so the rules of every position of a verified block are
applied in one vectorised pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from asr.whisper import SpecialTokens

BLANK_TOKEN = 220  # " " in both Whisper vocabularies
# Whether a draft of the target's vocabulary applies the whole rules to what it proposes, or
# only masks the suppressed ids: verification applies the target's whole rules either way, so
# the output is the same. Measured (docs/gpu.md): the grammar costs a draft step about 40 more
# small kernels (an H200) and accepted no more drafted tokens (2.35 against 2.37 a round).
DRAFT_GRAMMAR = False
NONE = -1  # no such token (an empty or one-token prefix, no timestamp yet)


_FIELDS = ("count", "last", "penultimate", "last_timestamp")  # Prefixes' tensors


@dataclass(frozen=True)
class Prefixes:
    """What the rules read of the generated prefixes of `rows` positions; each Tensor, shape =
    (rows,), long.

    count: tokens generated so far (only 0, 1 and "2 or more" matter); last, penultimate: the
    last two of them (NONE where the prefix is shorter); last_timestamp: the last timestamp
    token among them (NONE when there is none).
    """

    count: torch.Tensor
    last: torch.Tensor
    penultimate: torch.Tensor
    last_timestamp: torch.Tensor

    @classmethod
    def of(cls, generated: list[list[int]], timestamp_begin: int, device) -> Prefixes:
        def pick(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        stamps = [[t for t in tokens if t >= timestamp_begin] for tokens in generated]
        return cls(
            count=pick([len(tokens) for tokens in generated]),
            last=pick([tokens[-1] if tokens else NONE for tokens in generated]),
            penultimate=pick([tokens[-2] if len(tokens) > 1 else NONE for tokens in generated]),
            last_timestamp=pick([found[-1] if found else NONE for found in stamps]),
        )

    @classmethod
    def empty(cls, rows: int, device) -> Prefixes:
        """`rows` prefixes of no generated token."""
        none = torch.full((rows,), NONE, dtype=torch.long, device=device)
        return cls(torch.zeros_like(none), none, none.clone(), none.clone())

    def after(self, token: torch.Tensor, timestamp_begin: int, take: torch.Tensor) -> Prefixes:
        """These prefixes with `token` appended where `take` (both Tensor, shape = (rows,)),
        unchanged elsewhere; on the device, without reading anything back."""
        # The greatest timestamp so far, as from_history's running maximum reads it.
        latest = torch.maximum(token, self.last_timestamp)
        stamp = torch.where(token >= timestamp_begin, latest, self.last_timestamp)
        return Prefixes(
            count=self.count + take.long(),
            last=torch.where(take, token, self.last),
            penultimate=torch.where(take, self.last, self.penultimate),
            last_timestamp=torch.where(take, stamp, self.last_timestamp),
        )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The four tensors, in the order the constructor takes them."""
        return tuple(getattr(self, name) for name in _FIELDS)

    @classmethod
    def interleave(cls, columns: list[Prefixes]) -> Prefixes:
        """Prefixes of rows x columns (each of `columns` holds one column's rows), row by row
        as `from_history` orders them."""
        return cls(*(torch.stack([getattr(c, n) for c in columns], 1).flatten() for n in _FIELDS))

    def assign(self, other: Prefixes, row: int | None = None) -> None:
        """Copies `other`'s values into these tensors (static buffers of a CUDA graph): into
        every row, or into row `row` alone (`other` then holds one row)."""
        for name in _FIELDS:
            mine = getattr(self, name)
            (mine if row is None else mine[row : row + 1]).copy_(getattr(other, name))

    @classmethod
    def from_history(
        cls, history: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, timestamp_begin: int
    ) -> Prefixes:
        """history: Tensor, shape = (batch, columns), the token at each position of each row;
        row r's generated tokens start at position starts[r] (shape = (batch,)); ends: Tensor,
        shape = (batch, keep), a prefix ends before each of these positions.
        Returns the (batch * keep) prefixes, row by row."""
        width = int(ends.max())
        history = history[:, :width]
        columns = torch.arange(width, device=history.device)
        generated = columns >= starts[:, None]
        last_index = (ends - 1).clamp(min=0)
        count = ends - starts[:, None]
        stamps = torch.where(generated & (history >= timestamp_begin), history, NONE)
        last_timestamp = stamps.cummax(dim=1).values.gather(1, last_index)
        last = history.gather(1, last_index)
        penultimate = history.gather(1, (ends - 2).clamp(min=0))
        return cls(
            count=count.reshape(-1),
            last=torch.where(count >= 1, last, NONE).reshape(-1),
            penultimate=torch.where(count >= 2, penultimate, NONE).reshape(-1),
            last_timestamp=torch.where(count >= 1, last_timestamp, NONE).reshape(-1),
        )


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
        begin = self.special.timestamp_begin
        prefixes = Prefixes.of(generated, begin, logits.device)
        return self.apply_prefixes(logits.clone(), prefixes)

    def apply_prefixes(
        self, logits: torch.Tensor, prefixes: Prefixes, branch_free: bool = False
    ) -> torch.Tensor:
        """`apply` for prefixes already summarised, IN PLACE: logits: Tensor, shape = (rows,
        vocab), returned. branch_free: apply every mask without first reading on the host
        whether any row needs it (a CUDA graph records no such read; same result)."""
        special = self.special
        begin, eot = special.timestamp_begin, special.eot
        self.suppress(logits)
        empty = (prefixes.count == 0)[:, None]
        # Rare after a block's first position: skip what it masks.
        any_empty = branch_free or bool(empty.any())
        if any_empty:  # SuppressBlank: no leading space or immediate end.
            logits[:, BLANK_TOKEN : BLANK_TOKEN + 1].masked_fill_(empty, -torch.inf)
            logits[:, eot : eot + 1].masked_fill_(empty, -torch.inf)
        if not self.timestamps:
            return logits
        self._timestamp_grammar(logits, prefixes, empty, any_empty, branch_free)
        # Sample a timestamp when their total probability beats any single text token (row by
        # row, as OpenAI). Compared on the logits: both sides of OpenAI's comparison of
        # log-probabilities carry the same normaliser.
        timestamp_wins = logits[:, begin:].logsumexp(dim=-1) > logits[:, :begin].amax(dim=-1)
        logits[:, :begin].masked_fill_(timestamp_wins[:, None], -torch.inf)
        return logits

    def suppress(self, logits: torch.Tensor) -> torch.Tensor:
        """Masks the always-suppressed ids, IN PLACE (the first rule; alone, a draft's cheap
        rules). logits: Tensor, shape = (rows, vocab), returned."""
        # index_fill_ rather than an indexed assignment, whose value would be a host tensor
        # copied to the device (which a CUDA graph cannot record).
        return logits.index_fill_(1, self.suppressed_ids(logits.device), -torch.inf)

    def suppressed_ids(self, device) -> torch.Tensor:
        """The ids always masked: suppress_tokens, and <|notimestamps|> with timestamps."""
        ids = self.suppress_tokens + ((self.special.no_timestamps,) if self.timestamps else ())
        return _constant(ids, str(device))

    def _timestamp_grammar(
        self,
        logits: torch.Tensor,
        prefixes: Prefixes,
        empty: torch.Tensor,
        any_empty: bool,
        branch_free: bool,
    ) -> None:
        """Pairing, monotonic and initial-timestamp rules, in place. empty: (rows, 1) bool."""
        begin, eot = self.special.timestamp_begin, self.special.eot
        text, stamps = logits[:, :begin], logits[:, begin:]
        last_was_timestamp = prefixes.last >= begin
        penultimate_was_timestamp = (prefixes.count < 2) | (prefixes.penultimate >= begin)
        closed_pair = last_was_timestamp & penultimate_was_timestamp
        open_pair = last_was_timestamp & ~penultimate_was_timestamp
        # A closed pair: text must follow. An open timestamp: another timestamp or the end.
        # Monotonic; a closing timestamp may repeat the opening one (empty segment). All three
        # mask the timestamps below a floor (all of them for a closed pair).
        last = prefixes.last_timestamp
        floor = torch.where(open_pair, last, last + 1) - begin
        floor = torch.where(closed_pair, stamps.shape[1], floor.clamp(min=0))
        offsets = _constant(tuple(range(stamps.shape[1])), str(logits.device))
        stamps.masked_fill_(offsets < floor[:, None], -torch.inf)
        if branch_free or bool(open_pair.any()):
            logits[:, :eot].masked_fill_(open_pair[:, None], -torch.inf)
        if any_empty:  # the first token is a timestamp, no later than max_initial_timestamp
            text.masked_fill_(empty, -torch.inf)
            if self.max_initial_timestamp_index is not None:
                late = offsets > self.max_initial_timestamp_index
                stamps.masked_fill_(empty & late, -torch.inf)


@functools.cache
def _constant(values: tuple[int, ...], device: str) -> torch.Tensor:
    """A long tensor of `values` on `device`, made once (the rules apply at every step)."""
    return torch.tensor(values, dtype=torch.long, device=device)

"""Beam search for a batch of prompts, by OpenAI Whisper's rule, over a `BranchingTarget`.

Each prompt keeps `beam_size` hypotheses, its group of consecutive target rows. At every step
each hypothesis offers its beam_size + 1 likeliest next tokens; the group keeps the beam_size
likeliest sequences that do not end (summed log-probabilities of the target's logits, which a
Whisper target has already masked by its rules) and collects those that end in a stop token,
most probable first, until `patience * beam_size` have ended. The result is the ended sequence
with the best length-normalised score (`BeamOptions.ranking_score`); a prompt that reaches
max_new_tokens first also ranks its unfinished hypotheses, as OpenAI's `finalize` does.

A hypothesis keeps its row while it survives: its first child stays there, and only the rows
of hypotheses that died take over another's extra children, copying that hypothesis's
generated positions (`BranchingTarget.copy_positions`). A step therefore moves a few rows'
caches, where reordering the whole batch would copy every row's.

No draft: speculation verifies one sequence, and a beam's choice depends on every candidate's
probability, not only on the best token. `decoding.reference.beam_search_one` is the same
search for one prompt, rescoring every sequence from scratch; tests check this one against it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from decoding.generate import PAD, DecodeStats, GenerationResult, _as_rows, _stop_ids, device_clock
from decoding.protocols import BranchingTarget

# More ended hypotheses than this many beams' worth only run every window to its token limit
# (patience 1e300 took a request ten times as long; 1e308 overflowed).
MAX_PATIENCE = 10.0


@dataclass(frozen=True)
class BeamOptions:
    """beam_size: hypotheses per prompt (1 is greedy decoding); patience: how many ended
    sequences to collect, as a multiple of beam_size, before stopping (OpenAI's; 1.0 stops at
    beam_size); length_penalty: None ranks ended sequences by log-probability per token, a
    number alpha by log-probability / ((5 + length) / 6) ** alpha (Google NMT's)."""

    beam_size: int = 5
    patience: float = 1.0
    length_penalty: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.beam_size, int) or not 1 <= self.beam_size <= 16:
            raise ValueError(f"beam_size must be an integer in 1..16, not {self.beam_size!r}")
        if not 0 < self.patience <= MAX_PATIENCE or self.candidates < 1:
            raise ValueError(
                f"patience: a positive number up to {MAX_PATIENCE:g} whose product with "
                f"beam_size rounds to at least 1 (got {self.patience} with beam_size "
                f"{self.beam_size})"
            )
        penalty = self.length_penalty
        if penalty is not None and not 0 <= penalty < math.inf:
            raise ValueError(f"length_penalty must be a non-negative number, not {penalty}")

    @property
    def candidates(self) -> int:
        """Ended sequences collected before a prompt's search stops."""
        return round(self.beam_size * self.patience)

    def ranking_score(self, sum_logprob: float, length: int) -> float:
        """An ended sequence's rank: length counts its tokens before the stop token."""
        if self.length_penalty is None:
            return sum_logprob / max(length, 1)
        return sum_logprob / ((5 + length) / 6) ** self.length_penalty


@dataclass(frozen=True)
class _Hypothesis:
    tokens: tuple[int, ...]  # generated so far
    sum_logprob: float
    slot: int  # its row within its prompt's group


@dataclass
class _Prompt:
    """One prompt's search: its live hypotheses, most probable first, and its ended ones."""

    index: int  # in the caller's batch
    length: int  # prompt tokens: the first generated token sits at this position
    beams: list[_Hypothesis]
    ended: dict[tuple[int, ...], float] = field(default_factory=dict)

    def result(self, options: BeamOptions, stop: set[int]) -> tuple[tuple[int, ...], float]:
        """The best ended sequence, the live ones ranked too where fewer than beam_size
        ended (OpenAI's finalize); ties go to the first collected."""
        ranked = dict(self.ended)
        for beam in self.beams:  # most probable first
            if len(ranked) >= options.beam_size:
                break
            ranked.setdefault(beam.tokens, beam.sum_logprob)

        def score(item: tuple[tuple[int, ...], float]) -> float:
            tokens, logprob = item
            ended = bool(tokens) and tokens[-1] in stop
            return options.ranking_score(logprob, len(tokens) - ended)

        # Empty only where the rules forbade every token from the start.
        return max(ranked.items(), key=score) if ranked else ((), 0.0)


def beam_search(
    target: BranchingTarget,
    prompt_ids: Sequence[Sequence[int]] | torch.Tensor,
    options: BeamOptions,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """Each prompt's best sequence of at most max_new_tokens new tokens (ending with the stop
    token where it ended). `target` must take len(prompt_ids) * beam_size rows, each prompt's
    consecutive (a `asr.whisper_target.WhisperTarget` with group=beam_size); sum_logprobs are
    the chosen sequences'. stats count one target call per prompt and step."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
    device = target.device
    prompts = _as_rows(prompt_ids, device)
    size = options.beam_size
    stop = set(_stop_ids(eos_token_id, device).tolist())
    searches = [
        _Prompt(index, len(prompt), [_Hypothesis((), 0.0, 0)])
        for index, prompt in enumerate(prompts)
    ]
    results: list[tuple[tuple[int, ...], float]] = [((), 0.0)] * len(prompts)
    started, calls = device_clock(device), 0
    target.reset()
    with torch.inference_mode():
        logits = target.score(*_prompt_block(prompts, size, device), keep=1)[:, -1]
        while True:
            calls += len(searches)
            top = logits.float().log_softmax(dim=-1).topk(size + 1, dim=-1)
            values, ids = top.values.tolist(), top.indices.tolist()
            kept: list[tuple[_Prompt, int, list[tuple[int, int, int, int]]]] = []
            for place, search in enumerate(searches):
                first_row = place * size
                offered = [
                    ((*beam.tokens, token), beam.sum_logprob + logprob, beam)
                    for beam in search.beams
                    for logprob, token in zip(
                        values[first_row + beam.slot], ids[first_row + beam.slot], strict=True
                    )
                    if logprob > -math.inf  # a token the rules forbid is never a candidate
                ]
                offered.sort(key=lambda candidate: candidate[1], reverse=True)
                copies = _advance(search, offered, options, stop)
                if (
                    len(search.ended) >= options.candidates
                    or not search.beams
                    or len(search.beams[0].tokens) >= max_new_tokens
                ):
                    results[search.index] = search.result(options, stop)
                else:
                    kept.append((search, place, copies))
            if not kept:
                break
            if len(kept) < len(searches):
                rows = [place * size + slot for _, place, _ in kept for slot in range(size)]
                target.keep_rows(torch.tensor(rows, dtype=torch.long, device=device))
            searches = [search for search, _, _ in kept]
            groups = [(place * size, copies) for place, (_, _, copies) in enumerate(kept)]
            _copy(target, groups, len(searches) * size, device)
            logits = target.score(*_step_block(searches, size, device), keep=1)[:, -1]
    tokens = tuple(tokens for tokens, _ in results)
    stats = DecodeStats(
        target_calls=calls,
        generated_tokens=sum(len(t) for t in tokens),
        verify_seconds=device_clock(device) - started,
    )
    return GenerationResult(tokens, tuple(logprob for _, logprob in results), stats)


def _advance(
    search: _Prompt,
    offered: list[tuple[tuple[int, ...], float, _Hypothesis]],
    options: BeamOptions,
    stop: set[int],
) -> list[tuple[int, int, int, int]]:
    """Keeps the beam_size likeliest unended candidates as the next hypotheses and collects
    the ended ones (`offered` most probable first). Returns the copies that seat them: (slot,
    slot it copies, first and end position of the parent's generated tokens)."""
    size = options.beam_size
    following: list[tuple[tuple[int, ...], float, _Hypothesis]] = []
    for tokens, logprob, parent in offered:
        if tokens[-1] in stop:
            if len(search.ended) < options.candidates:
                search.ended[tokens] = logprob
        else:
            following.append((tokens, logprob, parent))
            if len(following) == size:
                break  # stop tokens ranked below the last kept hypothesis are not collected
    # A parent's first child stays in its row; further children take rows whose hypothesis
    # has died, with a copy of their parent's generated positions.
    seated: dict[int, int] = {}  # parent slot -> child index
    for child, (_, _, parent) in enumerate(following):
        seated.setdefault(parent.slot, child)
    free = iter(sorted(set(range(size)) - set(seated)))
    beams, copies = [], []
    for child, (tokens, logprob, parent) in enumerate(following):
        if seated[parent.slot] == child:
            slot = parent.slot
        else:
            slot = next(free)
            copies.append((slot, parent.slot, search.length, search.length + len(parent.tokens)))
        beams.append(_Hypothesis(tokens, logprob, slot))
    search.beams = beams
    return copies


def _copy(
    target: BranchingTarget,
    groups: list[tuple[int, list[tuple[int, int, int, int]]]],
    rows: int,
    device: torch.device,
) -> None:
    """groups: each group's first row and its copies (`_advance`'s, slots within the group);
    rows: the batch's."""
    copies = [
        (first + slot, first + from_slot, start, stop)
        for first, moves in groups
        for slot, from_slot, start, stop in moves
    ]
    if not copies:
        return
    source = torch.arange(rows, device=device)
    starts = torch.zeros(rows, dtype=torch.long, device=device)
    stops = torch.zeros(rows, dtype=torch.long, device=device)
    for row, from_row, start, stop in copies:
        source[row], starts[row], stops[row] = from_row, start, stop
    target.copy_positions(source, starts, stops)


def _prompt_block(prompts: list[torch.Tensor], size: int, device) -> tuple[torch.Tensor, ...]:
    """Every prompt beam_size times, right-aligned (left padding masked out)."""
    width = max(len(prompt) for prompt in prompts)
    rows = len(prompts) * size
    tokens = torch.full((rows, width), PAD, dtype=torch.long, device=device)
    positions = torch.zeros((rows, width), dtype=torch.long, device=device)
    mask = torch.zeros((rows, width), dtype=torch.bool, device=device)
    for index, prompt in enumerate(prompts):
        rows_of = slice(index * size, (index + 1) * size)
        tokens[rows_of, width - len(prompt) :] = prompt
        positions[rows_of, width - len(prompt) :] = torch.arange(len(prompt), device=device)
        mask[rows_of, width - len(prompt) :] = True
    return tokens, positions, mask


def _step_block(searches: list[_Prompt], size: int, device) -> tuple[torch.Tensor, ...]:
    """Each row's newest token at its position. A row without a hypothesis (fewer candidates
    than beam_size survived the rules) repeats its group's first, whose results it ignores."""
    tokens, positions = [], []
    for search in searches:
        by_slot = {beam.slot: beam for beam in search.beams}
        for slot in range(size):
            beam = by_slot.get(slot, search.beams[0])
            tokens.append(beam.tokens[-1])
            positions.append(search.length + len(beam.tokens) - 1)
    tokens_t = torch.tensor(tokens, dtype=torch.long, device=device)[:, None]
    positions_t = torch.tensor(positions, dtype=torch.long, device=device)[:, None]
    return tokens_t, positions_t, torch.ones_like(tokens_t, dtype=torch.bool)

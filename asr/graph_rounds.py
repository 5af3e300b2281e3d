"""Greedy decoding of a batch of windows in whole rounds on the device, drafted or not.

On a GPU, a decoder step of a model the size of whisper-base is a few hundred small kernels, and
`decoding.generate` launches as many again around each step (the logit rules, the acceptance,
the commit) and reads results back on the host: a token costs milliseconds of launches where
its arithmetic costs a fraction of one. Capturing the decoder alone (`asr.cuda_graphs`) leaves
the rest. Here a whole round runs on static buffers and reads nothing on the host:

1. without a draft: the target's step on each row's last token;
   with one: k draft steps (each an argmax of the draft's logits with its suppressed ids
   masked, or under its whole rules), then the target's verification of each row's last token
   and its k drafted tokens in one exact-mode call;
2. the target's logit rules at every position, each with its own generated prefix
   (`asr.logit_rules.Prefixes`, advanced token by token on the device);
3. greedy acceptance, cut at the end token and at the row's token budget; the committed tokens,
   their log-probabilities and the rules' prefix state are written in place.

So a round is recorded once as one CUDA graph per pool of rows and replayed; the host reads,
one round behind, a single flag: whether every row has stopped, or, while windows wait for a
row, whether some row has. A row that stopped commits nothing more while the others go on; a
waiting window then takes its row (its prompt scored alone), so a long window holds back no
row but its own. Without CUDA (`capture` False) the same round runs eagerly on the same
buffers, which is how the CPU tests check it.

At whisper-base's size a round costs what its kernels cost to launch, and the k draft steps
are a third of them (docs/gpu.md). `fused` compiles the draft's k steps into one function
with torch.compile (inductor: layer norms, residual adds, masks, softmaxes and the head's
argmax fused into few kernels), and likewise the rule state advanced token by token for every
drafted column and again in the commit (integer arithmetic, so its results are exact), before
the round is recorded; a fused round then runs outside inference mode, which torch.compile
cannot trace. Only what the draft proposes can change with it, never what is committed: the
target's own arithmetic is not compiled, and it verifies every token.

What it computes is `asr.window_decoder`'s greedy decoding of the same windows: the same first
call over each row's whole prompt (its last position gives the first token, its
<|startoftranscript|> the no-speech probability), then steps in the decoder's exact mode
(over every cache slot where a graph records them), whose product shapes do not depend on the
block or the batch. Drafted and plain rounds thus score a position with the same operations,
and with row-invariant kernels (CPUs) with the same bits; on a GPU the linear kernels may pick
other tiles for a block of k + 1 rows than for one, which `tests/test_cuda.py` and
`bench.batch_sweep` check on real speech. Sampling, and drafts that need a tokenizer bridge,
stay on `decoding.generate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from asr.cuda_graphs import StepGraphs, pool_size
from asr.logit_rules import DRAFT_GRAMMAR, LogitRules, Prefixes
from asr.whisper import EncodedAudio, WhisperModel
from decoding import DecodeStats


def default_draft_tokens(rows: int) -> int:
    """Drafted tokens per round for a pool of `rows` rows: 3 up to 8 rows, 2 up to 16, then 1.

    From the batch sweep on an H200 (whisper-base and its 2-layer draft; docs/gpu.md): fewer
    the more rows, as a draft step costs more with more rows and the slowest row sets the
    number of rounds. (What rules the draft applies: asr.logit_rules.DRAFT_GRAMMAR.)"""
    return 3 if rows <= 8 else 2 if rows <= 16 else 1


@dataclass(frozen=True)
class GreedyWindows:
    """Each row's generated tokens (ending with <|endoftext|> where the row stopped at it), the
    sum of their rule-masked log-probabilities, P(<|nospeech|>) at its start, and counts."""

    tokens: tuple[tuple[int, ...], ...]
    sum_logprobs: tuple[float, ...]
    no_speech_probs: tuple[float, ...]
    stats: DecodeStats


class RoundGraphs:
    """A pool of `size` rows decoded in rounds (module docstring); `draft_tokens` drafted per
    round (0: plain steps, no draft). draft_grammar: the draft applies the whole of its rules
    to what it proposes; False: only the suppressed ids, which saves a few dozen small kernels
    per draft step and may cost acceptance where the grammar decides (verification applies the
    target's whole rules either way, so the output is the same). fused: the draft's steps and the
    rule-state bookkeeping compiled (module docstring; the draft masking its suppressed ids)."""

    def __init__(
        self,
        target: WhisperModel,
        rules: LogitRules,
        size: int,
        draft: WhisperModel | None = None,
        draft_tokens: int = 0,
        capture: bool = True,
        draft_grammar: bool = DRAFT_GRAMMAR,
        every_slot: bool | None = None,
        fused: bool = False,
    ) -> None:
        if (draft is None) != (draft_tokens == 0):
            raise ValueError("a draft needs draft_tokens >= 1, and draft_tokens a draft")
        if fused and (draft is None or draft_grammar):
            raise ValueError("fused rounds need a draft that masks only its suppressed ids")
        # Buffers are ordinary tensors even when made in inference mode (decoding runs in it):
        # a compiled function (fused) cannot take inference tensors.
        with torch.inference_mode(False):
            self._allocate(target, rules, size, draft, draft_tokens, capture, every_slot)
        self.draft_grammar, self.fused = draft_grammar, fused
        self._fused_draft = self._compile_draft() if fused else None
        self._fused_chain = self._compile_chain() if fused else None

    def _allocate(
        self,
        target: WhisperModel,
        rules: LogitRules,
        size: int,
        draft: WhisperModel | None,
        draft_tokens: int,
        capture: bool,
        every_slot: bool | None,
    ) -> None:
        """The pool's models, rules and static buffers."""
        self.target, self.rules, self.size, self.capture = target, rules, size, capture
        self.draft, self.draft_tokens = draft, draft_tokens
        self.draft_rules = None
        if draft is not None:
            self.draft_rules = LogitRules(draft.special, draft.suppress_tokens, rules.timestamps)
        device = target.device
        width = draft_tokens + 1
        self.max_context = target.max_context
        self._target_rows = StepGraphs(target, size, capture=False)  # buffers, uncaptured
        self._draft_rows = None if draft is None else StepGraphs(draft, size, capture=False)
        # Positions up to max_context + width: a row near its budget commits nothing there,
        # but its masked writes need a column of their own.
        long = {"dtype": torch.long, "device": device}
        self.history = torch.zeros((size, self.max_context + width + 1), **long)
        self.lengths = torch.full((size,), 2, **long)  # tokens committed, prompt included
        self.budget_end = torch.full((size,), 2, **long)  # length at which a row must stop
        self.done = torch.ones(size, dtype=torch.bool, device=device)
        self.occupied = torch.zeros(size, dtype=torch.bool, device=device)  # holds a window
        self.all_done = torch.ones((), dtype=torch.bool, device=device)
        self.any_finished = torch.zeros((), dtype=torch.bool, device=device)  # done & occupied
        self.sum_logprobs = torch.zeros(size, dtype=torch.float64, device=device)
        self.prefixes = Prefixes.empty(size, device)
        self.accepted_counts = torch.zeros(width, **long)  # [n]: row-rounds accepting n
        self._columns = torch.arange(width, **long)
        self._every_row = torch.ones(size, dtype=torch.bool, device=device)
        self._graph: torch.cuda.CUDAGraph | None = None
        # Steps attend to every cache slot where a graph may record them (CUDA, captured or
        # not, so both compute alike); on a CPU they read the positions to attend to fewer.
        self.every_slot = device.type == "cuda" if every_slot is None else every_slot
        if capture and not self.every_slot:
            raise ValueError("a captured round attends to every slot")

    @torch.inference_mode()
    def decode(
        self,
        encoded: EncodedAudio,
        prompts: tuple[tuple[int, ...], ...],
        max_new_tokens: int,
        draft_encoded: EncodedAudio | None = None,
    ) -> GreedyWindows:
        """Greedy decoding of the windows, one per prompt (each ending in the same SOT
        sequence); draft_encoded: the draft's view of them (with a draft).

        The pool's rows take the first `size` windows; a row whose window stops takes the next
        one waiting (its prompt scored alone), so with more windows than rows a long window
        holds no row but its own, and rounds stay full."""
        windows = len(prompts)
        if windows < 1:
            raise ValueError("decode needs at least one window")
        if (draft_encoded is None) != (self.draft is None):
            raise ValueError("draft_encoded goes with a draft, and only with one")
        if self.capture and self._graph is None:
            self._record()  # before the state is loaded: recording runs rounds
        started = time.perf_counter()
        first = min(windows, self.size)
        window_of_row: list[int | None] = [*range(first), *[None] * (self.size - first)]
        no_speech = list(self._start(encoded, draft_encoded, prompts[:first], max_new_tokens))
        no_speech += [0.0] * (windows - first)
        waiting = list(range(windows - 1, first - 1, -1))  # popped from the end: in order
        results: list[tuple[tuple[int, ...], float]] = [((), 0.0)] * windows
        rounds = prompt_calls = 0
        while any(window is not None for window in window_of_row):
            rounds += self._run_rounds(max_new_tokens, until_any=bool(waiting))
            # One read of each per harvest (each read waits for the device).
            done, sums = self.done.tolist(), self.sum_logprobs.tolist()
            lengths = self.lengths.tolist()
            for row, window in enumerate(window_of_row):
                if window is None or not done[row]:
                    continue
                tokens = tuple(self.history[row, len(prompts[window]) : lengths[row]].tolist())
                results[window] = (tokens, sums[row])
                window_of_row[row] = None
                self.occupied[row] = False
                if waiting:
                    window = waiting.pop()
                    no_speech[window] = self._start_row(
                        row, window, encoded, draft_encoded, prompts[window], max_new_tokens
                    )
                    window_of_row[row] = window
                    prompt_calls += 1
        tokens, sums = zip(*results, strict=True)
        stats = DecodeStats(
            target_calls=1 + prompt_calls + rounds,
            draft_calls=rounds * self.draft_tokens,
            accepted_histogram=tuple(self.accepted_counts.tolist()),
            generated_tokens=sum(map(len, tokens)),
            # A round's draft steps and verification are one graph: timed together.
            verify_seconds=time.perf_counter() - started,
        )
        return GreedyWindows(tokens, sums, tuple(no_speech), stats)

    def _start(
        self,
        encoded: EncodedAudio,
        draft_encoded: EncodedAudio | None,
        prompts: tuple[tuple[int, ...], ...],
        max_new_tokens: int,
    ) -> tuple[float, ...]:
        """Loads the first windows into rows 0.. (the rest repeat the last, stopped), scores
        every row's whole prompt (as `decoding.generate`'s first call, right-aligned), commits
        each row's first token; returns P(<|nospeech|>) per window."""
        device, rows = self.target.device, len(prompts)
        longest = max(map(len, prompts))
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        history = torch.zeros((rows, longest), dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            history[row, : len(prompt)] = torch.tensor(prompt, device=device)
        positions = lengths[:, None] + torch.arange(-longest, 0, device=device)
        valid = positions >= 0
        positions = positions.clamp(min=0)
        tokens = history.gather(1, positions)
        mask = None if bool(valid.all()) else valid

        self._target_rows.load(_first_rows(encoded, rows).cross)
        # The target's prompts as `decoding.generate` scores them (exact where it can be).
        exact = self.target.exact_steps
        states = self._target_rows.forward(tokens, positions, mask, exact=exact)
        if self._draft_rows is not None:
            self._draft_rows.load(_first_rows(draft_encoded, rows).cross)
            self._draft_rows.forward(tokens, positions, mask)
        first, probs = self._prompt_logits(tokens, valid, states)

        def padded(tensor: torch.Tensor) -> torch.Tensor:  # the pool's rows: the last repeated
            return torch.cat([tensor, tensor[-1:].expand(self.size - rows, *tensor.shape[1:])])

        self.history.zero_()
        self.history[:, :longest] = padded(history)
        self.lengths.copy_(padded(lengths))
        self.budget_end.copy_(self.lengths + max_new_tokens)
        self.occupied.copy_(torch.arange(self.size, device=device) < rows)
        self.done.copy_(~self.occupied)
        self.sum_logprobs.zero_()
        self.prefixes.assign(Prefixes.empty(self.size, device))
        self.accepted_counts.zero_()
        self._commit_first(padded(first), self.occupied)
        return tuple(probs.tolist())

    def _start_row(
        self,
        row: int,
        window: int,
        encoded: EncodedAudio,
        draft_encoded: EncodedAudio | None,
        prompt: tuple[int, ...],
        max_new_tokens: int,
    ) -> float:
        """Loads one window into a row whose window stopped, scores its prompt alone and
        commits its first token; returns its P(<|nospeech|>)."""
        device = self.target.device
        tokens = torch.tensor([prompt], device=device)
        positions = torch.arange(len(prompt), device=device)[None]
        states = _score_in_row(
            self._target_rows, row, encoded, window, tokens, positions, self.target.exact_steps
        )
        if self._draft_rows is not None:
            _score_in_row(self._draft_rows, row, draft_encoded, window, tokens, positions)
        every = torch.ones_like(tokens, dtype=torch.bool)
        first, probs = self._prompt_logits(tokens, every, states)

        self.history[row].zero_()
        self.history[row, : len(prompt)] = tokens[0]
        self.lengths[row] = len(prompt)
        self.budget_end[row] = len(prompt) + max_new_tokens
        self.done[row], self.occupied[row] = False, True
        self.sum_logprobs[row] = 0.0
        self.prefixes.assign(Prefixes.empty(1, device), row)
        logits = first.new_zeros((self.size, first.shape[-1]))
        logits[row] = first[0]
        self._commit_first(logits, torch.arange(self.size, device=device) == row)
        return float(probs[0])

    def _prompt_logits(
        self, tokens: torch.Tensor, valid: torch.Tensor, states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A prompt call's logits for each row's first token (its last column) and its
        P(<|nospeech|>) (at its <|startoftranscript|>, before any rule, as OpenAI), from one head
        call over both. Shapes: (rows, vocab), (rows,)."""
        target, rows = self.target, tokens.shape[0]
        at_sot = (tokens == target.special.sot) & valid
        if not bool(at_sot.any(dim=1).all()):
            raise ValueError("every prompt row needs a <|startoftranscript|> token")
        sot = states[torch.arange(rows, device=tokens.device), at_sot.int().argmax(dim=1)]
        logits = target.logits(torch.cat([states[:, -1:], sot[:, None]], dim=1))
        probs = logits[:, 1].float().softmax(dim=-1)[:, target.special.no_speech]
        return logits[:, 0], probs

    def _commit_first(self, logits: torch.Tensor, rows: torch.Tensor) -> None:
        """Commits the first token of these rows (Tensor[bool], shape = (size,)) from their
        prompt's logits, shape = (size, vocab)."""
        masked = self.rules.apply_prefixes(logits, self.prefixes, branch_free=True)
        choice = masked.argmax(dim=-1)
        self._commit(choice[:, None], masked[:, None], torch.zeros_like(choice), rows)

    def _run_rounds(self, max_new_tokens: int, until_any: bool) -> int:
        """Rounds until every row has stopped, or (until_any) until some row holding a window
        has; returns how many did work."""
        flag = self.any_finished if until_any else self.all_done
        if bool(flag):
            return 0
        if not self.capture:
            rounds = 0
            while not bool(flag):
                self._round()
                rounds += 1
            return rounds
        # The host waits for round n's flag only once round n + 1 is queued, so the device
        # never idles; the round queued after the flag went up commits nothing for rows that
        # had stopped, and what it commits for the others stands.
        flags = torch.zeros(2, dtype=torch.bool, pin_memory=True)
        events = [torch.cuda.Event(), torch.cuda.Event()]
        launched = 0
        while True:
            self._graph.replay()
            flags[launched % 2].copy_(flag, non_blocking=True)
            events[launched % 2].record()
            launched += 1
            if launched >= 2:
                events[launched % 2].synchronize()  # the round before this one
                if bool(flags[launched % 2]):
                    # Once every row has stopped, the round queued after the flag did nothing.
                    return launched if until_any else launched - 1
            if launched > max_new_tokens + 2:  # every round commits a token per live row
                raise RuntimeError("rounds went on past every row's token budget")

    def _record(self) -> None:
        """Records one round as a CUDA graph. Every row is marked stopped meanwhile, so the
        warm-up rounds change nothing but cache slots that a row rewrites before reading."""
        device = self.target.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # kernels pick their workspaces before the capture
            for _ in range(2):
                self._round()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._round()
        self._graph = graph

    def _round(self) -> None:
        """One round on the pool's buffers (module docstring); reads nothing on the host."""
        if not self.fused:
            self._round_steps()
            return
        with torch.inference_mode(False), torch.no_grad():
            self._round_steps()

    def _round_steps(self) -> None:
        """`_round`'s work, in the caller's mode."""
        k, size = self.draft_tokens, self.size
        begin = self.target.special.timestamp_begin
        proposals = self._draft() if k else self.lengths.new_empty((size, 0))
        last = self.history.gather(1, (self.lengths - 1)[:, None])
        tokens = torch.cat([last, proposals], dim=1)
        positions = (self.lengths - 1)[:, None] + self._columns
        states = self.target.runtime.compute(
            tokens,
            positions.clamp(max=self.max_context - 1),
            self._target_rows.cache,
            exact=True,
            every_slot=self.every_slot,
        )
        logits = self.target.compute_logits(states)
        # Each row's prefixes before each of its columns, row by row as the logits are.
        if self._fused_chain is None:
            columns = [self.prefixes]
            for column in range(k):
                columns.append(columns[-1].after(proposals[:, column], begin, self._every_row))
            prefixes = Prefixes.interleave(columns)
        else:
            take = self._every_row[:, None].expand(size, k)
            chained = self._fused_chain(*self.prefixes.tensors(), proposals, take)
            prefixes = Prefixes(*(field.flatten() for field in chained))
        vocab = logits.shape[-1]
        masked = self.rules.apply_prefixes(
            logits.reshape(-1, vocab), prefixes, branch_free=True
        ).reshape(size, k + 1, vocab)
        choice = masked.argmax(dim=-1)
        accepted = (proposals == choice[:, :k]).long().cumprod(dim=1).sum(dim=1)
        self._commit(choice, masked, accepted)

    def _draft(self) -> torch.Tensor:
        """k greedy draft tokens per row, Tensor, shape = (size, k). The first step rescores
        the row's last two committed tokens, so the draft's cache holds every committed
        position whether the last round accepted all of its tokens or not."""
        if self._fused_draft is not None:
            with torch.inference_mode(False), torch.no_grad():
                return self._fused_draft(self.history, self.lengths)
        draft, rules = self.draft, self.draft_rules
        begin = draft.special.timestamp_begin
        positions = (self.lengths - 2)[:, None] + self._columns[:2]
        tokens = self.history.gather(1, positions)
        prefixes, proposals = self.prefixes, []
        for _ in range(self.draft_tokens):
            states = draft.runtime.forward(
                tokens,
                positions.clamp(max=self.max_context - 1),
                self._draft_rows.cache,
                every_slot=self.every_slot,
            )
            logits = draft.logits(states[:, -1])
            if self.draft_grammar:
                token = rules.apply_prefixes(logits, prefixes, branch_free=True).argmax(dim=-1)
                prefixes = prefixes.after(token, begin, self._every_row)
            else:
                token = rules.suppress(logits).argmax(dim=-1)
            proposals.append(token)
            tokens, positions = token[:, None], positions[:, -1:] + 1
        return torch.stack(proposals, dim=1)

    def _compile_draft(self):
        """`_draft` (masking the suppressed ids) as one torch.compile'd function of the history
        and the lengths, traced outside inference mode, which torch.compile cannot trace."""
        draft, cache = self.draft, self._draft_rows.cache
        head = draft.output_head()  # made now: a traced function must not build modules
        device = self.history.device
        with torch.inference_mode(False):
            vocabulary = torch.arange(draft.config.vocab_size, device=device)
            if draft.output_vocabulary is not None:  # a reduced head scores only these ids
                vocabulary = torch.as_tensor(draft.output_vocabulary, device=device)
            blocked = torch.isin(vocabulary, self.draft_rules.suppressed_ids(device))
        pairs, max_position, k = self._columns[:2].clone(), self.max_context - 1, self.draft_tokens

        def draft_steps(history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            positions = (lengths - 2)[:, None] + pairs
            tokens = history.gather(1, positions)
            proposals = []
            for _ in range(k):
                # Every slot, masked: shapes that do not depend on the positions.
                states = draft.runtime.compute(
                    tokens, positions.clamp(max=max_position), cache, every_slot=True
                )
                scores = head(states[:, -1]).float().masked_fill(blocked, -torch.inf)
                token = vocabulary[scores.argmax(dim=-1)]
                proposals.append(token)
                tokens, positions = token[:, None], positions[:, -1:] + 1
            return torch.stack(proposals, dim=1)

        return torch.compile(draft_steps, fullgraph=True, dynamic=False)

    def _compile_chain(self):
        """`_prefix_chain` for this target's timestamps, compiled (integer arithmetic: exact)."""
        begin = self.target.special.timestamp_begin

        def chain(count, last, penultimate, last_timestamp, tokens, take):
            return _prefix_chain(count, last, penultimate, last_timestamp, tokens, take, begin)

        return torch.compile(chain, fullgraph=True, dynamic=False)

    def _commit(
        self,
        choice: torch.Tensor,
        masked: torch.Tensor,
        accepted: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> None:
        """Appends the accepted tokens of these rows (Tensor[bool], shape = (size,); None:
        every row not stopped), cut after the first end token and at the row's budget.
        choice: Tensor, shape = (size, width), the target's argmax at each column; masked: its
        rule-masked logits, shape = (size, width, vocab); accepted: drafted tokens each row
        accepted (choice[:, :accepted + 1] is what it commits)."""
        live = ~self.done if rows is None else rows
        width = choice.shape[1]
        columns = self._columns[:width]
        eot = self.target.special.eot
        count = accepted + 1
        stops = (choice == eot) & (columns < count[:, None])
        hit_stop = stops.any(dim=1)
        count = torch.where(hit_stop, stops.long().argmax(dim=1) + 1, count)
        count = torch.minimum(count, self.budget_end - self.lengths).masked_fill(~live, 0)
        take = columns < count[:, None]
        logprobs = masked.float().log_softmax(dim=-1).gather(-1, choice[..., None])[..., 0]
        logprobs = logprobs.masked_fill(~take, 0).double()
        for column in range(width):  # one at a time, as plain decoding adds them
            self.sum_logprobs += logprobs[:, column]
        at = self.lengths[:, None] + columns
        self.history.scatter_(1, at, torch.where(take, choice, self.history.gather(1, at)))
        if self._fused_chain is not None and not torch.is_inference_mode_enabled():
            chained = self._fused_chain(*self.prefixes.tensors(), choice, take)
            prefixes = Prefixes(*(field[:, -1] for field in chained))
        else:  # plain steps, a fused pool's prompts (in inference mode)
            prefixes = self.prefixes
            begin = self.target.special.timestamp_begin
            for column in range(width):
                prefixes = prefixes.after(choice[:, column], begin, take[:, column])
        self.prefixes.assign(prefixes)
        self.accepted_counts.index_add_(0, accepted, live.long())
        self.lengths += count
        self.done |= live & ((stops & take).any(dim=1) | (self.lengths >= self.budget_end))
        self.all_done.copy_(self.done.all())
        self.any_finished.copy_((self.done & self.occupied).any())


def rounds_for(
    target: WhisperModel,
    rules: LogitRules,
    rows: int,
    draft: WhisperModel | None,
    draft_tokens: int,
    draft_grammar: bool = DRAFT_GRAMMAR,
    fused: bool = False,
) -> RoundGraphs:
    """The target's pool of rounds for `rows` windows (the next power of two), made and
    recorded once per draft, draft length, draft rules, fused or not, and rules, then reused."""
    # Rules differ only in these fields for one target (its special tokens are its own).
    rule_key = (rules.suppress_tokens, rules.timestamps, rules.max_initial_timestamp_index)
    drafting = (id(draft), draft_tokens, draft_grammar, fused) if draft is not None else None
    key = (pool_size(rows), drafting, rule_key)
    pools = target.round_pools
    if key not in pools:
        capture = target.step_graphs_mode == "auto" and target.device.type == "cuda"
        pools[key] = RoundGraphs(
            target,
            rules,
            key[0],
            draft,
            draft_tokens if draft is not None else 0,
            capture=capture,
            draft_grammar=draft_grammar,
            fused=fused and draft is not None,
        )
    return pools[key]


def _prefix_chain(count, last, penultimate, last_timestamp, tokens, take, timestamp_begin):
    """Prefixes (given as their four fields) advanced through each column of `tokens` where
    `take` (both Tensor, shape = (rows, n)): each field before every column and after the
    last, Tensor, shape = (rows, n + 1), in `Prefixes.tensors`' order."""
    chain = [Prefixes(count, last, penultimate, last_timestamp)]
    for column in range(tokens.shape[1]):
        chain.append(chain[-1].after(tokens[:, column], timestamp_begin, take[:, column]))
    fields = zip(*(prefixes.tensors() for prefixes in chain), strict=True)
    return tuple(torch.stack(field, dim=1) for field in fields)


def _first_rows(encoded: EncodedAudio, rows: int) -> EncodedAudio:
    """The first `rows` windows of `encoded` (views, no copy)."""
    return encoded.rows(torch.arange(rows, device=encoded.features.device))


def _score_in_row(
    pool: StepGraphs,
    row: int,
    encoded: EncodedAudio,
    window: int,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    exact: bool = False,
) -> torch.Tensor:
    """Puts window `window` of `encoded` into one row of a pool's cache and scores a prompt
    there (tokens, positions: shape = (1, n)), in exact mode or fast (`asr.static_decoder`);
    returns its states, shape = (1, n, d_model)."""
    cache = pool.cache.row(row)
    for index, (keys, values) in enumerate(encoded.cross):
        cache.cross_keys[index][0].copy_(keys[window].transpose(-1, -2))
        cache.cross_values[index][0].copy_(values[window])
    return pool.model.runtime.forward(tokens, positions, cache, exact=exact)

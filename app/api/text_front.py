"""The text front of `specscribe serve`: one causal LM and its drafter, loaded at start, and one
completion at a time on them, with stop strings and incremental text for streaming.

`--text-assistant` names the drafter as `specscribe generate` takes it: none, prompt-lookup
(4 tokens, or prompt-lookup:N), early-exit:L, or a draft model's name (another tokenizer is
re-encoded). Greedy output is the target's own greedy output, token for token, whatever the
drafter, so a temperature-0 completion equals `specscribe generate --model NAME PROMPT`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from asr.models import ModelRegistry
from decoding import DecodeStats, SamplingOptions

from ..llm import (
    DraftOptions,
    LanguageModel,
    PolicyName,
    chat_prompt_ids,
    check_drafted_target,
    check_early_exit,
    load_language_model,
    prompt_ids,
    run_generation_ids,
)

FinishReason = Literal["stop", "length"]
PROMPT_LOOKUP_TOKENS = 4  # `--text-assistant prompt-lookup` without :N


def draft_options(
    spec: str, policy: PolicyName = "heuristic", flag: str = "--text-assistant"
) -> DraftOptions:
    """--text-assistant -> DraftOptions: none | prompt-lookup[:N] | early-exit:L | NAME;
    `flag`: the option errors name (`generate` takes the same words as --assistant)."""
    kind, _, count = spec.partition(":")
    if spec in ("", "none"):
        return DraftOptions(policy=policy).validate()
    if kind in ("prompt-lookup", "early-exit"):
        if kind == "early-exit" and not count:
            raise ValueError(f"{flag} early-exit needs a layer count: early-exit:L")
        if count and not count.isdigit():
            raise ValueError(f"{flag} {spec}: {count!r} is not a whole number")
        number = int(count) if count else PROMPT_LOOKUP_TOKENS
        key = "prompt_lookup" if kind == "prompt-lookup" else "early_exit"
        return DraftOptions(policy=policy, **{key: number}).validate()
    return DraftOptions(assistant=spec, policy=policy).validate()


@dataclass(frozen=True)
class Completion:
    """One finished completion. text: cut before a stop string; tokens: every generated token
    (the stop string's too: the model made them)."""

    text: str
    tokens: tuple[int, ...]
    prompt_tokens: int
    finish_reason: FinishReason
    stats: DecodeStats

    def stats_dict(self) -> dict[str, float | int | list[int]]:
        stats = self.stats
        return {
            "target_calls": stats.target_calls,
            "draft_calls": stats.draft_calls,
            "generated_tokens": stats.generated_tokens,
            "tokens_per_target_call": round(stats.tokens_per_target_call, 3),
            "accepted_histogram": list(stats.accepted_histogram),
            "draft_seconds": round(stats.draft_seconds, 3),
            "verify_seconds": round(stats.verify_seconds, 3),
        }


class StopScanner:
    """Text of the tokens so far: where a stop string ends it, and how much is safe to send.

    decode: token ids -> text. Text held back from `fresh()`: a tail that could begin a stop
    string, and an incomplete UTF-8 character (decoded as U+FFFD).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> None:
        self.decode = decode
        self.stops = [stop for stop in stops if stop]
        self.tokens: list[int] = []
        self.text = ""
        self.stopped = False
        self.stopped_after = 0  # once stopped: how many tokens it took for a stop to appear
        self.sent = 0

    def feed(self, tokens: Sequence[int]) -> bool:
        """Adds tokens; True once a stop string appeared (the text then ends before it)."""
        before = len(self.tokens)
        self.tokens.extend(tokens)
        text = self.decode(self.tokens)
        if (cut := self._stop_at(text)) is not None:
            text, self.stopped = text[:cut], True
            # A drafted block comes whole: the first of its tokens that completes a stop.
            self.stopped_after = next(
                count
                for count in range(before + 1, len(self.tokens) + 1)
                if self._stop_at(self.decode(self.tokens[:count])) is not None
            )
        self.text = text
        return self.stopped

    def _stop_at(self, text: str) -> int | None:
        """Where the first stop string in `text` starts, or None where none does."""
        found = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        return min(found) if found else None

    def fresh(self, final: bool = False) -> str:
        """Text not sent yet that no later token can change (all of it when `final`)."""
        end = len(self.text)
        if not final:
            end -= self._held_back()
        if end <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : end], end
        return piece

    def cut_short(self) -> None:
        """Generation stopped at its token limit: a character whose bytes the next tokens
        would have completed (its U+FFFD) is dropped rather than sent as a broken one."""
        self.text = self.text.rstrip("\ufffd")

    def _held_back(self) -> int:
        text = self.text
        pending = len(text) - len(text.rstrip("\ufffd"))
        text = text[: len(text) - pending]
        partial = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:size]):
                    partial = max(partial, size)
                    break
        return pending + partial


class TextFront:
    """A loaded text LM, its drafter options (and draft model), used one request at a time."""

    def __init__(
        self,
        target: LanguageModel,
        options: DraftOptions,
        assistant: LanguageModel | None = None,
        drafter_name: str = "none",
    ) -> None:
        self.target = target
        self.options = options
        self.assistant = assistant
        self.drafter_name = drafter_name
        self._lock = threading.Lock()  # the model's caches are not re-entrant

    @classmethod
    def load(
        cls, registry: ModelRegistry, model: str, drafter: str = "none", policy: str = "heuristic"
    ) -> TextFront:
        options = draft_options(drafter, policy)  # type: ignore[arg-type]
        check_drafted_target(model, options)
        target = load_language_model(registry, model)
        # Refused as the server starts, not as every request's fault once it runs.
        check_early_exit(target, options.early_exit)
        assistant = (
            load_language_model(registry, options.assistant, loaded=target)
            if options.assistant
            else None
        )
        return cls(target, options, assistant, drafter or "none")

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def context(self) -> int | None:
        """The most tokens prompt and completion may hold together (`app.llm.context_limit`)."""
        from ..llm import context_limit

        return context_limit(self.target)[0]

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.target.tokenizer, "chat_template", None))

    def prompt_ids(self, prompt: str) -> list[int]:
        """As `specscribe generate` tokenizes a prompt (with the model's BOS, if any)."""
        return prompt_ids(self.target, prompt)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The messages through the model's chat template, ready for the assistant's turn."""
        return chat_prompt_ids(self.target, messages)

    def complete(
        self,
        prompt: list[int],
        max_tokens: int,
        sampling: SamplingOptions | None,
        stops: Sequence[str] = (),
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        """Generates up to `max_tokens` after `prompt` (greedy when `sampling` is None); ends
        early at EOS or a stop string. on_text: each piece of text as it becomes final (their
        concatenation is the completion's text). ValueError for a prompt too long."""
        tokenizer = self.target.tokenizer
        scanner = StopScanner(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), stops)

        def on_step(new: tuple[tuple[int, ...], ...]) -> bool:
            stopped = scanner.feed(new[0])
            if on_text is not None and (piece := scanner.fresh()):
                on_text(piece)
            return stopped

        with self._lock:
            result = run_generation_ids(
                self.target,
                [prompt],
                self.options,
                self.assistant,
                sampling,
                max_new_tokens=max_tokens,
                on_step=on_step,
            )
        tokens = result.tokens[0]
        if scanner.stopped:
            # A drafted block is committed whole: tokens after the one that completed a stop
            # string are not the completion's (usage counted them, so a drafter changed it).
            tokens = tokens[: scanner.stopped_after]
        ended = scanner.stopped or (bool(tokens) and tokens[-1] == tokenizer.eos_token_id)
        if not ended:
            scanner.cut_short()
        if on_text is not None and (piece := scanner.fresh(final=True)):
            on_text(piece)
        return Completion(
            text=scanner.text,
            tokens=tokens,
            prompt_tokens=len(prompt),
            finish_reason="stop" if ended else "length",
            stats=result.stats,
        )

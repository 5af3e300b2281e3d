"""Whisper token ids <-> text with the special tokens as markers, for drafts whose vocabulary
differs from the target's (CrossTokenizerDrafter carries committed tokens across as text).

Special tokens are mapped by their meaning, never by their id: timestamp i is written
"<|0.02*i|>" in every vocabulary, end of text, start of transcript and of previous text, no
timestamps and no speech have one marker each. The language and task tokens only exist in
multilingual vocabularies, so they are written as nothing and the marker of
<|startoftranscript|> stands for the whole SOT prefix: encoding it gives this model's own
<|startoftranscript|>, language and task tokens (English-only: just the first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from asr.whisper import WhisperModel

_MARKER = re.compile(r"(<\|[^|<>]*\|>)")
_SOT = "<|startoftranscript|>"
N_TIMESTAMPS = 1501  # 0.00 .. 30.00 s in 0.02 s steps


class WhisperTextCodec:
    """encode(text) -> ids and decode(ids) -> text that round-trip: decode(encode(s)) == s for
    every s that this or another Whisper vocabulary's codec decodes to.

    language, task: what <|startoftranscript|> expands to in a multilingual vocabulary.
    """

    def __init__(self, model: WhisperModel, language: str | None, task: str) -> None:
        special = model.special
        self.tokenizer = model.tokenizer
        self.eot = special.eot
        begin = special.timestamp_begin
        self.markers: dict[int, str] = {
            special.eot: "<|endoftext|>",
            special.sot: _SOT,
            special.sot_prev: "<|startofprev|>",
            special.no_timestamps: "<|notimestamps|>",
            special.no_speech: "<|nospeech|>",  # <|nocaptions|> in English-only vocabularies
            **{begin + i: f"<|{i * 0.02:.2f}|>" for i in range(N_TIMESTAMPS)},
        }
        self.ids: dict[str, list[int]] = {marker: [i] for i, marker in self.markers.items()}
        sot_prefix = model.sot_sequence(language, task, timestamps=True)
        self.ids[_SOT] = sot_prefix  # [sot] or [sot, language, task]

    def decode(self, ids: Sequence[int]) -> str:
        """Text runs through the tokenizer, special tokens as markers (or nothing)."""
        parts, run = [], []
        for token in ids:
            if token < self.eot:
                run.append(token)
                continue
            if run:
                parts.append(self.tokenizer.decode(run))
                run = []
            parts.append(self.markers.get(token, ""))
        if run:
            parts.append(self.tokenizer.decode(run))
        return "".join(parts)

    def encode(self, text: str) -> list[int]:
        """Text between markers is encoded on its own, as Whisper never merges text across a
        special token; a marker this vocabulary has no token for is dropped."""
        ids: list[int] = []
        for part in _MARKER.split(text):
            if _MARKER.fullmatch(part):
                ids.extend(self.ids.get(part, ()))
            elif part:
                ids.extend(self.tokenizer.encode(part, add_special_tokens=False))
        return ids

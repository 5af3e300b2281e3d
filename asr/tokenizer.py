"""Whisper's tokenizer for transcription, on the `tokenizers` library alone.

transformers' WhisperTokenizer wraps the same `tokenizer.json`; importing transformers costs a
`specscribe transcribe` run about three seconds, so transcription reads the file directly. The
two agree on every text token sequence (`tests/test_whisper_checkpoint.py`); like transformers,
`decode` leaves timestamp tokens out.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# Parsed tokenizer.json files by the sha256 of their bytes: models of one process often ship the
# same file (a service per precision, a full Whisper draft of the same family), and parsing one
# costs about 0.1 s, hashing its bytes 3 ms. (A distilled draft shares its target's tokenizer.)
_PARSED: dict[str, object] = {}
# The same files parsed again to read special-token markup as plain text (`encode_text`).
_PARSED_AS_TEXT: dict[str, object] = {}


class WhisperTokenizer:
    """The part of transformers' WhisperTokenizer that transcription uses."""

    def __init__(self, path: str | Path) -> None:
        """path: a directory holding tokenizer.json."""
        from tokenizers import Tokenizer

        file = Path(path) / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"{path} holds no tokenizer.json")
        data = file.read_bytes()
        self.digest = hashlib.sha256(data).hexdigest()  # equal digests: the same vocabulary
        if self.digest not in _PARSED:
            try:
                _PARSED[self.digest] = Tokenizer.from_str(data.decode("utf-8"))
            except Exception as error:  # tokenizers raises a plain Exception
                raise ValueError(f"{file} cannot be read: {error}") from None
        self._tokenizer = _PARSED[self.digest]
        self._data = data
        no_timestamps = self._tokenizer.token_to_id("<|notimestamps|>")
        self._timestamp_begin = None if no_timestamps is None else no_timestamps + 1

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The id of a token (special ones included), None when the vocabulary lacks it."""
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_text(self, text: str) -> list[int]:
        """`text` as a user wrote it (a prompt, hotwords): markup such as "<|en|>",
        "<|endoftext|>" or "<|0.00|>" is encoded as the characters it is written with, never
        as the control token (it switched the language or task of a transcription, and a
        prompt of timestamp tokens made Whisper time whole seconds; OpenAI's tokenizer refuses
        such text)."""
        import json

        from tokenizers import Tokenizer

        if self.digest not in _PARSED_AS_TEXT:  # parsed on first use: most runs have no prompt
            config = json.loads(self._data)
            # Whisper's timestamp tokens are added tokens not marked special, which
            # encode_special_tokens would still read as tokens: every "<|...|>" one is marked.
            for token in config.get("added_tokens", []):
                if token["content"].startswith("<|") and token["content"].endswith("|>"):
                    token["special"] = True
            as_text = Tokenizer.from_str(json.dumps(config))
            as_text.encode_special_tokens = True
            _PARSED_AS_TEXT[self.digest] = as_text
        return _PARSED_AS_TEXT[self.digest].encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if self._timestamp_begin is not None:
            ids = [i for i in ids if i < self._timestamp_begin]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab()

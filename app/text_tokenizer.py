"""A text LLM's tokenizer on the `tokenizers` library alone.

transformers' AutoTokenizer for Gemma 3 spends seconds per load rebuilding its 262k-token BPE
from tokenizer.json in Python (and `import transformers`' tokenizer modules on top); the Rust
`tokenizers.Tokenizer.from_file` reads the same file in a fraction of that. Both run the same
normalizer, pre-tokenizer, model, post-processor and decoder from that file, so they agree token
for token (`tests/test_llm.py` checks real strings, special tokens and chat templates included),
as `asr.tokenizer` does for Whisper.

`read_tokenizer` returns None where the files ask for something this class does not do (no
tokenizer.json, or transformers' clean-up of decoded spaces), and `app.llm` then loads
transformers' tokenizer instead.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Encoding:
    """What `TextTokenizer(text)` returns: transformers' BatchEncoding's `input_ids` only."""

    input_ids: list[int]


class TextTokenizer:
    """The part of transformers' fast tokenizers (`TokenizersBackend`) that `app.llm` and the
    text front use: encode, decode, vocabulary, EOS id and the chat template."""

    def __init__(self, directory: Path, config: dict, chat_template: str | None) -> None:
        """directory: holds tokenizer.json; config: its tokenizer_config.json."""
        from tokenizers import Tokenizer

        self.directory = directory
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.chat_template = chat_template
        eos = config.get("eos_token")
        if isinstance(eos, dict):  # an AddedToken written out in full
            eos = eos.get("content")
        self.eos_token_id = None if eos is None else self._tokenizer.token_to_id(eos)

    def __call__(self, text: str, add_special_tokens: bool = True) -> Encoding:
        return Encoding(self.encode(text, add_special_tokens=add_special_tokens))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens: the post-processor's (Gemma's BOS)."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(
            [int(i) for i in ids], skip_special_tokens=skip_special_tokens
        )

    def added_tokens(self) -> dict:
        """Added tokens by id, each with its `special` flag (transformers' added_tokens_decoder)."""
        return self._tokenizer.get_added_tokens_decoder()

    def get_vocab(self) -> dict[str, int]:
        """Every token, added ones included (transformers' `get_vocab`)."""
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, str]], **options) -> str | list[int]:
        """transformers' own rendering, loaded on first use: a template is Jinja run with the
        helpers transformers defines, and only chat requests to the text front need it."""
        return self._transformers.apply_chat_template(messages, **options)

    @functools.cached_property
    def _transformers(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.directory)


def read_tokenizer(directory: str | Path) -> TextTokenizer | None:
    """The tokenizer of a model directory, or None where transformers' own is needed (module
    docstring). Loaded once per directory and process: a model and its int8 draft share it."""
    return _read(Path(directory).resolve())


@functools.lru_cache(maxsize=8)
def _read(directory: Path) -> TextTokenizer | None:
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if not (directory / "tokenizer.json").is_file() or config.get("clean_up_tokenization_spaces"):
        return None
    template_file = directory / "chat_template.jinja"
    template = template_file.read_text() if template_file.is_file() else None
    return TextTokenizer(directory, config, template or config.get("chat_template"))

"""app.text_tokenizer reads the embedded LMs' tokenizers as transformers' AutoTokenizer does."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.text_tokenizer import TextTokenizer, read_tokenizer

pytestmark = pytest.mark.slow

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
# Real text: transcripts of the sample recordings, code, other scripts, whitespace runs,
# byte-fallback characters and special tokens written out in the text.
TEXTS = [
    *(path.read_text() for path in sorted(SAMPLES.glob("*.txt"))),
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)",
    "Zürich, Ελληνικά, 日本語のテキスト, emoji 🎙️ and  two  spaces\t\ttabs\n\n",
    "<bos>Hello<eos> <start_of_turn>user\nhi<end_of_turn> <|im_start|>assistant<|im_end|>",
    "",
]
MODELS = ["gemma-3-270m", "smollm2-135m"]


@pytest.fixture(scope="module", params=MODELS)
def pair(request, registry) -> tuple[TextTokenizer, object]:
    from transformers import AutoTokenizer

    path = registry.resolve(request.param)
    ours = read_tokenizer(path)
    assert isinstance(ours, TextTokenizer)
    return ours, AutoTokenizer.from_pretrained(path)


def test_encodes_as_transformers(pair):
    ours, theirs = pair
    for text in TEXTS:
        assert ours(text).input_ids == theirs(text).input_ids, text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(
            text, add_special_tokens=False
        ), text


def test_decodes_as_transformers(pair):
    ours, theirs = pair
    for text in TEXTS:
        ids = theirs(text).input_ids
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip
            ), text
    # ids that do not round-trip from text: a byte-fallback token alone, every special token
    special = sorted(theirs.all_special_ids)
    for ids in ([300, 1000, 5000, 20000], special, [*special[::-1], 300]):
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip
            )


def test_vocabulary_eos_and_chat_template_as_transformers(pair):
    ours, theirs = pair
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.eos_token_id == theirs.eos_token_id
    assert ours.chat_template == theirs.chat_template
    if theirs.chat_template:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        options = {"add_generation_prompt": True, "tokenize": False}
        text = ours.apply_chat_template(messages, **options)
        assert text == theirs.apply_chat_template(messages, **options)
        assert ours(text, add_special_tokens=False).input_ids == (
            theirs(text, add_special_tokens=False).input_ids
        )


def test_one_tokenizer_per_directory(registry):
    path = registry.resolve("smollm2-135m")
    assert read_tokenizer(path) is read_tokenizer(Path(path))

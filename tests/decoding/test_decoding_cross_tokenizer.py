"""A draft model with a different tokenizer: still the target's greedy output, token for token."""

from __future__ import annotations

import pytest
import torch

from decoding import CausalLM, ConstantK, CrossTokenizerDrafter, Heuristic, ModelDrafter, generate
from tests.decoding.conftest import tiny_llama

ALPHABET = "abcd "
PAIRS = [a + b for a in "abcd" for b in "abcd"]
TEXT_PROMPTS = ("abca dbc", "dd a", "cab cab cab")


class CharTokenizer:
    vocab = tuple(ALPHABET)

    def encode(self, text: str) -> list[int]:
        return [ALPHABET.index(char) for char in text]

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)


class PairTokenizer:
    """Single characters plus every letter pair, encoded greedily left to right, so that
    tokenisation does not compose: encode("a") + encode("b") != encode("ab")."""

    vocab = (*ALPHABET, *PAIRS)

    def encode(self, text: str) -> list[int]:
        ids, start = [], 0
        while start < len(text):
            size = 2 if text[start : start + 2] in PAIRS else 1
            ids.append(self.vocab.index(text[start : start + size]))
            start += size
        return ids

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)


def cross_drafter(draft, target_tok, draft_tok) -> CrossTokenizerDrafter:
    return CrossTokenizerDrafter(
        ModelDrafter(draft),
        target_tok.encode,
        target_tok.decode,
        draft_tok.encode,
        draft_tok.decode,
        window=3,
    )


def test_tokenizers_do_not_compose():
    pair = PairTokenizer()
    assert pair.encode("ab") != pair.encode("a") + pair.encode("b")
    assert pair.decode(pair.encode("abca dbc")) == "abca dbc"


@pytest.mark.parametrize(
    ("target_tok", "draft_tok"),
    [(CharTokenizer(), PairTokenizer()), (PairTokenizer(), CharTokenizer())],
    ids=["char-target", "pair-target"],
)
def test_cross_tokenizer_greedy_is_lossless(target_tok, draft_tok):
    target = CausalLM(tiny_llama(layers=3, seed=11, vocab=len(target_tok.vocab)))
    draft = CausalLM(tiny_llama(layers=1, seed=12, vocab=len(draft_tok.vocab)))
    prompts = [target_tok.encode(text) for text in TEXT_PROMPTS]
    expected = tuple(generate(target, [p], max_new_tokens=20).tokens[0] for p in prompts)
    drafter = cross_drafter(draft, target_tok, draft_tok)

    for policy in (ConstantK(3), Heuristic()):
        batched = generate(target, prompts, drafter, policy, max_new_tokens=20)
        alone = [
            generate(target, [p], drafter, policy, max_new_tokens=20).tokens[0] for p in prompts
        ]
        assert batched.tokens == expected
        assert tuple(alone) == expected


class TextOracle:
    """A draft-side Target that knows the text to come and predicts its next draft token, so
    that acceptance depends only on the translation between the two tokenizations."""

    device = torch.device("cpu")

    def __init__(self, texts: list[str], tokenizer) -> None:
        self.texts = texts
        self.tokenizer = tokenizer
        self.fed: list[dict[int, int]] = []

    def reset(self) -> None:
        self.fed = []

    def score(self, tokens, positions, mask, keep):
        batch, width = tokens.shape
        if not self.fed:
            self.fed = [{} for _ in range(batch)]
        logits = torch.zeros(batch, keep, len(self.tokenizer.vocab))
        for row in range(batch):
            for column in range(width):
                if mask[row, column]:
                    self.fed[row][int(positions[row, column])] = int(tokens[row, column])
            for index, column in enumerate(range(width - keep, width)):
                last = int(positions[row, column])
                prefix = self.tokenizer.decode(self.fed[row][i] for i in range(last + 1))
                text = self.texts[row]
                rest = text[len(prefix) :] if text.startswith(prefix) else ""
                logits[row, index, self.tokenizer.encode(rest)[0] if rest else 0] = 1.0
        return logits

    def rollback(self, lengths) -> None:
        """Re-fed positions overwrite what was there."""

    def keep_rows(self, rows) -> None:
        self.fed = [self.fed[row] for row in rows.tolist()]
        self.texts = [self.texts[row] for row in rows.tolist()]


def test_cross_tokenizer_drafts_are_accepted_when_the_draft_knows_the_text():
    target_tok, draft_tok = CharTokenizer(), PairTokenizer()
    target = CausalLM(tiny_llama(layers=3, seed=11, vocab=len(target_tok.vocab)))
    prompts = [target_tok.encode(text) for text in TEXT_PROMPTS]
    expected = generate(target, prompts, max_new_tokens=24).tokens
    texts = [target_tok.decode(p + list(row)) for p, row in zip(prompts, expected, strict=True)]
    drafter = cross_drafter(TextOracle(texts, draft_tok), target_tok, draft_tok)

    result = generate(target, prompts, drafter, ConstantK(4), max_new_tokens=24)

    assert result.tokens == expected
    assert result.stats.tokens_per_target_call > 2.5 * len(prompts)

"""Tiny random Llama models, prompts of different lengths and their greedy references.

float64 keeps argmax ties out of reach: rows scored in different block shapes differ in the
last bits, which must not flip a greedy choice.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

PROMPTS = ([5, 9, 17, 3, 22], [40, 41], [7, 7, 8, 9, 10, 11, 12, 13, 14])
MAX_NEW = 16


def tiny_llama(layers: int, seed: int, vocab: int = 64, dtype=torch.float64) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,  # peaked, varied predictions rather than near-uniform ones
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


def hf_greedy(model: LlamaForCausalLM, prompt: list[int], max_new_tokens: int) -> tuple:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return tuple(out[0, len(prompt) :].tolist())


@dataclass(frozen=True)
class Models:
    target: LlamaForCausalLM
    draft: LlamaForCausalLM  # the target's first two layers: a related, smaller model
    unrelated: LlamaForCausalLM


@pytest.fixture(scope="session")
def models() -> Models:
    target = tiny_llama(layers=4, seed=0)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:2]
    draft.config.num_hidden_layers = 2
    return Models(target=target, draft=draft, unrelated=tiny_llama(layers=2, seed=1))


@pytest.fixture(scope="session")
def references(models: Models) -> tuple[tuple[int, ...], ...]:
    """transformers' greedy continuation of every prompt, MAX_NEW tokens each."""
    return tuple(hf_greedy(models.target, list(prompt), MAX_NEW) for prompt in PROMPTS)


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_torch_thread):
    """Tiny models run fastest on one thread."""

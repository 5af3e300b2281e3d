"""Text LLMs for the speculative decoder: loading, drafter construction, one generate call.

The decoding core never imports transformers; this module is where transformers models are
loaded and wrapped (`decoding.CausalLM`) and where a drafter is chosen from user options.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from asr.models import ModelRegistry
from decoding import (
    CausalLM,
    CrossTokenizerDrafter,
    Drafter,
    EarlyExitDrafter,
    GenerationResult,
    ModelDrafter,
    PromptLookupDrafter,
    SamplingOptions,
    StepHook,
    generate,
)
from decoding.lookahead import LookaheadPolicy, PolicyName, make_policy

INT8_SUFFIX = ":int8"


@dataclass(frozen=True)
class LanguageModel:
    name: str
    model: torch.nn.Module
    tokenizer: object

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    @property
    def vocabulary(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()


# The longest block a drafter may propose. Each drafted token costs a draft step, and a
# block pays only as far as the target accepts it: 32 in a row is past any draft's agreement
# (`--k 100` with early exit ran 20 times slower than plain decoding).
MAX_DRAFT_LENGTH = 32


@dataclass(frozen=True)
class DraftOptions:
    """How to draft; at most one of assistant, prompt_lookup, early_exit."""

    assistant: str | None = None
    prompt_lookup: int | None = None  # tokens to propose (transformers' prompt_lookup_num_tokens)
    ngram: int = 3  # longest n-gram prompt lookup matches (transformers uses 2)
    early_exit: int | None = None  # decoder layers the draft runs
    policy: PolicyName = "heuristic"
    k: int = 4  # block length for constant / confidence, start for heuristic, max for adaptive
    confidence: float = 0.4  # the confidence policy's per-token stop; adaptive's joint one

    def validate(self) -> DraftOptions:
        chosen = [
            name
            for name, value in (
                ("assistant", self.assistant),
                ("prompt_lookup", self.prompt_lookup),
                ("early_exit", self.early_exit),
            )
            if value is not None
        ]
        if len(chosen) > 1:
            raise ValueError(f"choose one drafter, not {' and '.join(chosen)}")
        for name, length in (("prompt_lookup", self.prompt_lookup), ("k", self.k)):
            if length is not None and not 1 <= length <= MAX_DRAFT_LENGTH:
                raise ValueError(
                    f"{name} must be from 1 to {MAX_DRAFT_LENGTH} tokens (got {length})"
                )
        if self.early_exit is not None and self.early_exit < 1:
            raise ValueError(f"early_exit must be >= 1 layer (got {self.early_exit})")
        if self.ngram < 1:
            raise ValueError(f"ngram must be >= 1 (got {self.ngram})")
        return self

    @property
    def block(self) -> int:
        """The draft length the policy starts from: --prompt-lookup N sets it to N."""
        return self.prompt_lookup if self.prompt_lookup is not None else self.k

    @property
    def drafts(self) -> bool:
        return any(v is not None for v in (self.assistant, self.prompt_lookup, self.early_exit))


def load_language_model(
    registry: ModelRegistry, name: str, loaded: LanguageModel | None = None
) -> LanguageModel:
    """An embedded name, local directory or hub id; `NAME:int8` is NAME with int8 linear layers.

    The int8 variant (dynamic quantization of every nn.Linear) is a cheap same-vocabulary draft
    for its own full-precision model: on a CPU it reads a quarter of the weight bytes per token.
    loaded: a model already loaded (the target, when this is its draft); when it is NAME's
    full-precision model, its weights and tokenizer are shared instead of read again, which
    halves what `specscribe generate --assistant gemma-3-270m:int8` loads.
    """
    base = name.removesuffix(INT8_SUFFIX)
    if loaded is not None and loaded.name == base:
        model, tokenizer = loaded.model, loaded.tokenizer
    else:
        path = language_model_path(registry, name)
        model, tokenizer = _read_model(path), _read_tokenizer(path)
    if name.endswith(INT8_SUFFIX):
        model = quantize_int8(model)
    return LanguageModel(name, model, tokenizer)


def language_model_path(registry: ModelRegistry, name: str) -> Path:
    """The directory of `name` (as load_language_model takes it), checked to hold a text
    language model, without reading its weights: so that a wrong name is refused before
    anything loads. ValueError (or the registry's error) otherwise."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from asr.models import EMBEDDED, check_model_name
    from asr.whisper_checkpoint import local_directory

    base = name.removesuffix(INT8_SUFFIX)
    if base not in EMBEDDED:  # an unknown name is told the text models, not Whisper's
        check_model_name(base, kind="causal-lm")
    # A hub id through the hub cache: one that cannot be had is refused in a line, as
    # transcribe's models are, not by transformers' traceback.
    path = local_directory(registry.resolve(base))
    model_type = AutoConfig.from_pretrained(path).model_type
    # Whisper has a causal-LM class too (its decoder alone), but it needs audio to attend to.
    if model_type == "whisper" or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"{name} is a {model_type} model, not a text language model")
    return path


def _read_model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _read_tokenizer(path):
    """`tokenizers` directly (`app.text_tokenizer`: seconds faster for Gemma's 262k tokens),
    transformers' AutoTokenizer where that cannot stand in for it."""
    from .text_tokenizer import read_tokenizer

    tokenizer = read_tokenizer(path)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return tokenizer


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with int8 linear layers (`asr.int8.dynamic_int8_layers`); the model itself is
    left as it is. The copy shares every tensor that stays in float32 (embeddings, norms) with
    `model` rather than copying them: a deep copy of Gemma 3 270M's 1 GB took longer than
    quantizing it."""
    from asr.int8 import dynamic_int8_layers

    return dynamic_int8_layers(_module_tree(model), inplace=True)


def _module_tree(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` and its submodules whose parameters and buffers are `module`'s own
    tensors: replacing a submodule of the copy (quantizing) leaves `module` unchanged."""
    copied = copy.copy(module)
    for key, value in vars(module).items():
        if isinstance(value, dict | set):  # parameters, buffers, submodules, hooks
            vars(copied)[key] = copy.copy(value)
    for name, child in module.named_children():
        copied._modules[name] = _module_tree(child)
    return copied


def draft_policy(options: DraftOptions) -> LookaheadPolicy:
    """The policy the options ask for, starting from options.block (`decoding.make_policy`).

    Adaptive: a model draft's confidence ends its blocks (up to 20 tokens, transformers' default
    cap); prompt lookup has no confidence, so its blocks are the policy's k* (up to 16).
    """
    if options.policy != "adaptive":
        return make_policy(options.policy, options.block, options.confidence)
    if options.prompt_lookup is not None:
        return make_policy("adaptive", max(options.block, 16), confidence=0.0)
    return make_policy("adaptive", max(options.block, 20), options.confidence)


def check_drafted_target(name: str, options: DraftOptions) -> None:
    """Raises ValueError where drafting for the target `name` would not be lossless: a
    `NAME:int8` target's layers quantize a call's rows together (`asr.int8.dynamic_int8_layers`),
    so a position scores otherwise in a drafted block than alone, and its greedy output would
    depend on the draft (hunt: "is full of history" alone, "has been inhabited" with prompt
    lookup)."""
    if options.drafts and name.endswith(INT8_SUFFIX):
        base = name.removesuffix(INT8_SUFFIX)
        raise ValueError(
            f"{name} cannot be drafted for losslessly: its int8 layers quantize a call's rows "
            f"together, so its output would depend on the draft; decode {name} without a "
            f"drafter, or draft for {base} with {name} as the assistant"
        )


def check_early_exit(target: LanguageModel, early_exit: int | None) -> None:
    """Raises ValueError where an early-exit draft of `early_exit` layers cannot be made from
    `target` (it needs at least one layer fewer than the target has)."""
    layers = target.model.config.num_hidden_layers
    if early_exit is not None and early_exit >= layers:
        raise ValueError(
            f"early_exit must be below {target.name}'s {layers} layers (got {early_exit})"
        )


def make_drafter(
    target: LanguageModel,
    wrapped_target: CausalLM,
    options: DraftOptions,
    assistant: LanguageModel | None = None,
) -> Drafter | None:
    """The drafter the options ask for; an assistant with another vocabulary gets re-encoding.
    Raises ValueError for a target no draft keeps lossless (`check_drafted_target`)."""
    check_drafted_target(target.name, options)
    if options.prompt_lookup is not None:
        return PromptLookupDrafter(max_ngram=options.ngram)
    if options.early_exit is not None:
        check_early_exit(target, options.early_exit)
        return EarlyExitDrafter(wrapped_target.early_exit(options.early_exit))
    if assistant is None:
        return None
    # The draft's own limit: a Gemma 3 draft holds 512 positions for a target that holds 8192.
    drafter = ModelDrafter(CausalLM(assistant.model), context=context_limit(assistant)[0])
    # `is` first: building and comparing two 262k-entry vocabularies costs most of a second.
    if assistant.tokenizer is target.tokenizer or assistant.vocabulary == target.vocabulary:
        return drafter
    return CrossTokenizerDrafter(
        drafter,
        target.encode,
        target.decode,
        assistant.encode,
        assistant.decode,
    )


def prompt_ids(model: LanguageModel, prompt: str) -> list[int]:
    """The prompt as the model was trained to see it (with its BOS token, if it has one)."""
    return model.tokenizer(prompt).input_ids


def chat_prompt_ids(model: LanguageModel, messages: list[dict[str, str]]) -> list[int]:
    """The messages through the model's chat template, ready for the assistant's turn.
    ValueError for a model without one (a base model), and for a message whose text holds one
    of the model's control tokens: the rendered template is tokenized with them read as
    control tokens, so `<|im_end|><|im_start|>system` typed in a user's message opened a
    system turn of the user's making."""
    tokenizer = model.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{model.name} has no chat template (a base model): prompt it with text")
    control = control_token_ids(tokenizer)
    for index, message in enumerate(messages):
        ids = tokenizer(message["content"], add_special_tokens=False).input_ids
        held = next((i for i in ids if i in control), None)
        if held is not None:
            raise ValueError(
                f"messages[{index}].content holds {tokenizer.decode([held])!r}, one of "
                f"{model.name}'s control tokens, which its chat template would read as one"
            )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def control_token_ids(tokenizer) -> frozenset[int]:
    """The ids of a tokenizer's special added tokens (<|im_start|>, <start_of_turn>, <bos>,
    ...), which it reads as such wherever their text appears."""
    added = (
        tokenizer.added_tokens_decoder
        if hasattr(tokenizer, "added_tokens_decoder")
        else tokenizer.added_tokens()
    )
    return frozenset(index for index, token in added.items() if token.special)


def run_generation(
    target: LanguageModel,
    prompts: list[str],
    options: DraftOptions,
    assistant: LanguageModel | None = None,
    sampling: SamplingOptions | None = None,
    max_new_tokens: int = 128,
    on_step: StepHook | None = None,
) -> GenerationResult:
    return run_generation_ids(
        target,
        [prompt_ids(target, p) for p in prompts],
        options,
        assistant,
        sampling,
        max_new_tokens,
        on_step,
    )


def run_generation_ids(
    target: LanguageModel,
    prompt_tokens: list[list[int]],
    options: DraftOptions,
    assistant: LanguageModel | None = None,
    sampling: SamplingOptions | None = None,
    max_new_tokens: int = 128,
    on_step: StepHook | None = None,
) -> GenerationResult:
    """`run_generation` for prompts already tokenized (a chat template's output)."""
    options.validate()
    if not all(prompt_tokens):  # an empty prompt, for a model without a BOS token
        raise ValueError(f"the prompt is empty, and {target.name} needs text to continue")
    check_context(target, max(len(ids) for ids in prompt_tokens), max_new_tokens)
    wrapped = CausalLM(target.model)
    drafter = make_drafter(target, wrapped, options, assistant)
    policy = draft_policy(options) if drafter is not None else None
    return generate(
        wrapped,
        prompt_tokens,
        drafter,
        policy,
        sampling=sampling,
        max_new_tokens=max_new_tokens,
        eos_token_id=target.tokenizer.eos_token_id,
        on_step=on_step,
    )


def prompt_continuer(model: LanguageModel):
    """`asr.distill_data.PromptContinuer` over `model`: sampled continuations, decoded."""

    def continue_prompts(
        prompts: list[str], sampling: SamplingOptions, max_new_tokens: int
    ) -> list[str]:
        result = run_generation(
            model, prompts, DraftOptions(), None, sampling, max_new_tokens=max_new_tokens
        )
        return [model.tokenizer.decode(t, skip_special_tokens=True) for t in result.tokens]

    return continue_prompts


def context_limit(model: LanguageModel) -> tuple[int | None, str]:
    """The most tokens a sequence may hold here, and what sets it: the model's context
    (max_position_embeddings), or, for a model with sliding-window layers (Gemma 3: 512), that
    window, since `decoding.causal_lm`'s cache cannot roll such layers back exactly."""
    config = model.model.config
    limit = getattr(config, "max_position_embeddings", None)
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    sliding = getattr(config, "use_sliding_window", None) is not False and (
        kinds is None or "sliding_attention" in kinds
    )
    if window and sliding and (limit is None or window < limit):
        return window, "sliding attention window"
    return limit, "context"


def check_context(target: LanguageModel, prompt_tokens: int, max_new_tokens: int) -> None:
    """A request longer than `context_limit` allows is refused before any memory is taken for
    it: the decoder allocates its token buffer up front."""
    limit, what = context_limit(target)
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ValueError(
            f"the prompt ({prompt_tokens} tokens) and max_new_tokens ({max_new_tokens}) exceed "
            f"{target.name}'s {what} of {limit} tokens"
        )

"""Text-LLM benchmark: our speculative decoder against transformers, in one run.

Three prompts (summarise a passage, complete code, open-ended), 128 new tokens each, on the
embedded Gemma-3-270M. Every configuration runs `--repeats` times, interleaved round-robin so
that machine noise spreads evenly; the table gives medians, tokens/s, the ratio to our plain
greedy on the same prompt, and whether the output equals our plain greedy output. Greedy
outputs that repeat themselves inflate what n-gram drafting gains, so each prompt also reports
how repetitive its greedy output is. The last line printed is one JSON object.

    python -m bench.text [--repeats 3] [--max-new-tokens 128] [--threads 2] [--only REGEX]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

import app.config  # noqa: F401  (switches the libraries offline before they load)
from bench import positive_int, prog

PASSAGE = (
    "The printing press was developed around 1440 by Johannes Gutenberg, a goldsmith from "
    "Mainz. His system combined movable metal type, an oil-based ink and a wooden screw press "
    "adapted from those used to make wine. Before the press, books were copied by hand, which "
    "made them rare and expensive. Within fifty years, presses were operating in more than two "
    "hundred European cities and had produced millions of books. Cheaper books spread literacy, "
    "helped scientists share their results quickly, and allowed new religious and political "
    "ideas to reach a wide audience. Historians often describe the printing press as one of the "
    "most important inventions of the second millennium."
)
PROMPTS = {
    "summarise": (
        f"Article: {PASSAGE}\n\nQuestion: Summarise the article in a few sentences, "
        "using its own words.\nAnswer: The article says that"
    ),
    "code": (
        "import math\n\n\nclass Vector:\n    def __init__(self, x, y):\n        self.x = x\n"
        "        self.y = y\n\n    def __add__(self, other):\n        return Vector(self.x + "
        "other.x, self.y + other.y)\n\n    def __sub__(self, other):\n"
    ),
    # Gemma-3-270M (a base model) loops under greedy decoding on most open prompts; this one
    # loops least among those tried, and the report says how repetitive its output still is.
    "open-ended": ("The weather on Mars is very different from the weather on Earth. For example,"),
}
TARGET = "gemma-3-270m"
CROSS_ASSISTANT = "smollm2-135m"
LOOKUP_TOKENS = 4  # transformers' prompt_lookup_num_tokens and our draft length for it


# transformers reads the draft length, its schedule and the confidence threshold from the
# *assistant's* generation_config (generate's own keyword arguments of those names are ignored for
# assisted decoding), and tunes the threshold in place from call to call; so every assisted run
# sets all three there, these defaults included, and restores them afterwards.
TRANSFORMERS_ASSISTED_DEFAULTS = dict(
    num_assistant_tokens=20,
    num_assistant_tokens_schedule="constant",
    assistant_confidence_threshold=0.4,
)


@contextlib.contextmanager
def assistant_settings(assistant, settings: dict):
    """Sets generation_config attributes of the assistant model for one run."""
    if assistant is None or not settings:
        yield
        return
    config = assistant.generation_config
    saved = {name: getattr(config, name, None) for name in settings}
    for name, value in settings.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


@dataclass(frozen=True)
class Run:
    seconds: float
    tokens: tuple[int, ...]
    target_calls: int | None = None
    draft_calls: int | None = None


@dataclass(frozen=True)
class Config:
    name: str
    family: str  # "ours" or "transformers"
    equivalent: str | None  # the transformers config this one is compared against
    run: Callable[[list[int], int], Run]


def repetitiveness(tokens: tuple[int, ...]) -> dict[str, float]:
    """Share of repeated 4-grams and zlib compression ratio of the token ids."""
    grams = [tokens[i : i + 4] for i in range(len(tokens) - 3)]
    repeated = 1 - len(set(grams)) / len(grams) if grams else 0.0
    raw = ",".join(map(str, tokens)).encode()
    return {
        "repeated_4gram_share": round(repeated, 3),
        "compression_ratio": round(len(raw) / len(zlib.compress(raw)), 2) if raw else 0.0,
    }


def build_configs(models: dict) -> list[Config]:
    from app.llm import DraftOptions, draft_policy, make_drafter
    from decoding import CausalLM, generate

    target, int8, smol = models["target"], models["int8"], models["cross"]
    wrapped = CausalLM(target.model)
    eos = target.tokenizer.eos_token_id

    def ours(options: DraftOptions, assistant=None) -> Callable[[list[int], int], Run]:
        def run(ids: list[int], new_tokens: int) -> Run:
            drafter = make_drafter(target, wrapped, options, assistant)
            policy = draft_policy(options) if drafter is not None else None
            started = time.perf_counter()
            result = generate(
                wrapped, [ids], drafter, policy, max_new_tokens=new_tokens, eos_token_id=eos
            )
            seconds = time.perf_counter() - started
            stats = result.stats
            return Run(seconds, result.tokens[0], stats.target_calls, stats.draft_calls)

        return run

    def transformers(drafting: dict | None = None, **kwargs) -> Callable[[list[int], int], Run]:
        def run(ids: list[int], new_tokens: int) -> Run:
            prompt = torch.tensor([ids])
            with assistant_settings(kwargs.get("assistant_model"), drafting or {}):
                started = time.perf_counter()
                with torch.inference_mode():
                    out = target.model.generate(
                        prompt, max_new_tokens=new_tokens, do_sample=False, **kwargs
                    )
                seconds = time.perf_counter() - started
            return Run(seconds, tuple(out[0, len(ids) :].tolist()))

        return run

    # Pairs compare like with like: the same drafter and, where transformers has it, the same
    # draft-length policy. transformers' assisted default is 20 tokens cut by a confidence
    # threshold of 0.4 (its ConfidenceStop), which our "confidence" policy mirrors.
    lookup = dict(prompt_lookup=LOOKUP_TOKENS, ngram=2)  # transformers matches 2-grams
    int8_fixed = dict(num_assistant_tokens=4, assistant_confidence_threshold=0.0)
    default = TRANSFORMERS_ASSISTED_DEFAULTS
    configs = [
        Config("ours greedy", "ours", "transformers generate", ours(DraftOptions())),
        Config("ours prompt-lookup constant", "ours", "transformers prompt-lookup",
               ours(DraftOptions(**lookup, policy="constant"))),
        Config("ours prompt-lookup adaptive", "ours", "transformers prompt-lookup",
               ours(DraftOptions(**lookup, policy="adaptive"))),
        Config("ours int8-draft constant", "ours", "transformers int8-draft constant",
               ours(DraftOptions(assistant=int8.name, policy="constant"), int8)),
        Config("ours int8-draft heuristic", "ours", "transformers int8-draft heuristic",
               ours(DraftOptions(assistant=int8.name, policy="heuristic"), int8)),
        Config("ours int8-draft confidence", "ours", "transformers int8-draft default",
               ours(DraftOptions(assistant=int8.name, policy="confidence", k=20), int8)),
        Config("ours int8-draft adaptive", "ours", "transformers int8-draft default",
               ours(DraftOptions(assistant=int8.name, policy="adaptive"), int8)),
        Config("ours early-exit-6 adaptive", "ours", None,
               ours(DraftOptions(early_exit=6, policy="adaptive"))),
        Config("ours smollm2-draft heuristic", "ours", "transformers smollm2-draft default",
               ours(DraftOptions(assistant=smol.name, policy="heuristic"), smol)),
        Config("ours smollm2-draft adaptive", "ours", "transformers smollm2-draft default",
               ours(DraftOptions(assistant=smol.name, policy="adaptive"), smol)),
        Config("transformers generate", "transformers", None, transformers()),
        Config("transformers prompt-lookup", "transformers", None,
               transformers(prompt_lookup_num_tokens=LOOKUP_TOKENS, max_matching_ngram_size=2)),
        Config("transformers int8-draft constant", "transformers", None,
               transformers(dict(num_assistant_tokens_schedule="constant", **int8_fixed),
                            assistant_model=int8.model)),
        Config("transformers int8-draft heuristic", "transformers", None,
               transformers(dict(num_assistant_tokens_schedule="heuristic_transient", **int8_fixed),
                            assistant_model=int8.model)),
        Config("transformers int8-draft default", "transformers", None,
               transformers(default, assistant_model=int8.model)),
        Config("transformers smollm2-draft default", "transformers", None,
               transformers(default, assistant_model=smol.model, tokenizer=target.tokenizer,
                            assistant_tokenizer=smol.tokenizer)),
    ]  # fmt: skip
    return configs


def load_models() -> dict:
    from app.config import Settings
    from app.llm import LanguageModel, load_language_model, quantize_int8
    from asr.models import ModelRegistry

    registry = ModelRegistry(Settings.from_env().cache_dir)
    target = load_language_model(registry, TARGET)
    int8 = LanguageModel(f"{TARGET}:int8", quantize_int8(target.model), target.tokenizer)
    return {"target": target, "int8": int8, "cross": load_language_model(registry, CROSS_ASSISTANT)}


def summarise(
    runs: dict, configs: list[Config], prompts: list[str], text_of: Callable[[tuple], str]
) -> dict:
    report: dict = {}
    for prompt in prompts:
        greedy = runs[(prompt, "ours greedy")]
        base = statistics.median(r.seconds for r in greedy)
        rows = {}
        for config in configs:
            measured = runs[(prompt, config.name)]
            seconds = statistics.median(r.seconds for r in measured)
            tokens = measured[0].tokens
            row = {
                "median_seconds": round(seconds, 3),
                "tokens": len(tokens),
                "tokens_per_second": round(len(tokens) / seconds, 2),
                "speedup_vs_our_greedy": round(base / seconds, 3),
                "equals_greedy": all(r.tokens == greedy[0].tokens for r in measured),
            }
            if measured[0].target_calls is not None:
                row["target_calls"] = measured[0].target_calls
                row["draft_calls"] = measured[0].draft_calls
                row["tokens_per_target_call"] = round(len(tokens) / measured[0].target_calls, 2)
            rows[config.name] = row
        for config in configs:
            if config.equivalent:
                theirs = rows[config.equivalent]["median_seconds"]
                rows[config.name]["speedup_vs_transformers_equivalent"] = round(
                    theirs / rows[config.name]["median_seconds"], 3
                )
        report[prompt] = {
            "greedy_output": repetitiveness(greedy[0].tokens),
            "greedy_text": text_of(greedy[0].tokens),
            "configs": rows,
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("text"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    parser.add_argument("--only", help="regex: run only configs whose name matches (plus greedy)")
    parser.add_argument("--prompts", nargs="*", default=list(PROMPTS), choices=list(PROMPTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    models = load_models()
    configs = build_configs(models)
    if args.only:
        configs = [c for c in configs if c.name == "ours greedy" or re.search(args.only, c.name)]
        names = {c.name for c in configs}
        configs = [
            Config(c.name, c.family, c.equivalent if c.equivalent in names else None, c.run)
            for c in configs
        ]
    tokenizer = models["target"].tokenizer
    # Warm-up: the first calls page in weights and build kernels; they are not measured.
    for config in configs:
        config.run(tokenizer(PROMPTS[args.prompts[0]]).input_ids, 8)
    runs: dict[tuple[str, str], list[Run]] = {}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for prompt in args.prompts:
            ids = tokenizer(PROMPTS[prompt]).input_ids
            for config in configs:
                run = config.run(ids, args.max_new_tokens)
                runs.setdefault((prompt, config.name), []).append(run)
                print(
                    f"[{repeat + 1}/{args.repeats}] {prompt:10} {config.name:38} "
                    f"{run.seconds:6.2f} s {len(run.tokens) / run.seconds:6.1f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
    report = {
        "benchmark": "text",
        "target": TARGET,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "threads": args.threads,
        "torch": torch.__version__,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "prompts": summarise(runs, configs, args.prompts, tokenizer.decode),
    }
    for prompt, result in report["prompts"].items():
        print(f"\n{prompt}: greedy output {result['greedy_output']}")
        for name, row in result["configs"].items():
            versus = row.get("speedup_vs_transformers_equivalent")
            print(
                f"  {name:38} {row['tokens_per_second']:6.1f} tok/s "
                f"x{row['speedup_vs_our_greedy']:.2f} vs our greedy"
                + (f", x{versus:.2f} vs transformers" if versus else "")
                + ("" if row["equals_greedy"] else "  OUTPUT DIFFERS FROM GREEDY")
            )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

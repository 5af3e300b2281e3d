"""Model-agnostic speculative decoding (imports torch only, never transformers)."""

from decoding.beam import BeamOptions, beam_search
from decoding.causal_lm import CausalLM, EarlyExitLM
from decoding.drafters import (
    CrossTokenizerDrafter,
    EarlyExitDrafter,
    LookupBranchDrafter,
    ModelDrafter,
    PromptLookupDrafter,
)
from decoding.generate import DecodeStats, GenerationResult, StepHook, device_clock, generate
from decoding.lookahead import (
    Adaptive,
    BlockOutcome,
    ConfidenceStop,
    ConstantK,
    Heuristic,
    LookaheadPolicy,
    PolicyName,
    make_policy,
)
from decoding.protocols import Draft, Drafter, DraftRequest, Target
from decoding.verify import (
    SamplingOptions,
    Verdict,
    apply_sampling,
    greedy_accept,
    speculative_sample,
)

__all__ = [
    "Adaptive",
    "BeamOptions",
    "BlockOutcome",
    "CausalLM",
    "ConfidenceStop",
    "ConstantK",
    "CrossTokenizerDrafter",
    "DecodeStats",
    "Draft",
    "DraftRequest",
    "Drafter",
    "EarlyExitDrafter",
    "EarlyExitLM",
    "GenerationResult",
    "Heuristic",
    "LookaheadPolicy",
    "LookupBranchDrafter",
    "ModelDrafter",
    "PolicyName",
    "PromptLookupDrafter",
    "SamplingOptions",
    "StepHook",
    "Target",
    "Verdict",
    "apply_sampling",
    "beam_search",
    "device_clock",
    "generate",
    "greedy_accept",
    "make_policy",
    "speculative_sample",
]

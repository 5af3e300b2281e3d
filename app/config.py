"""Settings: the only place that reads the environment.

Importing this module also switches off every phone-home path of the libraries underneath
(pyannote metrics, Gradio analytics, Hugging Face hub calls and telemetry) unless the user has
set those variables already, and, before torch loads, has OpenMP's threads sleep rather than
spin where other programs are running (`app.cpu_load`). The package imports it first
(app/__init__.py), so every front does this before anything loads torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from .cpu_load import WAIT_POLICY, choose_wait_policy
from .malloc import TRIM_INTERVAL_SECONDS

_OFFLINE_DEFAULTS = {
    "PYANNOTE_METRICS_ENABLED": "0",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # transformers' "Loading weights" bar on stderr at every `generate` and `serve` start (it
    # follows the hub's switch); specscribe reports its own progress.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}
for _name, _value in _OFFLINE_DEFAULTS.items():
    os.environ.setdefault(_name, _value)
# What this import set OMP_WAIT_POLICY to (None: nothing; `users_environment`).
WAIT_POLICY_SET = choose_wait_policy()


def users_environment() -> dict[str, str]:
    """os.environ without the OpenMP wait policy this import chose, for processes started
    from here that must choose their own as they start (specscribe's), or run as their users
    run them (a benchmark's faster-whisper)."""
    return {k: v for k, v in os.environ.items() if k != WAIT_POLICY or WAIT_POLICY_SET is None}


@dataclass(frozen=True)
class Settings:
    cache_dir: Path
    asr_model: str
    assistant_model: str  # "auto": the shipped draft where it pays (app.service); "none": no draft
    diarization_model: str  # "embedded": the offline segmentation-3.0 + CAM++ pipeline
    llm_model: str
    device: str
    hf_token: str | None = None  # for pyannote pipelines on the hub, never needed offline
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 | mixed | int8 (asr.precision)
    max_audio_bytes: int = 100_000_000  # endpoint: largest audio file a request may send
    max_audio_seconds: float = 10_800.0  # endpoint: longest recording a request may send
    api_key: str | None = None  # serve: the bearer token the HTTP API and the page ask for
    # Greedy rounds on a GPU compiled once per pool (asr.graph_rounds): faster decoding after
    # seconds of compiling, for servers and workers (docs/gpu.md).
    fused_rounds: bool = False
    # Decoder blocks on CPU traced with TorchScript (asr.traced_step: a draft's short blocks,
    # a window decoded alone's target steps): the same results with less Python; off
    # (SPECSCRIBE_TRACED_STEPS=0) runs them eagerly.
    traced_steps: bool = True
    # Chains a model draft proposes per block: its best first tokens, each continued greedily,
    # verified in one target call (decoding.generate's branches; CPU decoding; docs/drafts.md).
    draft_branches: int = 1
    # The last of those chains follows prompt lookup where a window's text repeats (needs
    # draft_branches >= 2; asr.whisper_drafters.WhisperDraft.lookup_branch).
    draft_lookup_branch: bool = False
    # Free heap pages handed back to the system at most this often while transcribing
    # (app.malloc; 0: never), so that long recordings do not swell the process.
    heap_trim_seconds: float = TRIM_INTERVAL_SECONDS

    @classmethod
    def from_env(cls) -> Settings:
        cache = os.environ.get("SPECSCRIBE_CACHE_DIR") or platformdirs.user_cache_dir("specscribe")
        return cls(
            cache_dir=Path(cache).expanduser() / "models",
            asr_model=os.environ.get("ASR_MODEL", "whisper-base"),
            assistant_model=os.environ.get("ASSISTANT_MODEL", "auto"),
            diarization_model=os.environ.get("DIARIZATION_MODEL", "embedded"),
            llm_model=os.environ.get("LLM_MODEL", "gemma-3-270m"),
            device=os.environ.get("SPECSCRIBE_DEVICE", "cpu"),
            hf_token=os.environ.get("HF_TOKEN") or None,
            precision=os.environ.get("SPECSCRIBE_PRECISION", "auto"),
            max_audio_bytes=int(_positive_number("MAX_AUDIO_BYTES", 100_000_000)),
            max_audio_seconds=_positive_number("MAX_AUDIO_SECONDS", 10_800.0),
            api_key=os.environ.get("SPECSCRIBE_API_KEY") or None,
            fused_rounds=_flag("SPECSCRIBE_FUSED_ROUNDS"),
            traced_steps=_flag("SPECSCRIBE_TRACED_STEPS", default=True),
            draft_branches=draft_branches(os.environ.get("SPECSCRIBE_DRAFT_BRANCHES") or 1),
            draft_lookup_branch=_flag("SPECSCRIBE_LOOKUP_BRANCH"),
            heap_trim_seconds=_seconds_or_zero(
                "SPECSCRIBE_HEAP_TRIM_SECONDS", TRIM_INTERVAL_SECONDS
            ),
        )

    @property
    def lookup_branch(self) -> bool:
        """Whether trees of drafts end in a prompt-lookup chain: `draft_lookup_branch` where
        there is a tree (2 or more branches); a single chain has no branch to give it."""
        return self.draft_lookup_branch and self.draft_branches >= 2


MAX_DRAFT_BRANCHES = 8


def draft_branches(text: str | int) -> int:
    """A draft-branches setting (SPECSCRIBE_DRAFT_BRANCHES, --draft-branches): 1 to 8."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_DRAFT_BRANCHES:
        raise ValueError(
            f"draft branches must be a whole number from 1 to {MAX_DRAFT_BRANCHES}, not {text!r}"
        )
    return value


def _flag(name: str, default: bool = False) -> bool:
    """The environment variable `name` as a switch: 1/true/yes/on or 0/false/no/off (unset:
    `default`)."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), not {text!r}")


def _seconds_or_zero(name: str, default: float) -> float:
    """The environment variable `name` as seconds >= 0, 0 meaning never (`default` when
    unset)."""
    try:
        if float(os.environ.get(name) or "nan") == 0:
            return 0.0
    except ValueError:
        pass  # _positive_number names the variable and what it must be
    return _positive_number(name, default)


def _positive_number(name: str, default: float) -> float:
    """The environment variable `name` as a number > 0 (`default` when unset)."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {text!r}") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a finite number greater than 0, not {text!r}")
    return value

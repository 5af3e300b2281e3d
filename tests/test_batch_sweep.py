"""bench.batch_sweep: the GPU benchmark's arithmetic, and a small run of its sweep on CPU (the
sweep itself is measured on a lent GPU: docs/gpu.md)."""

from __future__ import annotations

import numpy as np
import pytest

from asr.audio import load_audio
from bench.batch_sweep import implied_speedups, sweep, targets
from tests.conftest import SAMPLES


def test_implied_speedups_pick_the_draft_length_that_commits_most_per_millisecond():
    costs = {"batch 1 k 0": 1.0, "batch 1 k 2": 1.5, "batch 1 k 4": 3.0}
    found = implied_speedups(costs, acceptances=(0.5,))
    # k = 2 commits 1 + 0.5 + 0.25 tokens a round for 1.5 plain rounds; k = 4 1.9375 for 3.
    assert found == {"batch 1 a 0.5": {"k": 2, "speedup": round(1.75 / 1.5, 3)}}


def _row(mode, batch, seconds, draft_tokens=None, rules=None, equal=None):
    row = {"mode": mode, "batch": batch, "seconds": seconds, "draft_tokens": draft_tokens}
    row["draft_rules"] = rules
    if equal is not None:
        row["windows_equal_to_plain"] = equal
    return row


def test_targets_read_the_issue_figures_off_a_sweep():
    rows = [
        _row("uncaptured", 1, 10.0),
        _row("uncaptured", 1, 12.0, "adaptive", None, 4),
        _row("rounds", 1, 2.5),
        _row("rounds", 1, 2.0, 3, "suppress", 4),
        _row("rounds", 1, 1.6, 2, "suppress", 3),
        _row("refilled rounds", 16, 1.0),
        _row("refilled rounds", 16, 1.25, 2, "suppress", 4),
    ]
    found = targets(rows, windows=4)
    assert found["rounds_plain_vs_uncaptured_plain_batch_1"] == 4.0
    assert found["rounds batch 1"] == {
        "default": "k 3, suppress",
        "drafted_vs_plain_default": 1.25,
        "best": "k 2, suppress",
        "drafted_vs_plain_best": round(2.5 / 1.6, 3),
    }
    assert found["refilled rounds batch 16"]["drafted_vs_plain_default"] == 0.8
    assert found["drafted_windows_equal_to_plain"] == "15 of 16"


@pytest.mark.slow
def test_a_small_sweep_runs_on_the_cpu(whisper_base, registry):
    from asr.whisper_drafters import load_draft

    assistant = load_draft(whisper_base, registry.resolve("whisper-base-draft"))
    jfk = load_audio(SAMPLES / "jfk.wav")
    samples = np.pad(jfk, (0, 30 * 16_000 - len(jfk)))[None]
    rows = sweep(whisper_base, assistant, samples, [1], ["uncaptured", "rounds"], [2], ["suppress"])
    assert [(r["mode"], r["draft_tokens"]) for r in rows] == [
        ("uncaptured", None),
        ("uncaptured", "adaptive"),
        ("rounds", None),
        ("rounds", 2),
    ]
    assert all(r["windows_equal_to_uncaptured_plain"] == 1 for r in rows)
    assert rows[-1]["tokens_per_target_call"] > 1.5

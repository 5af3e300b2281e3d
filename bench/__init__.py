"""Benchmarks: each runs its baselines in the same process and prints JSON (see README)."""

from __future__ import annotations

import argparse

# How a suite's usage line names it: run as a module, or by `specscribe bench SUITE` (which
# sets this before it imports the suite).
STARTED_AS = "python -m bench.{suite}"


def prog(suite: str) -> str:
    """The suite's name for its usage line (argparse's prog)."""
    return STARTED_AS.format(suite=suite)


def positive_int(value: str) -> int:
    """argparse type for counts that must be at least 1 (--repeats, --threads, ...)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number

"""Benchmarks: each runs its baselines in the same process and prints JSON (see README)."""

from __future__ import annotations

import argparse


def positive_int(value: str) -> int:
    """argparse type for counts that must be at least 1 (--repeats, --threads, ...)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number

"""Give the heap's free pages back to the system while a long recording is transcribed.

glibc keeps the memory a process frees for its next allocations, and gives back only what lies
at the top of a heap. Tensors of many sizes allocated and freed by two threads leave free
pages spread through the heaps: a 28.6-minute recording with `--word-timestamps` reached
6.1 GB resident while no more than 2.2 GB was allocated at once (memray), and a larger file
would reach more. `malloc_trim` hands every free page back; called as the transcription goes
(`trimming`, at most every 2 s, about 9 ms a call), the same recording peaked at 3.2 GB, in
no more time (docs/decoder-runtime.md). Other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import platform
import time
from collections.abc import Callable
from functools import cache

from asr.types import ProgressHook

TRIM_INTERVAL_SECONDS = 2.0


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def trim_free_heap() -> bool:
    """Hands the heap's free pages back to the system; True if any were (glibc only)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def trimming(
    progress: ProgressHook,
    interval: float = TRIM_INTERVAL_SECONDS,
    trim: Callable[[], object] = trim_free_heap,
    clock: Callable[[], float] = time.monotonic,
) -> ProgressHook:
    """`progress`, which also trims the heap when called `interval` seconds or more after the
    last trim (or after it was made)."""
    last = clock()

    def hook(stage: str, done: int, total: int) -> None:
        nonlocal last
        if clock() - last >= interval:
            trim()
            last = clock()
        progress(stage, done, total)

    return hook

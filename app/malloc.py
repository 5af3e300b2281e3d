"""Keep large heap blocks out of glibc's arenas, so that a long transcription's resident memory
stays near what it uses.

glibc serves a block of at least M_MMAP_THRESHOLD bytes with a mapping of its own and unmaps it
when freed. The threshold starts at 128 KiB but rises to the size of every mapped block freed
(up to 32 MiB), so once the first tensors of a few MiB are freed, tensors of that size are cut
out of the arenas instead, where the freed space of many sizes, from several threads, is
fragmented and not given back. A 28.6-minute recording with `--word-timestamps` peaked at
6.1 GB resident while no more than 2.2 GB was allocated at once (memray); with the threshold
fixed at 4 MiB, 2.3 GB in about the same time (docs/decoder-runtime.md). Setting the threshold
also stops it rising. Blocks under it (a decoder step's tensors) are served from the arenas as
before.

Other C libraries are left alone, as is a threshold the user gave glibc
(MALLOC_MMAP_THRESHOLD_, which it reads at start-up).
"""

from __future__ import annotations

import ctypes
import os
import platform

DEFAULT_MMAP_THRESHOLD = 4 << 20  # bytes
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
_GLIBC_LIMIT = 32 << 20  # glibc refuses a fixed threshold above HEAP_MAX_SIZE / 2 on 64 bits


def mmap_threshold_setting(text: str | None) -> int:
    """SPECSCRIBE_MMAP_THRESHOLD: bytes (0: leave glibc's rising default); unset: 4 MiB."""
    if text is None or not text.strip():
        return DEFAULT_MMAP_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= _GLIBC_LIMIT:
        raise ValueError(
            f"SPECSCRIBE_MMAP_THRESHOLD must be a number of bytes from 0 (glibc's default) to "
            f"{_GLIBC_LIMIT}, not {text!r}"
        )
    return value


def set_mmap_threshold(threshold: int) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes; True if it was set. Does nothing (False)
    for 0, off glibc, or where the user set MALLOC_MMAP_THRESHOLD_ themselves."""
    if threshold <= 0 or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(threshold)))
    except (OSError, AttributeError):
        return False

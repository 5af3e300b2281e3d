"""app.malloc: free heap pages handed back to the system as a transcription goes."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from app.malloc import trimming

ROOT = Path(__file__).resolve().parent.parent

# 256 MiB in 4 KiB blocks, all freed but the last (which pins the heap's top, so that free()
# alone gives nothing back); prints the resident MiB freed by trim_free_heap.
_PROBE = """
import ctypes, os
from app.malloc import trim_free_heap
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
blocks = []
for _ in range(65536):
    block = libc.malloc(4096)
    ctypes.memset(block, 1, 4096)
    blocks.append(block)
for block in blocks[:-1]:
    libc.free(ctypes.c_void_p(block))
before = resident()
print(trim_free_heap(), before - resident())
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_free_pages_inside_the_heap_are_handed_back():
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    trimmed, freed_mib = done.stdout.split()
    assert trimmed == "True" and int(freed_mib) > 200


def test_trimming_trims_at_most_once_an_interval_and_always_reports():
    now, trims, seen = [0.0], [], []
    hook = trimming(
        lambda *call: seen.append(call), 2.0, lambda: trims.append(now[0]), lambda: now[0]
    )
    for seconds in (0.5, 1.9, 2.0, 2.5, 3.9, 4.0, 10.0):
        now[0] = seconds
        hook("transcribe", int(seconds), 10)
    assert trims == [2.0, 4.0, 10.0]
    assert [call[1] for call in seen] == [0, 1, 2, 2, 3, 4, 10]

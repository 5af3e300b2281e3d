"""app.malloc: glibc's mmap threshold fixed at import of app.config, so that large blocks are
mapped (and given back when freed) however large the blocks freed before them were."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from app.malloc import DEFAULT_MMAP_THRESHOLD, mmap_threshold_setting

ROOT = Path(__file__).resolve().parent.parent

# Frees a 16 MiB block (glibc's rising threshold follows it to 16 MiB), then allocates 6 MiB and
# prints whether that block was mapped on its own: mallinfo2's hblkhd counts mapped bytes.
_PROBE = """
import ctypes
import app.config  # noqa: F401
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free(ctypes.c_void_p(libc.malloc(16 << 20)))
before = libc.mallinfo2().hblkhd
block = libc.malloc(6 << 20)
print(libc.mallinfo2().hblkhd - before >= 6 << 20)
"""


def _mapped(**environment: str) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**env, **environment},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip() == "True"


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_large_blocks_stay_mapped_after_larger_ones_were_freed():
    assert _mapped()  # the default: 4 MiB
    assert not _mapped(SPECSCRIBE_MMAP_THRESHOLD="0")  # glibc's own rising threshold
    assert not _mapped(SPECSCRIBE_MMAP_THRESHOLD=str(8 << 20))
    # The user's own setting for glibc is left as it is.
    assert not _mapped(MALLOC_MMAP_THRESHOLD_=str(32 << 20))


def test_the_setting_is_bytes_up_to_glibcs_limit():
    assert mmap_threshold_setting(None) == mmap_threshold_setting(" ") == DEFAULT_MMAP_THRESHOLD
    assert mmap_threshold_setting("0") == 0
    assert mmap_threshold_setting("1048576") == 1 << 20
    for wrong in ("-1", "4M", str(64 << 20), "1.5"):
        with pytest.raises(ValueError, match="SPECSCRIBE_MMAP_THRESHOLD"):
            mmap_threshold_setting(wrong)

"""Out of memory, said as such.

Where a process runs under a memory limit (a container, `ulimit -v`, a cgroup), each library
fails in its own words when an allocation is refused: Python's bare MemoryError, torch's
"DefaultCPUAllocator: can't allocate memory", a safetensors mmap's "Cannot allocate memory
(12)", the dynamic loader's "failed to map segment from shared object" for torch's own
libraries, oneDNN's "could not create a primitive" (its buffers are allocated as a primitive
is made). None of them says what a user can do about it; `said` and ADVICE do.
"""

from __future__ import annotations

import errno
import re

# What the allocators say, lower case. oneDNN's words mean other failures too, but a CPU build
# that runs at all only meets them for want of memory.
_WORDS = (
    "can't allocate memory",
    "cannot allocate memory",
    "failed to map segment",
    "out of memory",
    "could not create a primitive",
)

LONGEST_DETAIL = 160  # characters of a library's words quoted

ADVICE = "give the process more memory"
FEWER_FILES = "or decode fewer files at a time (--batch-files 1)"  # where it decodes several


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation the system refused, in any library's words."""
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, OSError) and error.errno == errno.ENOMEM:
        return True
    words = str(error).lower()
    return isinstance(error, (RuntimeError, ImportError, OSError)) and any(
        known in words for known in _WORDS
    )


def said(error: BaseException) -> str:
    """ "out of memory (what was refused)": torch's allocator's request, else the first line
    of the library's words, shortened at a word (MemoryError has none of its own)."""
    words = str(error).strip().splitlines()
    request = re.search(r"you tried to allocate (\d+) bytes", str(error))
    if request:
        detail = f"torch could not allocate {int(request[1]) / 1e6:.1f} MB"
    elif not words:
        return "out of memory"
    elif len(words[0]) <= LONGEST_DETAIL:
        detail = words[0]
    else:
        detail = words[0][:LONGEST_DETAIL].rsplit(" ", 1)[0] + " ..."
    return f"out of memory ({detail})"

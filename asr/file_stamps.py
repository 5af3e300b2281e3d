"""Stamps of files whose content was checked: a file's size and modification time, kept in
a small JSON file, so that a later load re-checks (re-hashes) it only when it changed since.

Used for the embedded models' files (`asr.models`) and the tensors the project keeps in its
cache (`asr.checked_tensors`). Writes are atomic and best effort: a read-only cache only costs
the next load a re-check.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


def stamp_of(path: Path) -> list[int] | None:
    """[size, mtime_ns] of `path`, or None where it cannot be read."""
    try:
        status = path.stat()
    except OSError:
        return None
    return [status.st_size, status.st_mtime_ns]


def read_stamp(stamp_file: Path) -> object | None:
    """The JSON value a stamp file holds, or None where there is none or it is unreadable."""
    try:
        return json.loads(stamp_file.read_text())
    except (OSError, ValueError):
        return None


def write_stamp(stamp_file: Path, value: object) -> None:
    """Writes `value` as JSON to `stamp_file`, atomically; nothing where it cannot."""
    try:
        handle, temporary = tempfile.mkstemp(dir=stamp_file.parent, prefix=f".{stamp_file.name}.")
    except OSError:
        return
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(value, out)
        os.replace(temporary, stamp_file)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)

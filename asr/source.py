"""Which recording a file's outputs were made from, as their record keeps it.

A rerun skips a file whose outputs exist and were made with the same options; without this, it
also skipped one whose recording had since been replaced (a recorder's REC001.WAV of another
day), or another recording of the same name written to the same folder. The size and the
modification time vouch for a file unchanged since, as make, rsync and git trust them, so a
finished folder is not read again; where only the time differs (a copy), the bytes decide.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import stat
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 1 << 20


def new_digest():
    """The hash that names files' bytes in records (BLAKE2b, 160 bits)."""
    return hashlib.blake2b(digest_size=20)


def digest_of(data: bytes) -> str:
    """`new_digest`'s hex digest of bytes held in memory."""
    digest = new_digest()
    digest.update(data)
    return digest.hexdigest()


@dataclass(frozen=True)
class Source:
    """A recording on disk: where it is, its size and modification time; its BLAKE2b
    digest is read on first use (`digest`)."""

    path: Path
    size: int
    mtime_ns: int
    # Where records say it is, when not at `path`: "-" for a recording piped to standard
    # input, spooled to a temporary file of another name every run.
    recorded_as: str | None = None

    @classmethod
    def of(cls, path: Path, recorded_as: str | None = None) -> Source:
        """Raises OSError where `path` cannot be read, or is no regular file (a pipe: reading
        its digest would block, or consume what the decoder was to read)."""
        status = path.stat()
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return cls(path.resolve(), status.st_size, status.st_mtime_ns, recorded_as)

    @property
    def where(self) -> str:
        """Where records say it is."""
        return self.recorded_as or str(self.path)

    @functools.cached_property
    def digest(self) -> str:
        digest = new_digest()
        with self.path.open("rb") as stream:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def stored(self) -> dict:
        """As a record stores it (JSON values)."""
        return {
            "path": self.where,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "blake2b": self.digest,
        }

    def made(self, stored: object) -> bool:
        """Whether `stored` (a record's `stored()`) is this recording: the same size, and the
        same modification time or else the same bytes."""
        if not isinstance(stored, dict) or stored.get("size") != self.size:
            return False
        return stored.get("mtime_ns") == self.mtime_ns or stored.get("blake2b") == self.digest

    def holds(self, stored: object) -> bool:
        """Whether `stored` (a record's `stored()`) names these very bytes: the same size and
        digest, whatever the times say (reads the file). What a transcript kept from it is
        reused on, as its record then vouches for these bytes."""
        if not isinstance(stored, dict) or stored.get("size") != self.size:
            return False
        return stored.get("blake2b") == self.digest

    def elsewhere(self, stored: object) -> bool:
        """Whether `stored` (a record's `stored()`) names a recording at another path."""
        where = stored.get("path") if isinstance(stored, dict) else None
        if self.recorded_as is not None:
            return where != self.recorded_as
        return isinstance(where, str) and Path(where) != self.path

    def change(self, stored: object) -> str:
        """What tells `stored` from this recording, as a rerun notice says it."""
        if self.elsewhere(stored):
            return f"its outputs were made from another recording, {stored['path']}"
        return "the recording changed since its outputs were made"

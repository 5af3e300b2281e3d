"""Whether a native FLAC file holds several streams one after another.

`cat a.flac b.flac > both.flac` (or a recorder that appends) gives a file whose first
STREAMINFO counts the first stream's samples only: libsndfile reads those and stops without a
word; ffmpeg reads on, but loses a frame or two at each seam and stops at a stream whose sample
rate differs. So `asr.audio` reads each stream apart. A stream's start is "fLaC" followed by its
STREAMINFO block's header (type 0, 34 bytes long): eight bytes that compressed audio does
not hold by chance.
"""

from __future__ import annotations

import mmap
from pathlib import Path

MARKER = b"fLaC"
# A metadata block header: last-block flag and type 0 (STREAMINFO), then its length, 34.
_STREAMINFO_HEADERS = (b"\x00\x00\x00\x22", b"\x80\x00\x00\x22")


def is_flac(path: Path) -> bool:
    """Whether the file at `path` is native FLAC, whatever its name says (a pipe's spool, a
    download without an extension)."""
    with path.open("rb") as stream:
        return stream.read(len(MARKER)) == MARKER


def stream_starts(path: Path) -> list[int]:
    """Where each stream of the FLAC file at `path` starts (bytes; [0] for a file of one
    stream, [] for a file that is not native FLAC). Scans the file through a memory map (a
    search at memory speed; nothing is decoded)."""
    with path.open("rb") as stream:
        if path.stat().st_size <= len(MARKER) or stream.read(len(MARKER)) != MARKER:
            return []
        starts = [0]
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = data.find(MARKER, len(MARKER))
            while found != -1:
                header = data[found + len(MARKER) : found + len(MARKER) + 4]
                if header in _STREAMINFO_HEADERS:
                    starts.append(found)
                found = data.find(MARKER, found + 1)
    return starts


def holds_several_streams(path: Path) -> bool:
    """Whether the FLAC file at `path` has another stream's start after its own."""
    return len(stream_starts(path)) > 1

"""Whether an Ogg file (Vorbis, Opus, FLAC in Ogg) was cut short, or is chained.

An Ogg file holds no total length: its pages follow one another to the end, and the last one
of each stream carries the end-of-stream flag. A file cut off (a recorder killed, a download
stopped) decodes without a word from libsndfile or ffmpeg, as far as its pages go, so the
only trace of the loss is a last page that ends past the file's end or lacks that flag.
"""

from __future__ import annotations

from pathlib import Path

CAPTURE = b"OggS"
_HEADER = 27  # bytes before a page's segment table (RFC 3533, section 6)
_BEGINNING_OF_STREAM = 0x02  # header_type flag of a stream's first page
_END_OF_STREAM = 0x04  # header_type flag of a stream's last page
# The largest page: its header, a full segment table and 255 segments of 255 bytes. The last
# page starts within this many bytes of the file's end.
_LARGEST_PAGE = _HEADER + 255 + 255 * 255


def is_ogg(path: Path) -> bool:
    with path.open("rb") as stream:
        return stream.read(len(CAPTURE)) == CAPTURE


def ends_without_end_of_stream(path: Path) -> bool:
    """Whether the Ogg file at `path` stops before its last page is whole or that page ends
    its stream. False for a file whose end cannot be read as Ogg pages (nothing to say)."""
    size = path.stat().st_size
    start = max(0, size - _LARGEST_PAGE)
    with path.open("rb") as stream:
        stream.seek(start)
        tail = stream.read()
    # The first capture pattern in the tail whose pages chain to the end (or past it) starts
    # a real page; one found inside a page's data would not chain.
    found = tail.find(CAPTURE)
    while found != -1:
        last = _last_page_flags(tail, found)
        if last is not None:
            return last != _END_OF_STREAM
        found = tail.find(CAPTURE, found + 1)
    return False


def _last_page_flags(tail: bytes, at: int) -> int | None:
    """Following pages from `at`: the end-of-stream flag of the last page when it ends
    exactly at the tail's end, 0 when a page runs past it (cut mid-page), None when the chain
    breaks (`at` was not a page's start)."""
    while True:
        if len(tail) - at < len(CAPTURE) and CAPTURE.startswith(tail[at:]):
            return 0  # cut inside the next page's capture pattern
        if tail[at : at + len(CAPTURE)] != CAPTURE:
            return None
        if at + _HEADER > len(tail):
            return 0
        if tail[at + 4] != 0:  # stream structure version, 0 in every Ogg there is
            return None
        segments = tail[at + 26]
        table = tail[at + _HEADER : at + _HEADER + segments]
        if len(table) < segments:
            return 0
        end = at + _HEADER + segments + sum(table)
        if end > len(tail):
            return 0
        if end == len(tail):
            return tail[at + 5] & _END_OF_STREAM
        at = end


def is_chained(path: Path) -> bool:
    """Whether the Ogg file at `path` is a chain: streams one after another (files joined
    with `cat`, stream rips, some recorders), which libsndfile reads only the first of, or
    gives a length of millions of hours. A stream starting after another's pages is the
    sign; the streams a file multiplexes (audio beside video) all start on its first pages.
    Reads the pages' headers only, as far as they chain (False if none)."""
    size = path.stat().st_size
    at, seen_data = 0, False
    with path.open("rb") as stream:
        while at + _HEADER <= size:
            stream.seek(at)
            header = stream.read(_HEADER)
            if header[: len(CAPTURE)] != CAPTURE or header[4] != 0:
                return False  # not (or no longer) a chain of pages: nothing to say
            if header[5] & _BEGINNING_OF_STREAM:
                if seen_data:
                    return True
            else:
                seen_data = True
            table = stream.read(header[26])
            at += _HEADER + len(table) + sum(table)
    return False

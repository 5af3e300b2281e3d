"""app.closed_pipe: standard streams whose reader went away, or whose disk is full."""

from __future__ import annotations

import errno
import io
import os

from app.closed_pipe import ReaderGoneTolerant


def test_writes_after_the_reader_left_are_dropped_not_raised():
    read_end, write_end = os.pipe()
    stream = ReaderGoneTolerant(io.TextIOWrapper(os.fdopen(write_end, "wb"), line_buffering=True))
    stream.write("read\n")
    assert os.read(read_end, 100) == b"read\n"
    os.close(read_end)
    assert not stream.reader_gone
    assert stream.write("nobody reads this\n") == len("nobody reads this\n")
    stream.flush()
    print("nor this", file=stream, flush=True)
    assert stream.reader_gone
    # the descriptor now writes to /dev/null: the interpreter's last flush raises nothing
    assert os.write(stream.fileno(), b"x") == 1
    stream.close()


def test_everything_else_is_the_wrapped_streams():
    inner = io.StringIO()
    stream = ReaderGoneTolerant(inner)
    stream.writelines(["a", "b"])
    assert inner.getvalue() == "ab" and stream.isatty() is False and not stream.reader_gone


class _FullDisk(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_write_that_fails_otherwise_is_told_once_and_dropped():
    """`> run.log` on a full disk raised OSError from the first print: a traceback, and the
    files after it were never transcribed."""
    told = io.StringIO()
    stream = ReaderGoneTolerant(_FullDisk(), "standard output", tell=told)
    assert stream.write("a transcript\n") == len("a transcript\n")
    stream.write("another\n")
    stream.flush()
    assert stream.reader_gone and stream.failure == "No space left on device"
    assert told.getvalue() == (
        "specscribe: warning: cannot write to standard output (No space left on device): "
        "what it would show is dropped from here on\n"
    )


def test_a_stream_closed_from_the_start_drops_everything():
    """`>&-` leaves sys.stdout None: every print raised AttributeError."""
    stream = ReaderGoneTolerant(None)
    assert stream.write("nowhere\n") == len("nowhere\n")
    print("nor here", file=stream, flush=True)
    assert stream.reader_gone and stream.failure is None

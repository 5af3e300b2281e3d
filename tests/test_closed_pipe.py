"""app.closed_pipe: standard output whose reader went away."""

from __future__ import annotations

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

"""Standard output that outlives its reader.

`specscribe transcribe DIR -o out | head` or `specscribe status | less` quit before the
command does. Python ignores SIGPIPE, so the next write to the closed pipe raises
BrokenPipeError: uncaught, it printed a traceback and ended a transcription after its first
file, its other files never transcribed. Wrapped here, the first write that meets a closed pipe
points the stream at /dev/null and everything after it is dropped: the command finishes its work
(outputs written, the summary on stderr) and exits as it would have, since nobody is left to
read what it prints.
"""

from __future__ import annotations

import os
from typing import TextIO


class ReaderGoneTolerant:
    """A text stream (stdout) whose writes and flushes never raise BrokenPipeError: from the
    first one that would, the stream's file descriptor is /dev/null and `reader_gone` is True.
    Everything else is the wrapped stream's (isatty, fileno, encoding, ...)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop_output()
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop_output()

    def _drop_output(self) -> None:
        """Points the descriptor at /dev/null, so that what the stream still buffers, flushed
        at exit by the interpreter, goes nowhere instead of raising there."""
        self.reader_gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError):  # no descriptor (a test's stream): drops in write()
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

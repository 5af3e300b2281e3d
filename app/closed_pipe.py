"""Standard streams that outlive their reader, or their disk.

`specscribe transcribe DIR -o out | head` or `specscribe status | less` quit before the
command does. Python ignores SIGPIPE, so the next write to the closed pipe raises
BrokenPipeError: uncaught, it printed a traceback and ended a transcription after its first
file, its other files never transcribed. A log on a disk that fills up (`> run.log`) raised
OSError the same way, and standard error read by a pipe that closed (`2>&1 | head`) ended the
run silently. Wrapped here, the first write that fails points the stream at /dev/null and
everything after it is dropped: the command finishes its work (outputs written, the summary
where it can still be read) and exits as it would have. Only a failure other than a closed
pipe is worth telling (`tell`): nobody is left to read a closed pipe.
"""

from __future__ import annotations

import os
from typing import TextIO


class ReaderGoneTolerant:
    """A text stream whose writes and flushes never raise for a reader gone or a disk full:
    from the first one that would, the stream's file descriptor is /dev/null and `reader_gone`
    is True. A stream that is None (its descriptor closed when the process started: `>&-`) is
    /dev/null from the start. Everything else is the wrapped stream's (isatty, fileno,
    encoding, ...).

    name, tell: where a write fails for another reason than a closed pipe (ENOSPC, EIO),
    `tell` gets one line saying so, naming the stream as `name`."""

    def __init__(
        self,
        stream: TextIO | None,
        name: str = "standard output",
        tell: TextIO | None = None,
    ) -> None:
        self.reader_gone = stream is None
        self.failure: str | None = None  # why a write failed, other than a closed pipe
        self._stream = stream if stream is not None else open(os.devnull, "w")  # noqa: SIM115
        self._name, self._tell = name, tell

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except (OSError, ValueError) as error:  # ValueError: the stream was closed
                self._drop_output(error)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except (OSError, ValueError) as error:
                self._drop_output(error)

    def _drop_output(self, error: Exception) -> None:
        """Points the descriptor at /dev/null, so that what the stream still buffers, flushed
        at exit by the interpreter, goes nowhere instead of raising there."""
        self.reader_gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError):  # no descriptor (a test's stream): drops in write()
            pass
        if isinstance(error, BrokenPipeError):
            return
        why = self.failure = getattr(error, "strerror", None) or str(error)
        if self._tell is not None:
            print(
                f"specscribe: warning: cannot write to {self._name} ({why}): what it would "
                "show is dropped from here on",
                file=self._tell,
            )

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

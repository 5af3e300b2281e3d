"""Stop signals turned into exceptions, so that a command unwinds (temporary files removed, a
task handed back) instead of dying where it stands."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def raising_on(
    signals: tuple[signal.Signals, ...], error: Callable[[int], BaseException]
) -> Iterator[None]:
    """While the block runs, each of `signals` raises `error(signum)` in the main thread; the
    previous handlers come back after it. Outside the main thread (an embedding app, which
    stops us its own way) nothing changes: signals reach only the main thread."""

    def handler(signum, frame):
        raise error(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)

"""WorkQueue: the API's one-at-a-time model work, in arrival order, with a bounded wait.

The models are not re-entrant (`TranscriptionService` holds a lock; the text model has one
too), so running requests side by side would only make each slower. One worker thread runs the
submitted jobs in order; at most `size` may wait behind the running one, and a request beyond
that is refused at once (HTTP 429) rather than left to stall. The web page's Gradio queue has
its own bound of the same size and meets these jobs at the service's lock.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import TypeVar

from .events import until_done

T = TypeVar("T")
E = TypeVar("E")


class QueueFull(Exception):
    """`size` jobs are already waiting."""


class WorkQueue:
    """Runs jobs on one daemon thread, first in first out; `size` >= 1 may wait."""

    def __init__(self, size: int, name: str = "specscribe-api") -> None:
        if size < 1:
            raise ValueError(f"queue size must be at least 1, not {size}")
        self.size = size
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[[], object]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._waiting = 0
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Jobs submitted and not started yet."""
        return self._waiting

    def submit(self, job: Callable[[], T]) -> Future[T]:
        """Queues `job`; raises QueueFull when `size` jobs wait already. A future cancelled
        before its turn is skipped."""
        future: Future[T] = Future()
        with self._lock:
            if self._waiting >= self.size:
                raise QueueFull(f"{self._waiting} requests are waiting (--queue-size {self.size})")
            self._waiting += 1
        self._jobs.put((future, job))
        return future

    def submit_streaming(
        self, job: Callable[[Callable[[E], None]], T]
    ) -> tuple[asyncio.Future[T], AsyncIterator[E]]:
        """Queues `job(emit)` as `submit` does (QueueFull included); what the job emits from
        the worker thread comes out of the returned iterator, in order, until the job ends; its
        result or exception is the returned future's. Call it from the event loop."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[E] = asyncio.Queue()

        def emit(item: E) -> None:
            loop.call_soon_threadsafe(items.put_nowait, item)

        done = asyncio.wrap_future(self.submit(lambda: job(emit)))
        return done, until_done(done, items)

    async def run(self, job: Callable[[], T]) -> T:
        """Queues `job` and waits for its result (its exception) without blocking the event
        loop; a request cancelled while waiting gives up its place."""
        future = self.submit(job)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def close(self) -> None:
        """Lets the worker thread end after the jobs queued so far."""
        self._jobs.put(None)

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, job = item
            with self._lock:
                self._waiting -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = job()
            except BaseException as error:  # handed to the request that asked for it
                future.set_exception(error)
            else:
                future.set_result(result)

"""WorkQueue: the API's one-at-a-time model work, in arrival order, with a bounded wait.

The models are not re-entrant (`TranscriptionService` holds a lock; the text model has one
too), so running requests side by side would only make each slower. One worker thread runs the
submitted jobs in order; at most `size` may wait behind the running one, and a request beyond
that is refused at once (HTTP 429) rather than left to stall. A request takes its place
(`reserve`) before its audio is decoded, so requests that arrive together cannot all decode
hours of audio first; a request whose client has gone gives its place back at once, and a
running job is asked to stop (`run`'s `abandoned` and `stop`: transcriptions stop after the
window being decoded, a text completion at its next piece of text). The web page's Gradio
queue has its own bound of the same size and meets these jobs at the service's lock.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from typing import TypeVar

from fastapi.responses import StreamingResponse

from .events import until_done

T = TypeVar("T")
E = TypeVar("E")


class QueueFull(Exception):
    """`size` jobs are already waiting."""


class Abandoned(Exception):
    """The client that asked for a job went away (`WorkQueue.run`)."""


def until_stopped(stop: threading.Event, then: Callable[..., None]) -> Callable[..., None]:
    """A transcription's hook (a decided window, progress) that passes each call on to `then`
    until `stop` is set (its client went away, its page was closed), and then ends the
    transcription by raising Abandoned."""

    def hook(*args) -> None:
        if stop.is_set():
            raise Abandoned("the client went away")
        then(*args)

    return hook


class ShuttingDown(Exception):
    """The server is stopping (`WorkQueue.shut_down`): the job was not run, or not to its end."""


class Place:
    """A place among the waiting jobs, held from `WorkQueue.reserve` until a job takes it
    (`submit`) or it is released (leaving a `with` block, or `release`)."""

    def __init__(self, work: WorkQueue) -> None:
        self._work = work
        self._held = True

    def take(self) -> None:
        """Hands the place to a job (which gives it back when it starts)."""
        if not self._held:
            raise RuntimeError("this place was released or taken already")
        self._held = False

    def release(self) -> None:
        if self._held:
            self._held = False
            self._work._leave()

    def __enter__(self) -> Place:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class _Job:
    """A submitted job; `counted` while it holds a place among the waiting."""

    def __init__(self, future: Future, run: Callable[[], object]) -> None:
        self.future = future
        self.run = run
        self.counted = True


class WorkQueue:
    """Runs jobs on one daemon thread, first in first out; `size` >= 1 may wait."""

    def __init__(self, size: int, name: str = "specscribe-api") -> None:
        if size < 1:
            raise ValueError(f"queue size must be at least 1, not {size}")
        self.size = size
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._by_future: dict[Future, _Job] = {}
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = False
        self._stopping = threading.Event()
        self._deadline = float("inf")  # time.monotonic() by which a running job must end
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Places held: jobs submitted and not started yet, and reservations."""
        return self._waiting

    @property
    def running(self) -> bool:
        """Whether a job runs now."""
        return self._running

    @property
    def stopping(self) -> bool:
        """Whether `shut_down` was called: no job is taken any more."""
        return self._stopping.is_set()

    def reserve(self) -> Place:
        """Takes a place for a job to come; raises QueueFull when `size` are held already and
        a job runs (while none runs, one more: the first of them will run at once)."""
        with self._lock:
            if self._stopping.is_set():
                raise ShuttingDown(_SHUTTING_DOWN)
            if self._waiting >= self.size + (0 if self._running else 1):
                raise QueueFull(f"{self._waiting} requests are waiting (--queue-size {self.size})")
            self._waiting += 1
        return Place(self)

    def submit(self, job: Callable[[], T], place: Place | None = None) -> Future[T]:
        """Queues `job` in `place` (None: takes one, raising QueueFull when `size` are held).
        A future cancelled before its turn (`cancel`) is skipped."""
        if place is None:
            place = self.reserve()
        place.take()
        future: Future[T] = Future()
        item = _Job(future, job)
        with self._lock:
            self._by_future[future] = item
        self._jobs.put(item)
        return future

    def cancel(self, future: Future) -> bool:
        """Cancels a job that has not started, giving its place back now; False once it runs."""
        with self._lock:
            item = self._by_future.get(future)
            if item is None or not future.cancel():
                return False
            self._give_back_place(item)
            return True

    def submit_streaming(
        self, job: Callable[[Callable[[E], None]], T], place: Place | None = None
    ) -> tuple[asyncio.Future[T], AsyncIterator[E]]:
        """Queues `job(emit)` as `submit` does (QueueFull included); what the job emits from
        the worker thread comes out of the returned iterator, in order, until the job ends; its
        result or exception is the returned future's. Call it from the event loop. Cancelling
        the returned future gives a job that has not started its place back. Once the server
        is shutting down, the iterator raises ShuttingDown where `run` would (the job has not
        started, or runs past its grace) and cancels the future, so that a stream ends with
        its error event before the server closes its connection, not cut off mid-body."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[E] = asyncio.Queue()

        def emit(item: E) -> None:
            loop.call_soon_threadsafe(items.put_nowait, item)

        future = self.submit(lambda: job(emit), place)
        done = asyncio.wrap_future(future)
        done.add_done_callback(lambda d: self.cancel(future) if d.cancelled() else None)

        def check() -> None:
            if self._past_grace(future):
                done.cancel()  # a running job is asked to stop through its callbacks
                raise ShuttingDown(_SHUTTING_DOWN)

        return done, until_done(done, items, check, ABANDON_POLL_SECONDS)

    def _past_grace(self, future: Future) -> bool:
        """Whether the server is stopping and `future`'s job is not to be waited for: it has
        not started, or it has run past the grace `shut_down` gave it."""
        return self._stopping.is_set() and (
            not future.running() or time.monotonic() >= self._deadline
        )

    async def run(
        self,
        job: Callable[[], T],
        place: Place | None = None,
        abandoned: Callable[[], Awaitable[bool]] | None = None,
        stop: threading.Event | None = None,
    ) -> T:
        """Queues `job` and waits for its result (its exception) without blocking the event
        loop. A request cancelled while waiting gives up its place. abandoned: polled while
        waiting (a client's disconnect); once true the job is cancelled if it has not
        started, `stop` is set for a running job to notice, and Abandoned is raised. Once the
        server is shutting down (`shut_down`), a job that has not started, or that runs past
        the grace it was given, is given up the same way, raising ShuttingDown."""
        future = self.submit(job, place)
        waiter = asyncio.wrap_future(future)
        try:
            while True:
                finished, _ = await asyncio.wait({waiter}, timeout=ABANDON_POLL_SECONDS)
                if finished:
                    return waiter.result()
                if abandoned is not None and await abandoned():
                    self._give_up(future, waiter, stop)
                    raise Abandoned("the client went away")
                if self._past_grace(future):
                    self._give_up(future, waiter, stop)
                    raise ShuttingDown(_SHUTTING_DOWN)
        except asyncio.CancelledError:
            self._give_up(future, waiter, stop)
            raise

    def _give_up(
        self, future: Future, waiter: asyncio.Future, stop: threading.Event | None
    ) -> None:
        """Nobody waits for `future` any more: cancel it if it has not started, ask it to stop
        if it has, and let its end go unread without asyncio logging it as lost."""
        self.cancel(future)
        if stop is not None:
            stop.set()
        waiter.add_done_callback(lambda done: done.cancelled() or done.exception())

    def shut_down(self, grace: float) -> None:
        """The server is stopping: no job is taken or started from now on (ShuttingDown), and
        a running one has `grace` seconds before its request is answered ShuttingDown and it
        is asked to stop (`run`), so that every request is answered before the server closes
        its connections."""
        self._deadline = time.monotonic() + grace
        self._stopping.set()

    def close(self, timeout: float | None = None) -> None:
        """Lets the worker thread end after the jobs queued so far, waiting up to `timeout`
        seconds for it (None: not at all)."""
        self._jobs.put(None)
        if timeout is not None:
            self._thread.join(timeout)

    def _give_back_place(self, item: _Job) -> None:
        """`item`'s place among the waiting, once (it starts, or is cancelled); under the lock."""
        if item.counted:
            item.counted = False
            self._waiting -= 1

    def _leave(self) -> None:
        with self._lock:
            self._waiting -= 1

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            with self._lock:  # the place passes to the running job in one step (`reserve`)
                self._by_future.pop(item.future, None)
                self._give_back_place(item)
                self._running = item.future.set_running_or_notify_cancel()
            if not self._running:
                continue
            try:
                if self._stopping.is_set():  # a stream's job, queued when the server stopped
                    raise ShuttingDown(_SHUTTING_DOWN)
                result = item.run()
            except BaseException as error:  # handed to the request that asked for it
                item.future.set_exception(error)
            else:
                item.future.set_result(result)
            finally:
                with self._lock:
                    self._running = False


class HeldAudio:
    """Seconds of decoded audio that the API's requests hold, waiting or running, kept under
    a budget. A request decodes before it queues (ffmpeg runs beside the job in progress),
    so each waiting request holds its samples: sixteen 3-hour uploads would have held 11 GB.
    One request is always let in where nothing is held, whatever its length."""

    def __init__(self, budget_seconds: float) -> None:
        self.budget_seconds = budget_seconds
        self._held = 0.0
        self._lock = threading.Lock()

    @property
    def held_seconds(self) -> float:
        return self._held

    def take(self, seconds: float) -> bool:
        """Counts `seconds` as held, unless that passes the budget (False: nothing counted)."""
        with self._lock:
            if self._held > 0 and self._held + seconds > self.budget_seconds:
                return False
            self._held += seconds
            return True

    def give_back(self, seconds: float) -> None:
        with self._lock:
            self._held = max(0.0, self._held - seconds)


# How often a waiting request checks that its client is still there.
ABANDON_POLL_SECONDS = 0.5
_SHUTTING_DOWN = "the server is shutting down; send the request again once it is back"


class ClosingStream(StreamingResponse):
    """A StreamingResponse that calls `on_close` however it ends: sent whole, cut off by the
    client, or never started (a client gone before the first byte: the ASGI server then
    cancels the response before its body generator runs, so the generator's own `finally`
    never does)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], object], **kwargs):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()

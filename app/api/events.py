"""Server-sent events: the `data:` lines both streaming routes write, and the items a queued
job hands over while it runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def sse(data: dict[str, Any]) -> str:
    """One server-sent event carrying `data` as JSON."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def until_done(
    done: asyncio.Future,
    items: asyncio.Queue[T],
    check: Callable[[], None] | None = None,
    every: float = 0.5,
) -> AsyncIterator[T]:
    """The items put on `items`, in order, until `done` completes and none are left (its
    result or exception stays with `done`). check: called before each item and after every
    `every` seconds without one; whatever it raises ends the iteration (a server that stops)."""
    waiter = None
    try:
        while True:
            if check is not None and not done.done():
                check()
            waiter = asyncio.ensure_future(items.get())
            await asyncio.wait(
                {waiter, done},
                timeout=every if check is not None else None,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not waiter.done():
                waiter.cancel()
                if done.done() and items.empty():
                    return
                continue  # an item left, or the wait timed out (only with a check)
            yield waiter.result()
    finally:
        # A reader that stops early (a client gone mid-stream) cancels this generator inside
        # the wait: its pending get() is cancelled here, not left for the garbage collector
        # ("Task was destroyed but it is pending").
        if waiter is not None and not waiter.done():
            waiter.cancel()

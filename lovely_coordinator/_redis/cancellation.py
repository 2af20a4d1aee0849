"""Cancellation that redis-py loses on Python 3.11, delivered again.

redis-py sends each command through ``asyncio.wait_for`` (bounded by the socket timeout).
On Python 3.11, ``wait_for`` swallows a cancellation that arrives just as the command it
waits for completes (CPython gh-86296; rewritten on ``asyncio.timeout`` in 3.12): the call
returns its result, and the task carries on, still marked as cancelling. A loop that
awaits redis-py over and over (the renewal watchdog, a waiting acquire, the pub/sub
listener, the gates' resync loop) would then outlive a cancellation it was sent once, as
``asyncio.run()`` does at shutdown, and keep the event loop from ever closing: a lease
held at shutdown with a short ttl did exactly that, in about one run out of ten.

:func:`call` awaits one redis-py call and, if a cancellation was requested meanwhile and
not delivered, raises it; :func:`mark` and :func:`deliver` do the same around a stretch of
code that awaits redis-py several times. (anyio re-delivers its own cancellations at the
next checkpoint anyway; a native ``Task.cancel()`` is delivered once only, so this matters
for those.) Only a cancellation requested *during* the stretch counts, so a task already
marked as cancelling (by code that caught a cancellation without ``uncancel()``) is not
cancelled again by this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["call", "deliver", "mark"]

T = TypeVar("T")


def mark() -> int:
    """How many cancellations of the current task are pending (to pass to :func:`deliver`)."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def deliver(since: int) -> None:
    """Raise ``CancelledError`` if the task was sent a cancellation after :func:`mark`."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > since:
        raise asyncio.CancelledError


async def call(awaitable: Awaitable[T]) -> T:
    """``await awaitable``, then raise a cancellation that arrived during it and was lost."""
    since = mark()
    result = await awaitable
    deliver(since)
    return result

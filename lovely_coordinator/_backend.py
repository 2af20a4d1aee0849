"""The two event-loop services that anyio does not offer to synchronous code.

Scheduling calls such as ``close_tuple(t, reopen_after=...)`` are plain functions, yet they
must arrange for something to happen later on the running event loop: a timed reopen, or
the asynchronous delivery of a statistics update. anyio has no public "call soon / call
later" for sync code, so this module is the single place that reaches for the running
backend: ``loop.call_soon``/``loop.call_at`` on asyncio, the trio token and a system task
on trio. Times are absolute and on the anyio clock (``anyio.current_time()``), which is the
loop's own clock on asyncio and trio's clock (including a ``MockClock``) on trio.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "NoEventLoop",
    "Timer",
    "call_at",
    "call_soon",
    "current_loop",
    "current_time_or_none",
]

_log = logging.getLogger("lovely_coordinator")


class NoEventLoop(RuntimeError):
    """No asyncio loop or trio run is active in this thread."""


class Timer(Protocol):
    """A pending call; ``cancel()`` is idempotent and safe after it ran."""

    def cancel(self) -> None: ...


def _trio_lowlevel() -> Any | None:
    """trio's lowlevel module if a trio run is active in this thread, else None."""
    trio = sys.modules.get("trio")
    if trio is None:
        return None
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None
    return trio.lowlevel


def _guarded(fn: Callable[[], object]) -> Callable[[], None]:
    # A callback that raises must never take the event loop (or trio's run) down with it.
    def run() -> None:
        try:
            fn()
        except Exception:
            _log.exception("lovely_coordinator: callback %r failed", fn)

    return run


def current_loop() -> object | None:
    """An identity for the running event loop: the asyncio loop, or the trio run's token.

    Two ``anyio.run`` calls never share one (an object kept alive by the caller is not
    reused for a later loop). None outside an event loop.
    """
    # asyncio's non-raising lookup first: an exception per call would cost microseconds.
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return trio.lowlevel.current_trio_token()  # type: ignore[no-any-return]
        except RuntimeError:
            pass
    return None


def current_time_or_none() -> float | None:
    """The anyio clock's time, or None outside an event loop."""
    lowlevel = _trio_lowlevel()
    if lowlevel is not None:
        return float(sys.modules["trio"].current_time())
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return None


def call_soon(fn: Callable[[], object]) -> None:
    """Run ``fn()`` on the current event loop soon, outside the caller's stack frame.

    Raises:
        NoEventLoop: called outside an asyncio loop or a trio run.
    """
    lowlevel = _trio_lowlevel()
    if lowlevel is not None:
        lowlevel.current_trio_token().run_sync_soon(_guarded(fn))
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise NoEventLoop("no running event loop") from None
    loop.call_soon(_guarded(fn))


class _TrioTimer:
    __slots__ = ("_scope",)

    def __init__(self, scope: Any) -> None:
        self._scope = scope

    def cancel(self) -> None:
        self._scope.cancel()


def call_at(deadline: float, fn: Callable[[], object]) -> Timer:
    """Run ``fn()`` once the anyio clock reaches ``deadline``; returns a cancellable handle.

    Raises:
        NoEventLoop: called outside an asyncio loop or a trio run.
    """
    lowlevel = _trio_lowlevel()
    if lowlevel is not None:
        trio = sys.modules["trio"]
        scope = trio.CancelScope()
        call = _guarded(fn)

        async def sleeper() -> None:
            with scope:
                await trio.sleep_until(deadline)
                call()

        lowlevel.spawn_system_task(sleeper, name="lovely_coordinator timer")
        return _TrioTimer(scope)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise NoEventLoop("no running event loop") from None
    return loop.call_at(deadline, _guarded(fn))

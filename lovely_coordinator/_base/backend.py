"""The event-loop services anyio does not offer to synchronous code, in one place.

Scheduling calls such as ``close_tuple(t, reopen_after=...)`` are plain functions, yet they
must arrange for something to happen later on an event loop: a timed reopen, a budget
wake-up, the delivery of a statistics update, the wake-up of a task parked on another
thread's loop. anyio has no public "call soon / call later" for sync code, so this module is
the single place that reaches for the running backend: ``loop.call_soon``/``call_at``
(and ``call_soon_threadsafe``) on asyncio, the trio token and a system task on trio. It is
also the one place that tells which backend is running.

A *loop identity* is the running asyncio loop or the trio run's ``TrioToken``: hashable,
never shared by two runs, and enough to schedule a call on that loop from any thread.
Times are absolute, on that loop's anyio clock (``anyio.current_time()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import sys
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

__all__ = [
    "NoEventLoop",
    "Timer",
    "call_at",
    "call_soon",
    "call_soon_on",
    "current_loop",
    "current_task",
    "current_time_or_none",
    "loop_alive",
    "trio_running",
]

_log = logging.getLogger("lovely_coordinator")

_sniffio_thread: Any
try:
    # trio sets ``thread_local.name = "trio"`` while it runs a task (sniffio's protocol).
    # Imported by name: sniffio is trio's dependency, not ours (nor anyio's since 4.12), so
    # the library type-checks without it.
    _sniffio_thread = importlib.import_module("sniffio").thread_local
except ModuleNotFoundError:  # pragma: no cover - trio requires sniffio, so: asyncio only
    _sniffio_thread = threading.local()


class NoEventLoop(RuntimeError):
    """No asyncio loop or trio run is active in this thread."""


class Timer(Protocol):
    """A pending call; ``cancel()`` is idempotent and safe after it ran."""

    def cancel(self) -> None: ...


def trio_running() -> bool:
    """Whether the calling code runs in a trio task (cheap: a thread-local read)."""
    return getattr(_sniffio_thread, "name", None) == "trio"


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
    """The identity of the running event loop (see the module docstring), or None."""
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


def current_task() -> object | None:
    """The running task (an ``asyncio.Task`` or a trio ``Task``), or None."""
    if trio_running():
        return sys.modules["trio"].lowlevel.current_task()  # type: ignore[no-any-return]
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def current_time_or_none() -> float | None:
    """The anyio clock's time, or None outside an event loop."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop.time()
    if _trio_lowlevel() is not None:
        return float(sys.modules["trio"].current_time())
    return None


def loop_alive(loop: object) -> bool:
    """Whether the event loop with this identity may still run callbacks."""
    if isinstance(loop, asyncio.AbstractEventLoop):
        return loop.is_running() and not loop.is_closed()
    try:
        loop.run_sync_soon(_noop)  # type: ignore[attr-defined]
    except RuntimeError:  # trio.RunFinishedError
        return False
    return True


def _noop() -> None:
    pass


def call_soon(fn: Callable[[], object]) -> None:
    """Run ``fn()`` on the current event loop soon, outside the caller's stack frame.

    Raises:
        NoEventLoop: called outside an asyncio loop or a trio run.
    """
    loop = asyncio._get_running_loop()
    if loop is not None:
        loop.call_soon(_guarded(fn))
        return
    lowlevel = _trio_lowlevel()
    if lowlevel is None:
        raise NoEventLoop("no running event loop")
    lowlevel.current_trio_token().run_sync_soon(_guarded(fn))


def call_soon_on(loop: object, fn: Callable[[], object]) -> bool:
    """Run ``fn()`` soon on the event loop ``loop``, from any thread; False if it ended."""
    try:
        if isinstance(loop, asyncio.AbstractEventLoop):
            if loop is asyncio._get_running_loop():
                loop.call_soon(_guarded(fn))
            else:
                loop.call_soon_threadsafe(_guarded(fn))
        else:
            loop.run_sync_soon(_guarded(fn))  # type: ignore[attr-defined]
    except RuntimeError:  # the loop is closed, or trio.RunFinishedError
        return False
    return True


class _TrioTimer:
    __slots__ = ("_scope",)

    def __init__(self, scope: Any) -> None:
        self._scope = scope

    def cancel(self) -> None:
        self._scope.cancel()


class _AsyncioTimer:
    """A ``loop.call_at`` timer that sees its loop's shutdown: an async generator.

    Not a task: a task armed while ``asyncio.run()`` cancels the loop's tasks (by a
    task's cleanup) would miss that cancel, never run and never tell its loss. The loop
    closes its async generators after cancelling its tasks (``asyncio.run()``, anyio's
    runners), and the generator's ``finally`` reports a timer still pending then. Nor is
    it listed by ``asyncio.all_tasks()``, which shutdown code waits for or cancels.
    """

    __slots__ = ("_handle", "_lost", "_watch")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        deadline: float,
        fn: Callable[[], None],
        lost: Callable[[], None],
    ) -> None:
        self._lost: Callable[[], None] | None = lost
        self._handle = loop.call_at(deadline, self._run, fn)
        self._watch: Any = None
        if not getattr(loop, "_asyncgens_shutdown_called", False):
            self._watch = watch = self._lost_at_shutdown()
            with contextlib.suppress(StopIteration):
                watch.asend(None).send(None)  # its first step: the loop now tracks it

    async def _lost_at_shutdown(self) -> AsyncGenerator[None]:
        try:
            yield
        finally:
            lost, self._lost, self._watch = self._lost, None, None
            if lost is not None:  # the loop shuts down with the timer pending
                self._handle.cancel()
                lost()

    def _run(self, fn: Callable[[], None]) -> None:
        self.cancel()
        fn()

    def cancel(self) -> None:
        self._lost = None
        self._handle.cancel()
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(StopIteration):
                watch.aclose().send(None)  # closed now: the loop has nothing to finalize


def call_at(
    deadline: float, fn: Callable[[], object], on_lost: Callable[[], object] | None = None
) -> Timer:
    """Run ``fn()`` once the current loop's anyio clock reaches ``deadline``.

    With ``on_lost``, the loop's shutdown with the timer pending is seen (an async
    generator the loop closes on asyncio, a system task on trio): ``on_lost()`` runs
    then, instead of ``fn()``.
    Returns a handle whose ``cancel()`` may only be called on that loop's thread.

    Raises:
        NoEventLoop: called outside an asyncio loop or a trio run.
    """
    loop = asyncio._get_running_loop()
    if loop is not None and on_lost is None:
        return loop.call_at(deadline, _guarded(fn))
    call = _guarded(fn)
    lost = _guarded(on_lost) if on_lost is not None else None
    if loop is not None:
        assert lost is not None
        return _AsyncioTimer(loop, deadline, call, lost)
    lowlevel = _trio_lowlevel()
    if lowlevel is None:
        raise NoEventLoop("no running event loop")
    trio = sys.modules["trio"]
    scope = trio.CancelScope()

    async def sleeper() -> None:
        try:
            with scope:
                await trio.sleep_until(deadline)
                call()
        except trio.Cancelled:
            # Not when it was cancelled itself: the run's cancel, ending it as well, then
            # passes its scope (which catches only a cancel of its own alone).
            if lost is not None and not scope.cancel_called:
                lost()  # the run ends with the timer pending
            raise

    lowlevel.spawn_system_task(sleeper, name="lovely_coordinator timer")
    return _TrioTimer(scope)

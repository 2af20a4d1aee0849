"""Lanes: one activation per key under a global cap (the async runner).

The decisions (who starts, who waits, who gets a freed slot) live in the synchronous
:class:`~.state.LanesState`, the config and outcome values in :mod:`.types`;
this module only runs what the state decides. Each recorded
activation gets one task in the lanes' task group. That task is shielded from outside
cancellation for its whole life, so it always reaches its end and frees its slot; the
lanes stop it on purpose by cancelling the *body's* own scope (on ``cancel``, ``close``
or the turn timeout), never the finalizers or ``on_exit``.

One activation's task, in order:

1. If a stop was written before the task ran, report ``ActivationInterrupted`` without
   calling ``activate``.
2. Run ``activate(key)`` in a cancel scope with the turn deadline (the *body*).
3. Close the activation's exit stack, still shielded, so a stop landing now cannot
   change the body's outcome.
4. Report the outcome to ``on_exit``, shielded.
5. Finish in one synchronous step: free the slot, re-queue the lane if it was woken
   meanwhile, hand the slot on, wake ``cancel``/``close`` waiters, spawn the successor.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Final, final

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from .._base.errors import LanesConfigTypeError, UsageError
from .._base.outcomes import failures_of, is_fatal
from .._base.validate import as_callable
from .state import (
    ActivationRecord,
    LanesState,
    LanesStatus,
    StopReason,
    WakeResult,
)
from .types import (
    Activation,
    ActivationFailed,
    ActivationInterrupted,
    ActivationSucceeded,
    Exit,
    LanesConfig,
    current_activation_var,
)

__all__ = ["Lanes", "create_lanes"]

_log = logging.getLogger("lovely_coordinator.lanes")

OTHER_THREAD: Final = (
    "Lanes.wake() was called from another thread: lanes belong to the event loop that"
    " entered create_lanes(); from a worker thread, call"
    " anyio.from_thread.run_sync(lanes.wake, key)"
)


class _Run(ActivationRecord):
    """The record plus what the runner needs to stop and await one activation."""

    __slots__ = ("ended", "fatal", "scope")

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.scope: anyio.CancelScope | None = None  # the body's scope, while it runs
        # A KeyboardInterrupt or SystemExit the body raised beside its stop: the stop
        # decides the outcome, and this still ends the lanes once the activation is over.
        self.fatal: BaseException | None = None
        # Set once the activation has ended and its slot was handed on. Created only when
        # someone waits: an Event is the right tool because ending is a broadcast of a
        # fact (many cancel/close callers may wait), not the grant of something a
        # cancelled waiter would have to hand on, which is what Parker is for.
        self.ended: anyio.Event | None = None


@final
class Lanes:
    """Per-key lanes under a global concurrency cap. Obtain one from :func:`create_lanes`.

    A wake of an idle lane starts its activation if a slot is free and nobody waits, or
    queues it at the tail; a wake of a queued lane, or of a running one beyond the first,
    coalesces into the one activation owed. A freed slot goes to the lane that waited
    longest; a lane woken while it ran waits behind the lanes queued meanwhile.
    """

    __slots__ = (
        "_activate",
        "_context",
        "_max_concurrent",
        "_on_exit",
        "_state",
        "_task_group",
        "_thread",
        "_timeout",
    )

    def __init__(
        self,
        config: LanesConfig,
        activate: Callable[[str], Awaitable[object]],
        on_exit: Callable[[Exit], object] | None,
        task_group: TaskGroup,
        context: contextvars.Context,
    ) -> None:
        """Internal: use :func:`create_lanes`."""
        self._state: LanesState[_Run] = LanesState(config.max_concurrent, config.max_queued, _Run)
        self._max_concurrent = config.max_concurrent
        self._timeout = math.inf if config.turn_timeout is None else config.turn_timeout
        self._activate = activate
        self._on_exit = on_exit
        self._task_group = task_group
        self._context = context
        # The event loop's thread: a wake from any other would record an activation and
        # then fail to spawn its task, leaking the slot (and hanging close()).
        self._thread = threading.get_ident()

    def __repr__(self) -> str:
        state = self._state
        running = f"{len(state.running)}/{self._max_concurrent} running"
        closed = ", closed" if state.closed else ""
        return f"<Lanes {running}, {state.queued} queued{closed}>"

    def wake(self, key: str) -> WakeResult:
        """Ask for one more activation of ``key``. Never waits.

        Returns:
            ``"started"`` (an activation was started now), ``"queued"`` (the lane waits
            for a slot) or ``"coalesced"`` (an activation owed already serves this wake).

        Raises:
            LanesClosed: the lanes are closed.
            LaneQueueFull: the lane would have to wait and ``max_queued`` lanes already do.
            UsageError: called from a thread other than the event loop's; nothing changes.
        """
        if threading.get_ident() != self._thread:
            raise UsageError(OTHER_THREAD)
        result, started = self._state.wake(key)
        if started is not None:
            self._spawn(started)
        return result

    async def cancel(self, key: str) -> None:
        """Drop the wakes ``key`` owes and interrupt its running activation.

        Returns once that activation has ended, finalizers and ``on_exit`` included, and
        its slot has been handed on; at once if nothing runs. Wakes that arrive later are
        served as usual. The cancellation takes effect even if the caller is cancelled
        while it waits. Never call this from ``on_exit`` for the key being reported: it
        would wait for itself.

        Raises:
            InvalidArgumentTypeError: ``key`` is not a ``str``.
        """
        record = self._state.cancel(key)
        if record is None:
            await anyio.lowlevel.checkpoint()
            return
        ended = _ended(record)
        self._stop(record, "cancel")
        await ended.wait()

    async def close(self) -> None:
        """Refuse later wakes, drop the queue, interrupt every activation and await them.

        Idempotent: a later call stops and awaits whatever still runs. Runs when the
        ``async with create_lanes(...)`` block exits.
        """
        records = self._state.close()
        # Every Event is created before the first await: a record that finished while we
        # waited for another would otherwise never set one created afterwards.
        events = [_ended(record) for record in records]
        for record in records:
            self._stop(record, "close")
        if not events:
            await anyio.lowlevel.checkpoint()
        for event in events:
            await event.wait()

    def status(self) -> LanesStatus:
        """A snapshot: counts, whether closed, and every non-idle lane."""
        return self._state.status()

    def _stop(self, record: _Run, reason: StopReason) -> None:
        if record.stop is None:
            scope = record.scope
            # The deadline cancels the body's scope without writing a reason; if it got
            # there before this stop, the timeout is the first reason.
            record.stop = "timeout" if scope is not None and scope.cancel_called else reason
        if record.scope is not None:
            record.scope.cancel()

    def _spawn(self, record: _Run) -> None:
        # Activations run in (a copy of) the context the lanes were created in, whoever
        # woke them. A fresh copy per spawn, because Context.run cannot be re-entered
        # should a task factory start the task eagerly and it wake another lane.
        self._context.copy().run(self._start_task, record)

    def _start_task(self, record: _Run) -> None:
        self._task_group.start_soon(self._run, record, name=f"lanes activation {record.key!r}")

    async def _run(self, record: _Run) -> None:
        with anyio.CancelScope(shield=True):
            try:
                outcome = await self._execute(record)
                on_exit_stops = await self._report(outcome)
            finally:
                started = self._state.finish(record)
                if record.ended is not None:
                    record.ended.set()
                if started is not None:
                    self._spawn(started)
        # KeyboardInterrupt and SystemExit ask the program to stop, not one activation:
        # reported like any other exception first, they then end the lanes.
        if on_exit_stops is not None:
            raise on_exit_stops
        if isinstance(outcome, ActivationFailed) and is_fatal(outcome.cause):
            raise outcome.cause
        if record.fatal is not None:
            raise record.fatal

    async def _execute(self, record: _Run) -> Exit:
        key = record.key
        if record.stop is not None:
            return ActivationInterrupted(key, record.stop)
        started_at = anyio.current_time()
        activation = Activation(key, started_at, AsyncExitStack())
        token = current_activation_var.set(activation)
        try:
            cause: BaseException | None = None
            try:
                with anyio.CancelScope(deadline=started_at + self._timeout) as scope:
                    record.scope = scope
                    await self._activate(key)
            except BaseException as exc:  # a defect or self-interruption: the body's outcome
                cause = exc
            record.scope = None
            if record.stop is None and scope.cancel_called:
                record.stop = "timeout"
            reason = record.stop  # any stop from here on leaves the outcome alone
            # Errors the body raised beside the stop: the stop decides, but they are logged,
            # not lost.
            failures = None if reason is None or cause is None else failures_of(cause)
            if failures is not None:
                _log.error(
                    "an activation of %r failed while it was being stopped",
                    key,
                    exc_info=failures,
                )
                if is_fatal(failures):
                    record.fatal = failures
            try:
                await activation.exit_stack.aclose()
            except BaseException as exc:
                return ActivationFailed(key, exc)
        finally:
            current_activation_var.reset(token)
        if reason is not None:
            return ActivationInterrupted(key, reason)
        if cause is not None:
            return ActivationFailed(key, cause)
        return ActivationSucceeded(key)

    async def _report(self, outcome: Exit) -> BaseException | None:
        """Call ``on_exit``; returns what it raised if that must stop the program."""
        if self._on_exit is None:
            return None
        try:
            result = self._on_exit(outcome)
            if inspect.isawaitable(result):
                await result
        except BaseException as exc:
            # on_exit runs shielded, so no stop of ours can land in it: whatever it raised,
            # a cancellation included, is its own, and never reaches the lanes.
            _log.warning("on_exit failed for %s", outcome.key, exc_info=exc)
            if is_fatal(exc):
                return exc
        return None


def _ended(record: _Run) -> anyio.Event:
    if record.ended is None:
        record.ended = anyio.Event()
    return record.ended


@final
class _LanesScope:
    """The async context manager :func:`create_lanes` returns (single use)."""

    __slots__ = ("_activate", "_config", "_lanes", "_left", "_on_exit", "_task_group")

    def __init__(
        self,
        config: LanesConfig,
        activate: Callable[[str], Awaitable[object]],
        on_exit: Callable[[Exit], object] | None,
    ) -> None:
        self._config = config
        self._activate = activate
        self._on_exit = on_exit
        self._task_group: TaskGroup | None = None
        self._lanes: Lanes | None = None
        self._left = False

    async def __aenter__(self) -> Lanes:
        if self._left:
            raise UsageError(
                "a create_lanes() context manager can be entered only once: leaving its"
                " block closed its lanes for good; call create_lanes() again"
            )
        if self._task_group is not None:
            raise UsageError(
                "this create_lanes() context manager is already entered: one 'async with'"
                " block owns its lanes; share the Lanes it gave instead of entering it again"
            )
        task_group = self._task_group = anyio.create_task_group()
        await task_group.__aenter__()
        context = contextvars.copy_context()
        self._lanes = Lanes(self._config, self._activate, self._on_exit, task_group, context)
        return self._lanes

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._task_group is not None
        assert self._lanes is not None
        try:
            with anyio.CancelScope(shield=True):
                await self._lanes.close()
        finally:
            # Every activation has ended and none can start, so the task group is empty.
            # It never sees the block's exception: the block is not one of its tasks, and
            # a nursery would wrap that exception in an ExceptionGroup on trio. Its exit
            # may still notice a cancellation of the caller; the block's own exception
            # takes precedence over that (the cancellation is level-triggered, it is
            # delivered again at the caller's next checkpoint).
            self._left = True
            try:
                await self._task_group.__aexit__(None, None, None)
            except anyio.get_cancelled_exc_class():
                if exc is None:
                    raise
        return None


def create_lanes(
    max_concurrent: int,
    max_queued: int | None = None,
    turn_timeout: float | None = None,
    *,
    activate: Callable[[str], Awaitable[object]],
    on_exit: Callable[[Exit], object] | None = None,
) -> AbstractAsyncContextManager[Lanes]:
    """Lanes for ``async with``: one activation per key, at most ``max_concurrent`` at once.

    Activations run in the contextvars context the ``async with`` was entered in. Leaving
    the block closes the lanes: later wakes fail, the queue is dropped, and every running
    activation is interrupted and awaited.

    Whatever an activation or ``on_exit`` raises (``BaseException`` subclasses and a
    cancellation of its own included) becomes an ``ActivationFailed`` or a logged warning,
    and never reaches the lanes, the block or another activation. ``KeyboardInterrupt``
    and ``SystemExit`` are the exception: reported or logged first, they then propagate
    and end the lanes, as they end an asyncio or trio program from any task.

    Args:
        max_concurrent: activations running at once across all keys (int ≥ 1).
        max_queued: lanes allowed to wait for a slot (int ≥ 0), or None for no bound.
        turn_timeout: seconds before a running activation is interrupted (finite, > 0),
            or None.
        activate: the work for one key, ``await activate(key)``.
        on_exit: called with how each activation ended (``ActivationSucceeded``,
            ``ActivationFailed`` or ``ActivationInterrupted``), exactly once per
            activation, shielded; it may be sync or async. An exception it raises is
            logged as a warning (``on_exit failed for <key>``, with the exception). It
            must not wait for ``cancel``/``close`` itself.

    Raises:
        LanesConfigInvalid: a setting is invalid; for ``activate``/``on_exit`` that are
            not callable, a subclass that is also an
            :class:`~lovely_coordinator.InvalidArgumentTypeError` (a ``TypeError``).
            Nothing is created.
        UsageError: (entering the returned context manager) it was entered before.
    """
    config = LanesConfig(
        max_concurrent=max_concurrent, max_queued=max_queued, turn_timeout=turn_timeout
    )
    as_callable(
        activate, "Invalid lanes config: activate must be callable", type_error=LanesConfigTypeError
    )
    if on_exit is not None:
        as_callable(
            on_exit,
            "Invalid lanes config: on_exit must be callable or None",
            type_error=LanesConfigTypeError,
        )
    return _LanesScope(config, activate, on_exit)

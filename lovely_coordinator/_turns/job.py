"""One turn of a conversation: the :class:`Job`, and how a turn's outcome is decided.

A job moves forward through four phases: *new* (built, not submitted), *queued* (waiting
behind the running turn of its conversation), *current* (its registry is taking its
turn: ``on_dequeue``, the lease, the body, the release) and *done*. The registry drives
those moves through the job's private methods; the job never looks into the registry.

How a turn ends, the rules :meth:`Job._call` applies when its body ends:

* **The stop decides.** If something stopped the turn while its body ran (an
  ``interrupt``, a lost lease, the registry's block left by an exception or a
  cancellation), the turn ends with that stop (:class:`TurnInterrupted` or
  :class:`LeaseLostError`), however the body then ended: returning a partial result,
  raising, or catching the cancellation. The turn's cancel scope is shielded, so these
  stops, each recorded on the job before its scope is cancelled, are the only
  cancellations from outside that can reach the body.
* **Otherwise the body decides**: what it returned, or what it raised, of any kind:
  ``BaseException`` subclasses that frameworks use for aborts, and a cancellation of its
  own (it awaited something another task cancelled) included. Each is recorded on the
  job and logged; nothing else is cancelled. A cancellation the body raised by itself is
  recorded as it is, but :meth:`TurnRegistry.run` raises :class:`TurnInterrupted` from
  it: raised bare in the caller's task, it would pass for the caller being cancelled.
* ``KeyboardInterrupt`` and ``SystemExit`` ask the *program* to stop, not one turn: they
  are recorded like the rest, then propagate and end the registry (as they end an
  asyncio or trio program from any task).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Generic, Literal, TypeVar, cast, final

import anyio
import anyio.lowlevel

from .._base.errors import (
    CoordinatorError,
    LeaseLostError,
    TurnDropped,
    TurnInterrupted,
    UsageError,
)
from .._base.outcomes import failures_of, is_fatal
from .._base.validate import as_callable

__all__ = ["Job", "enter_turn", "leave_turn", "running_turn"]

T = TypeVar("T")

_log = logging.getLogger("lovely_coordinator.turns")

_NEW: Final = 0
_QUEUED: Final = 1
_CURRENT: Final = 2  # its registry is taking its turn
_DONE: Final = 3

_Phase = Literal[0, 1, 2, 3]

WAIT_BEHIND: Final = (
    "a turn cannot wait for a later turn of its own conversation: that turn starts only"
    " after this one has ended, so the wait would never return; let it run after this one"
)


def _call_back(callback: Callable[..., object] | None, *args: object) -> None:
    if callback is None:
        return
    try:
        callback(*args)
    except BaseException as exc:  # user code: contained, unless the program must stop
        if is_fatal(exc):
            raise
        _log.error("turn callback %r failed", callback, exc_info=exc)


# The job whose turn's body (or a task it started) is running here. Reset after the turn,
# so that the task's context can serve the next turn.
_running_turn: Final = contextvars.ContextVar["Job[Any] | None"](
    "lovely_coordinator.turns.running_turn", default=None
)


def running_turn() -> Job[Any] | None:
    """The job whose turn the caller is part of (its body or a task it started), if any."""
    return _running_turn.get()


def enter_turn(job: Job[Any]) -> contextvars.Token[Job[Any] | None]:
    """Mark the calling task as taking ``job``'s turn (tasks its body starts inherit it)."""
    return _running_turn.set(job)


def leave_turn(token: contextvars.Token[Job[Any] | None]) -> None:
    _running_turn.reset(token)


@final
class Job(Generic[T]):
    """One turn of a conversation, submitted once to a :class:`TurnRegistry`.

    Args:
        run: the turn, an async function called with the lease's fencing token (0
            without a locker); what it returns becomes :attr:`result`.
        on_dequeue: called (sync) when a job that had to wait reaches the head of its
            queue, just before its lease is acquired (or it runs, without a locker).
            Never called for a job that started at once, for a dropped one, nor for one
            refused without a lease attempt because the registry drains.
        on_refused: called (sync) with the error when the turn is refused: the lease could
            not be had (:class:`CoordinationUnavailableError`) or the registry was draining
            (:class:`DrainingError`).

    Raises:
        InvalidArgumentTypeError: ``run`` is not callable, or a callback is neither
            callable nor None.

    Exceptions raised by the callbacks, of any kind, are logged and otherwise ignored
    (``KeyboardInterrupt`` and ``SystemExit`` propagate, as from a turn).
    """

    # A job's completion is a broadcast to any number of waiters (its run() caller, a
    # UI task, ...) that hands nothing over, so a waiter cancelled after the wake-up has
    # nothing to give back: a level-triggered anyio.Event owned by the job is the whole
    # mechanism, and Parker (one waiter, grant/undo) would add nothing. The event is made
    # lazily because a Job may be built outside an event loop.
    __slots__ = (
        "_body_ended",
        "_context",
        "_conversation",
        "_dropped",
        "_error",
        "_event",
        "_on_dequeue",
        "_on_refused",
        "_owner",
        "_phase",
        "_result",
        "_run",
        "_scope",
        "_stop",
    )

    def __init__(
        self,
        run: Callable[[int], Awaitable[T]],
        on_dequeue: Callable[[], object] | None = None,
        on_refused: Callable[[BaseException], object] | None = None,
    ) -> None:
        self._run = as_callable(run, "run must be callable: an async function taking the fence")
        if on_dequeue is not None:
            as_callable(on_dequeue, "on_dequeue must be callable or None")
        if on_refused is not None:
            as_callable(on_refused, "on_refused must be callable or None")
        self._on_dequeue = on_dequeue
        self._on_refused = on_refused
        self._phase: _Phase = _NEW
        self._dropped = False
        self._error: BaseException | None = None
        self._result: T | None = None
        self._event: anyio.Event | None = None
        # Where the job was admitted: its registry (identity only) and conversation.
        self._owner: object = None
        self._conversation = ""
        # The turn's (shielded) cancel scope while the body may run, and the first
        # reason to stop it (TurnInterrupted or LeaseLostError), which decides the outcome.
        self._scope: anyio.CancelScope | None = None
        self._stop: CoordinatorError | None = None
        self._body_ended = False
        # The context of the submit() that queued the job; its turn is taken in it.
        self._context: contextvars.Context | None = None

    @property
    def done(self) -> bool:
        """True once the job ran, failed, was refused or was dropped (and reached)."""
        return self._phase == _DONE

    @property
    def dropped(self) -> bool:
        """True if the job will never run (its ``run`` caller left, or it was replaced)."""
        return self._dropped

    @property
    def error(self) -> BaseException | None:
        """The turn's exception, the refusal, or the interruption; None on success."""
        return self._error

    @property
    def result(self) -> T | None:
        """What ``run`` returned, once :attr:`done` with :attr:`error` None; else None.

        A dropped job never ran, and a stopped turn's partial result is discarded (the
        stop decides), so both leave it None.
        """
        return self._result

    async def wait(self) -> None:
        """Wait until :attr:`done`. Always a checkpoint; never raises the job's error.

        Raises:
            UsageError: called from a running turn, or a task it started, for a job
                queued behind that turn: it could only be done after the caller's turn
                ended. The job stays queued.
        """
        if self._phase == _DONE:
            await anyio.lowlevel.checkpoint()
            return
        if self._phase == _QUEUED:
            running = _running_turn.get()
            if running is not None and running._is_turn_of(self._owner, self._conversation):
                raise UsageError(WAIT_BEHIND)
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()

    def __repr__(self) -> str:
        phase = ("new", "queued", "current", "done")[self._phase]
        flags = " dropped" if self._dropped else ""
        return f"<Job {phase}{flags} error={self._error!r}>"

    # -- driven by the registry ---------------------------------------------------------

    @property
    def _is_new(self) -> bool:
        return self._phase == _NEW

    def _is_turn_of(self, owner: object, conversation_id: str) -> bool:
        """Whether this job's turn is being taken in that registry's conversation."""
        return (
            self._phase == _CURRENT
            and self._owner is owner
            and self._conversation == conversation_id
        )

    def _admit(self, owner: object, conversation_id: str, queued: bool) -> None:
        """Submitted: it waits (remembering the submitter's context) or is current."""
        self._owner = owner
        self._conversation = conversation_id
        if queued:
            self._phase = _QUEUED
            self._context = contextvars.copy_context()
        else:
            self._phase = _CURRENT

    def _reach(self) -> bool:
        """It reached the head of its queue; False if it was dropped (to be skipped)."""
        self._phase = _CURRENT
        return not self._dropped

    def _take_context(self) -> contextvars.Context:
        """The submitter's context, handed over once (``Context.run`` is not reentrant)."""
        context, self._context = self._context, None
        assert context is not None, "only a job that waited has a context to hand over"
        return context

    def _abandon(self) -> None:
        """Its ``run`` caller left: a queued job is dropped (skipped when reached)."""
        if self._phase == _QUEUED:
            self._dropped = True

    def _drop(self) -> None:
        """Dropped by double texting: it will never be reached, so it is done now."""
        self._dropped = True
        self._finish()

    def _finish(self) -> None:
        self._phase = _DONE
        self._scope = None
        self._context = None
        self._owner = None
        if self._event is not None:
            self._event.set()

    def _refuse(self, error: CoordinatorError) -> None:
        self._error = error
        _call_back(self._on_refused, error)

    def _dequeued(self) -> None:
        _call_back(self._on_dequeue)

    def _interrupt(self, reason: CoordinatorError) -> None:
        """Stop the turn with ``reason``, unless another reason came first."""
        if self._stop is None:
            self._stop = reason
        if self._scope is not None:
            self._scope.cancel()

    @property
    def _stopped(self) -> bool:
        return self._stop is not None

    def _open_scope(self) -> anyio.CancelScope:
        """The cancel scope the turn is taken in; only :meth:`_interrupt` cancels it.

        Shielded: a cancellation of a scope around the registry never reaches a turn
        directly, because the registry turns it into a stop of each turn (leaving its
        block by a cancellation interrupts them). So every stop a turn can see is one
        recorded in ``_stop``, and any other cancellation out of its body is its own.
        """
        self._scope = anyio.CancelScope(shield=True)
        return self._scope

    def _close_scope(self) -> None:
        self._scope = None

    def _end_stopped(self) -> None:
        """The turn ends by its stop, or by the registry's (or a scope's) cancellation."""
        self._error = self._stop if self._stop is not None else TurnInterrupted()

    def _lose_lease(self) -> None:
        """The lease was lost before the body began: the turn never runs."""
        self._interrupt(LeaseLostError())
        self._end_stopped()

    def _end_by_shutdown(self) -> None:
        """The registry was left while this job was current and its turn not over."""
        if not self._body_ended and self._error is None:
            self._end_stopped()
        self._finish()

    async def _call(self, fence: int, conversation_id: str) -> None:
        """Run the body in the turn's scope and record how it ended (module docstring).

        Returns normally however the body ended, the stop's cancellation included (the
        turn's own scope is the only one it can belong to), except for
        ``KeyboardInterrupt`` and ``SystemExit``.
        """
        try:
            result = await self._run(fence)
        except BaseException as exc:
            self._body_ended = True
            if is_fatal(exc):
                self._error = exc
                raise
            self._record_raised(exc, conversation_id)
            return
        self._body_ended = True
        if self._stop is not None:
            self._end_stopped()
        else:
            self._result = result

    def _record_raised(self, exc: BaseException, conversation_id: str) -> None:
        failures = failures_of(exc)
        if self._stop is not None:
            self._end_stopped()
            if failures is not None:  # errors beside the cancellation: logged, not lost
                _log.error(
                    "a turn of conversation %r failed while it was being stopped",
                    conversation_id,
                    exc_info=failures,
                )
            return
        if failures is None:
            # A cancellation nothing here asked for: the body's own (it awaited a future
            # another task cancelled, say). A failure like any other.
            self._error = exc
            _log.error(
                "a turn of conversation %r raised a cancellation that nothing asked for",
                conversation_id,
                exc_info=exc,
            )
            return
        self._error = failures
        _log.error("a turn of conversation %r failed", conversation_id, exc_info=failures)

    def _outcome(self) -> T:
        """What :meth:`TurnRegistry.run` returns or raises for this done job."""
        if self._dropped:
            raise TurnDropped
        error = self._error
        if error is None:
            return cast(T, self._result)
        if failures_of(error) is None:  # the body's own cancellation, not the caller's
            raise TurnInterrupted("the turn ended by a cancellation it raised itself") from error
        raise error

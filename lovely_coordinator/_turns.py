"""Per-conversation turn queues: the async shell over :mod:`._turns_state`.

:class:`TurnRegistry` owns a task group. :meth:`~TurnRegistry.submit` starts a task for a
turn that starts at once; when a turn ends, its task ends it and takes the next one (or
forgets the conversation) in one synchronous step. Every turn runs in the contextvars
context of the ``submit`` that admitted it: the task takes the next turn itself only while
its context holds the very values that turn's submitter had (one submitter, turns that set
nothing: the common case), and otherwise spawns the turn a task of its own in the
submitter's context. So a turn never sees the values of whoever started the conversation,
nor those an earlier turn set. Which job runs next is decided by the
:class:`~._turns_state.TurnTable`; this module only carries out its decisions.

One turn, as its task takes it: ``on_dequeue`` (jobs that waited), the lease (with a
locker), ``job.run(fence)`` inside a cancel scope that ``interrupt`` and a lost lease
cancel, the shielded lease release, and finally the job is marked done.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Final, Literal, Protocol, TypeVar, cast, final

import anyio
import anyio.abc
import anyio.lowlevel

from ._errors import (
    CoordinationUnavailableError,
    CoordinatorError,
    DrainingError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LeaseLostError,
    TurnDropped,
    TurnInterrupted,
)
from ._turns_state import Multitask, TurnTable, check_multitask

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "RELEASE_TIMEOUT",
    "Job",
    "Lease",
    "LeaseSignal",
    "Locker",
    "TurnRegistry",
]

T = TypeVar("T")

DEFAULT_MAX_QUEUED: Final = 10
"""How many turns may wait behind the running one in a conversation, by default."""

RELEASE_TIMEOUT: Final = 30.0
"""Seconds a lease's release may take before it is abandoned (and left to lapse)."""

_log = logging.getLogger("lovely_coordinator.turns")


class LeaseSignal(Protocol):
    """What :attr:`Lease.lost` must offer; :class:`anyio.Event` is one."""

    def is_set(self) -> bool: ...

    async def wait(self) -> object: ...


class Lease(Protocol):
    """A held cross-replica lock on one conversation."""

    @property
    def fence(self) -> int:
        """The fencing token of this grant; strictly increases per conversation."""
        ...

    @property
    def lost(self) -> LeaseSignal:
        """Set once the lease can no longer be shown to be held; the turn is then cancelled."""
        ...

    async def release(self) -> None:
        """Give the lease up; idempotent."""
        ...


class Locker(Protocol):
    """Serializes a conversation's turns across server replicas (one lease per turn)."""

    async def acquire(self, conversation_id: str) -> Lease:
        """Wait (cancellably) until this replica holds the conversation's lease.

        An exception means the lease could not be had; the turn is then refused with
        :class:`CoordinationUnavailableError`.
        """
        ...


_NEW: Final = 0
_QUEUED: Final = 1
_CURRENT: Final = 2  # its task is taking its turn
_DONE: Final = 3

_Phase = Literal[0, 1, 2, 3]


@final
class Job:
    """One turn of a conversation, submitted once to a :class:`TurnRegistry`.

    Args:
        run: the turn; called with the lease's fencing token (0 without a locker).
        on_dequeue: called (sync) when a job that had to wait reaches the head of its
            queue, just before its lease is acquired (or it runs, without a locker).
            Never called for a job that started at once, for a dropped one, nor for one
            refused without a lease attempt because the registry drains.
        on_refused: called (sync) with the error when the turn is refused: the lease could
            not be had (:class:`CoordinationUnavailableError`) or the registry was draining
            (:class:`DrainingError`).

    Exceptions raised by the callbacks are logged and otherwise ignored.
    """

    # A job's completion is a broadcast to any number of waiters (its run() caller, a
    # UI task, ...) that hands nothing over, so a waiter cancelled after the wake-up has
    # nothing to give back: a level-triggered anyio.Event owned by the job is the whole
    # mechanism, and Parker (one waiter, grant/undo) would add nothing. The event is made
    # lazily because a Job may be built outside an event loop.
    __slots__ = (
        "_body_ended",
        "_context",
        "_dropped",
        "_error",
        "_event",
        "_phase",
        "_result",
        "_scope",
        "_stop",
        "on_dequeue",
        "on_refused",
        "run",
    )

    def __init__(
        self,
        run: Callable[[int], Awaitable[object]],
        on_dequeue: Callable[[], object] | None = None,
        on_refused: Callable[[BaseException], object] | None = None,
    ) -> None:
        self.run = run
        self.on_dequeue = on_dequeue
        self.on_refused = on_refused
        self._phase: _Phase = _NEW
        self._dropped = False
        self._error: BaseException | None = None
        self._result: object = None
        self._event: anyio.Event | None = None
        # The turn's cancel scope while its task takes it, and the first reason to stop
        # it (TurnInterrupted or LeaseLostError), recorded as the job's error if the
        # cancellation is what ended the body.
        self._scope: anyio.CancelScope | None = None
        self._stop: CoordinatorError | None = None
        self._body_ended = False
        # The context of the submit() that queued the job; its turn's task is spawned in it.
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

    async def wait(self) -> None:
        """Wait until :attr:`done`. Always a checkpoint; never raises the job's error.

        Raises:
            RuntimeError: (a :class:`~lovely_coordinator.CoordinatorError`) called from a
                running turn, or a task it started, for a job queued behind that turn: it
                could only be done after the caller's turn ended. The job stays queued.
        """
        if self._phase == _DONE:
            await anyio.lowlevel.checkpoint()
            return
        running = _running_turn.get()
        if running is not None and self._phase == _QUEUED:
            registry, conversation_id, _ = running
            if registry._in_turn_of(conversation_id) and self in registry._table.pending(
                conversation_id
            ):
                raise _MisuseError(
                    "a turn cannot wait for a later turn of its own conversation;"
                    " let it run after this one"
                )
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()

    def __repr__(self) -> str:
        phase = ("new", "queued", "current", "done")[self._phase]
        flags = " dropped" if self._dropped else ""
        return f"<Job {phase}{flags} error={self._error!r}>"


def _call_back(callback: Callable[..., object] | None, *args: object) -> None:
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        _log.exception("turn callback %r failed", callback)


def _finish(job: Job) -> None:
    job._phase = _DONE
    job._scope = None
    job._context = None
    if job._event is not None:
        job._event.set()


def _refuse(job: Job, error: CoordinatorError) -> None:
    job._error = error
    _call_back(job.on_refused, error)


def _stop(job: Job, reason: CoordinatorError) -> None:
    """Cancel the job's turn with ``reason``, unless another reason came first."""
    if job._stop is None:
        job._stop = reason
    if job._scope is not None:
        job._scope.cancel()


_ABSENT: Final = object()


def _same_values(a: contextvars.Context, b: contextvars.Context) -> bool:
    """Whether both contexts hold the very same object (``is``) for every variable.

    Identity, not equality: two requests' equal but distinct values (two empty lists of
    spans, say) must stay apart.
    """
    return len(a) == len(b) and all(b.get(var, _ABSENT) is value for var, value in a.items())


def _check_conversation_id(conversation_id: object) -> str:
    if not isinstance(conversation_id, str):
        raise InvalidArgumentTypeError("conversation_id must be a nonempty string")
    if not conversation_id:
        raise InvalidArgumentError("conversation_id must be a nonempty string")
    return conversation_id


class _MisuseError(CoordinatorError, RuntimeError):
    """A programming error, such as a certain deadlock.

    Raised when the registry is used outside its ``async with`` lifecycle, or when a turn
    would wait for a later turn of its own conversation.
    """


# The turn whose body (or a task it started) is running here: its registry, conversation
# and job. Reset after the turn, so that the task's context can serve the next turn.
_running_turn: Final = contextvars.ContextVar[tuple["TurnRegistry", str, Job] | None](
    "lovely_coordinator.turns.running_turn", default=None
)


_UNENTERED: Final = 0
_OPEN: Final = 1
_CANCELLING: Final = 2  # leaving the block by an exception: the turn tasks are cancelled
_CLOSED: Final = 3


@final
class TurnRegistry:
    """The turn queues of every conversation a server handles.

    A conversation runs one turn at a time, in submission order, whichever door the turns
    came through. Use it as an async context manager: it owns the task group the
    turns' tasks live in. Leaving the block normally drains and waits for every
    admitted turn; leaving it by an exception or a cancellation cancels them (the running
    turns end with :class:`TurnInterrupted`, the queued ones are refused with
    :class:`DrainingError`).

    Each turn runs in a copy of the contextvars context of the :meth:`submit` (or
    :meth:`run`) call that admitted it, so request-scoped values (a tracing id, the current
    user, :func:`~lovely_coordinator.current_permit`) follow the turn, whoever else submitted
    to the conversation before it. Values a turn sets stay in its own copy. A turn may
    :meth:`submit` to its own conversation, but not wait for that later turn: :meth:`run`
    and :meth:`Job.wait` raise rather than deadlock.

    Args:
        locker: serializes turns across replicas; each turn first takes a lease from it
            and runs with the lease's fence. None (single replica) runs turns with fence 0.
        max_queued: how many turns may wait behind the running one, per conversation
            (an int ≥ 0; 0 lets nothing wait).

    Raises:
        InvalidArgumentError: ``max_queued`` is not a nonnegative integer.

    Like every anyio primitive it belongs to one event loop: call it from that loop's
    thread only.
    """

    def __init__(self, locker: Locker | None = None, max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        self._table: TurnTable[Job] = TurnTable(max_queued)
        self._locker = locker
        self._task_group: anyio.abc.TaskGroup | None = None
        self._lifecycle = _UNENTERED
        # Set (and forgotten) when the last busy conversation becomes idle; made on demand.
        self._idle: anyio.Event | None = None
        # The cancel scopes of the lease acquisitions in progress, which drain() cancels.
        self._acquiring: dict[Job, anyio.CancelScope] = {}

    @property
    def max_queued(self) -> int:
        """How many turns may wait behind the running one, per conversation."""
        return self._table.max_queued

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` was called (or the ``async with`` block was left)."""
        return self._table.draining

    def __repr__(self) -> str:
        return f"<TurnRegistry busy={len(self._table)} draining={self._table.draining}>"

    async def __aenter__(self) -> TurnRegistry:
        if self._lifecycle != _UNENTERED:
            raise _MisuseError("a TurnRegistry can be entered only once")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self._lifecycle = _OPEN
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task_group = self._task_group
        assert task_group is not None, "__aexit__ without __aenter__"
        self.drain()
        failed_wait: BaseException | None = None
        if exc is None:
            try:
                await self.wait()
            except BaseException as error:
                failed_wait = error
        leaving_by = exc if exc is not None else failed_wait
        if leaving_by is not None:
            self._lifecycle = _CANCELLING
            task_group.cancel_scope.cancel()
        # The turn tasks never raise (a turn's failure is recorded on its job), so the task
        # group only needs to see a cancellation, which may be its own; any other
        # exception from the body propagates as it is, not wrapped in an exception group.
        cancelled = leaving_by if isinstance(leaving_by, anyio.get_cancelled_exc_class()) else None
        suppressed = False
        try:
            if cancelled is None:
                await task_group.__aexit__(None, None, None)
            else:
                suppressed = await task_group.__aexit__(
                    type(cancelled), cancelled, cancelled.__traceback__
                )
        finally:
            self._lifecycle = _CLOSED
            self._task_group = None
            self._sweep()
        if suppressed:
            return True
        if failed_wait is not None:
            raise failed_wait
        return False

    def submit(self, conversation_id: str, job: Job, multitask: Multitask = "enqueue") -> int:
        """Hand ``job`` to the conversation's queue; never waits.

        Returns:
            0 when the turn started now, else the job's 1-based position among the
            turns waiting (fixed at submission; dropped jobs not yet reached count).

        Raises:
            DrainingError: after :meth:`drain` (or once the registry was left).
            ConversationBusyError: ``multitask="reject"`` and a turn runs or waits.
            QueueFullError: ``max_queued`` turns already wait.
            InvalidArgumentError: a bad ``conversation_id``, ``multitask``, or a job that
                was submitted before.

        When it raises, the job is untouched and never runs.
        """
        conversation_id = _check_conversation_id(conversation_id)
        if not isinstance(job, Job):
            raise InvalidArgumentTypeError("job must be a Job")
        if job._phase != _NEW:
            raise InvalidArgumentError("a Job can be submitted only once")
        mode = check_multitask(multitask)
        if self._lifecycle == _UNENTERED:
            raise _MisuseError("enter the TurnRegistry with 'async with' before submitting turns")
        admission = self._table.admit(conversation_id, job, mode)
        for dropped in admission.dropped:
            dropped._dropped = True
            _finish(dropped)
        if admission.interrupted is not None:
            _stop(admission.interrupted, TurnInterrupted())
        if admission.position:
            job._phase = _QUEUED
            job._context = contextvars.copy_context()
        else:
            job._phase = _CURRENT
            # start_soon copies the current context: the task runs in the caller's.
            assert self._task_group is not None
            self._task_group.start_soon(self._turn_task, conversation_id, job, False)
        return admission.position

    async def run(
        self,
        conversation_id: str,
        run: Callable[[int], Awaitable[T]],
        multitask: Multitask = "enqueue",
    ) -> T:
        """Submit ``run`` as a turn and wait for it; returns its result or re-raises.

        Cancelled while the turn waits, the job is dropped (skipped when reached); once
        the turn has started it keeps running, and only this caller is cancelled.

        Raises:
            TurnDropped: the job was dropped by ``interrupt``/``replace_queued``.
            TurnInterrupted, LeaseLostError: the turn was cancelled.
            DrainingError, CoordinationUnavailableError: the turn was refused.
            RuntimeError: (a :class:`~lovely_coordinator.CoordinatorError`) called from a
                running turn of the same conversation, or a task it started: the new turn
                could only start after the caller's own turn ended, so waiting would
                deadlock. Nothing is submitted; :meth:`submit` is allowed there.
            ...and everything :meth:`submit` raises, and the turn's own exception.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._in_turn_of(conversation_id):
            raise _MisuseError(
                "a turn cannot wait for a later turn of its own conversation; submit() it instead"
            )
        job = Job(run)
        self.submit(conversation_id, job, multitask)
        try:
            await job.wait()
        except BaseException:
            if job._phase == _QUEUED:
                job._dropped = True
            raise
        if job._dropped:
            raise TurnDropped
        if job._error is not None:
            raise job._error
        return cast(T, job._result)

    def _in_turn_of(self, conversation_id: str) -> bool:
        """Whether the caller is a running turn of the conversation (or a task it started)."""
        running = _running_turn.get()
        return (
            running is not None
            and running[0] is self
            and running[1] == conversation_id
            and self._table.current(conversation_id) is running[2]
        )

    def waiting(self, conversation_id: str) -> int:
        """How many turns wait (not running) in the conversation; 0 when idle or unknown.

        Dropped jobs not yet reached count: they hold their place until then.

        Raises:
            InvalidArgumentError: ``conversation_id`` is not a nonempty string.
        """
        return self._table.waiting(_check_conversation_id(conversation_id))

    def drain(self) -> None:
        """Refuse new turns with :class:`DrainingError`; idempotent.

        Running turns go on. Without a locker, queued turns still run; with one, lease
        acquisitions in progress are cancelled and every turn that has not got its lease
        yet is refused with :class:`DrainingError`.
        """
        self._table.draining = True
        for scope in self._acquiring.values():
            scope.cancel()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until every admitted turn has finished.

        Args:
            timeout: seconds to wait at most; None waits without limit.

        Returns:
            True when no turn remains, False when ``timeout`` passed first.
        """
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or math.isnan(timeout)
            or timeout < 0
        ):
            raise InvalidArgumentError("timeout must be a nonnegative number or None")
        if not self._table:
            await anyio.lowlevel.checkpoint()
            return True
        if self._idle is None:
            self._idle = anyio.Event()
        idle = self._idle
        with anyio.move_on_after(timeout):
            await idle.wait()
            return True
        return False

    # -- the turn tasks ---------------------------------------------------------------

    async def _turn_task(self, conversation_id: str, job: Job, waited: bool) -> None:
        # A registry being cancelled starts no turn's code; _sweep() ends the jobs left.
        while self._lifecycle == _OPEN:
            token = _running_turn.set((self, conversation_id, job))
            await self._take_turn(conversation_id, job, waited)
            _running_turn.reset(token)
            next_job = self._advance(conversation_id, job)
            if next_job is None:
                return
            context, next_job._context = next_job._context, None
            assert context is not None
            if not _same_values(context, contextvars.copy_context()):
                # The next turn gets a task of its own, spawned in its submitter's context.
                # (The context is used once: Context.run cannot be re-entered.)
                assert self._task_group is not None
                context.run(
                    self._task_group.start_soon, self._turn_task, conversation_id, next_job, True
                )
                return
            # This task's context holds the very values the next turn's submitter had (the
            # common case: one submitter, and turns that set no variable), so taking the
            # turn here cannot be told from taking it in a copy of that context, and saves
            # spawning a task per turn.
            job, waited = next_job, True

    def _advance(self, conversation_id: str, job: Job) -> Job | None:
        """Finish ``job`` and return the next job to take, forgetting an idle conversation.

        Dropped jobs reached on the way are finished and skipped.
        """
        while True:
            _finish(job)
            next_job = self._table.advance(conversation_id, job)
            if next_job is None:
                if not self._table:
                    self._became_idle()
                return None
            next_job._phase = _CURRENT
            if not next_job._dropped:
                return next_job
            job = next_job

    async def _take_turn(self, conversation_id: str, job: Job, waited: bool) -> None:
        """Take the job's turn, recording its outcome on it (the caller finishes it)."""
        if self._locker is not None and self._table.draining and job._stop is None:
            # No lease will be acquired, so there is no dequeue to announce.
            _refuse(job, DrainingError())
            return
        if waited:
            _call_back(job.on_dequeue)
        if job._stop is not None:  # interrupted before its turn began
            job._error = job._stop
            return
        with anyio.CancelScope() as scope:
            job._scope = scope
            if self._locker is None:
                await self._call(conversation_id, job, 0)
            else:
                await self._take_leased_turn(conversation_id, job, self._locker)
        job._scope = None
        if scope.cancelled_caught and not job._body_ended:
            job._error = job._stop

    async def _take_leased_turn(self, conversation_id: str, job: Job, locker: Locker) -> None:
        if self._table.draining:  # drain() was called by on_dequeue
            _refuse(job, DrainingError())
            return
        lease: Lease | None = None
        with anyio.CancelScope() as acquiring:
            self._acquiring[job] = acquiring
            try:
                lease = await locker.acquire(conversation_id)
            except Exception as exc:
                refusal: CoordinatorError
                if acquiring.cancel_called:
                    refusal = DrainingError()
                else:
                    refusal = CoordinationUnavailableError()
                    _log.warning(
                        "could not lock conversation %r for a turn", conversation_id, exc_info=exc
                    )
                refusal.__cause__ = exc
                _refuse(job, refusal)
                return
            finally:
                del self._acquiring[job]
                if not self._acquiring:
                    self._acquiring = {}  # give a burst's dict capacity back
        if lease is None:  # drain() cancelled the acquisition
            _refuse(job, DrainingError())
            return
        try:
            if lease.lost.is_set():
                job._error = LeaseLostError()
                return
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(_cancel_on_loss, lease, job)
                await self._call(conversation_id, job, lease.fence)
                task_group.cancel_scope.cancel()
        finally:
            # Shielded, so a cancelled turn still gives its lease back; bounded, so a
            # locker that hangs cannot wedge the conversation (an unreleased lease lapses
            # by itself).
            with anyio.move_on_after(RELEASE_TIMEOUT, shield=True) as bound:
                try:
                    await lease.release()
                except Exception:
                    _log.exception("releasing the lease of conversation %r failed", conversation_id)
            if bound.cancelled_caught:
                _log.warning(
                    "releasing the lease of conversation %r took over %s s; abandoned",
                    conversation_id,
                    RELEASE_TIMEOUT,
                )

    @staticmethod
    async def _call(conversation_id: str, job: Job, fence: int) -> None:
        try:
            job._result = await job.run(fence)
        except Exception as exc:
            job._error = exc
            _log.error("a turn of conversation %r failed", conversation_id, exc_info=exc)
        except BaseExceptionGroup as group:
            # A cancellation beside errors, as a task group in the body reports a child
            # that failed while it was cancelled. Raised on, it would reach the registry's
            # task group as an error and tear every conversation down.
            cancelled, errors = group.split(anyio.get_cancelled_exc_class())
            if cancelled is None or (errors is not None and errors.split(Exception)[1] is not None):
                raise  # KeyboardInterrupt, SystemExit...: as when raised bare
            if errors is not None:
                _log.error("a turn of conversation %r failed", conversation_id, exc_info=errors)
            job._body_ended = True
            if anyio.current_effective_deadline() != -math.inf:
                # Nothing cancels the turn: the cancellation in the group is nobody's.
                job._error = errors if errors is not None else TurnInterrupted()
                return
            # We are cancelling the turn (interrupt, lost lease, shutdown, or a scope
            # around the registry): an interruption, however the body took it. The
            # cancellation is level-triggered, so this checkpoint raises it again, bare,
            # for the scope it belongs to.
            job._error = job._stop if job._stop is not None else TurnInterrupted()
            await anyio.lowlevel.checkpoint()
            return
        job._body_ended = True

    def _became_idle(self) -> None:
        if self._idle is not None:
            self._idle.set()
            self._idle = None

    def _sweep(self) -> None:
        """End every job left after the turn tasks were cancelled (registry shutdown)."""
        for conversation_id in self._table.busy():
            current, *pending = self._table.forget(conversation_id)
            if not current._body_ended and current._error is None:
                current._error = TurnInterrupted()
            _finish(current)
            for job in pending:
                if not job._dropped:
                    _refuse(job, DrainingError())
                _finish(job)
        self._became_idle()


async def _cancel_on_loss(lease: Lease, job: Job) -> None:
    await lease.lost.wait()
    _stop(job, LeaseLostError())

"""Per-conversation turn queues: the async shell over :mod:`.state`.

:class:`TurnRegistry` owns a task group. :meth:`~TurnRegistry.submit` starts a task for a
turn that starts at once; when a turn ends, its task ends it and takes the next one (or
forgets the conversation) in one synchronous step. Every turn runs in the contextvars
context of the ``submit`` that admitted it: the task takes the next turn itself only while
its context holds the very values that turn's submitter had (one submitter, turns that set
nothing: the common case), and otherwise spawns the turn a task of its own in the
submitter's context. So a turn never sees the values of whoever started the conversation,
nor those an earlier turn set. Which job runs next is decided by the
:class:`~.state.TurnTable`; how a turn's outcome is decided, by the
:class:`~.job.Job`; this module only carries out their decisions.

One turn, as its task takes it: ``on_dequeue`` (jobs that waited), the lease (with a
locker, see ``lease.py``), ``job.run(fence)`` in the turn's shielded cancel scope,
which only the turn's stops cancel (``interrupt``, a lost lease, the block left early),
the shielded lease release, and finally the job is marked done.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final, TypeVar, final

import anyio
import anyio.abc
import anyio.lowlevel

from .._base.errors import (
    DrainingError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    TurnInterrupted,
    UsageError,
)
from .._base.validate import as_seconds
from .job import Job, enter_turn, leave_turn, running_turn
from .lease import LeasedTurns
from .state import (
    Multitask,
    TurnStatistics,
    TurnTable,
    check_conversation_id,
    check_multitask,
)
from .types import DEFAULT_MAX_QUEUED, Locker

__all__ = ["TurnRegistry"]

T = TypeVar("T")

_ABSENT: Final = object()

SELF_RUN: Final = (
    "a turn cannot run() a later turn of its own conversation and wait for it: that turn"
    " starts only after this one has ended, so the wait would never return; submit() it"
    " instead"
)


def _same_values(a: contextvars.Context, b: contextvars.Context) -> bool:
    """Whether both contexts hold the very same object (``is``) for every variable.

    Identity, not equality: two requests' equal but distinct values (two empty lists of
    spans, say) must stay apart.
    """
    return len(a) == len(b) and all(b.get(var, _ABSENT) is value for var, value in a.items())


OTHER_THREAD: Final = (
    "TurnRegistry.submit() was called from another thread: a TurnRegistry belongs to the"
    " event loop that entered it; from a worker thread, call"
    " anyio.from_thread.run_sync(turns.submit, ...)"
)

_UNENTERED: Final = 0
_OPEN: Final = 1
_CANCELLING: Final = 2  # leaving the block by an exception: every turn is stopped
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
    and :meth:`Job.wait` raise :class:`UsageError` rather than deadlock.

    Whatever a turn raises is recorded on its job and logged, and never reaches the
    registry, the caller's block or another conversation; see :class:`Job` for how a
    turn's outcome is decided (a stop that lands while it runs decides it).
    ``KeyboardInterrupt`` and ``SystemExit`` are the exception: recorded, then they
    propagate and end the registry.

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
        self._table: TurnTable[Job[Any]] = TurnTable(max_queued)
        self._leases = None if locker is None else LeasedTurns(locker)
        self._task_group: anyio.abc.TaskGroup | None = None
        self._lifecycle = _UNENTERED
        # Set (and forgotten) when the last busy conversation becomes idle; made on demand.
        self._idle: anyio.Event | None = None
        # The thread of the event loop that entered the registry: submit() from any other
        # would change the table and then fail to start the turn's task, wedging its
        # conversation.
        self._thread: int | None = None

    @property
    def max_queued(self) -> int:
        """How many turns may wait behind the running one, per conversation."""
        return self._table.max_queued

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` was called (or the ``async with`` block was left)."""
        return self._table.draining

    def statistics(self) -> TurnStatistics:
        """A snapshot: busy conversations, running and waiting turns, and draining."""
        return self._table.statistics()

    def __repr__(self) -> str:
        return f"<TurnRegistry busy={len(self._table)} draining={self._table.draining}>"

    async def __aenter__(self) -> TurnRegistry:
        if self._lifecycle == _OPEN:
            raise UsageError(
                "this TurnRegistry is already entered: one 'async with' block owns its"
                " turns; share the registry it gave instead of entering it again"
            )
        if self._lifecycle != _UNENTERED:
            raise UsageError(
                "a TurnRegistry can be entered only once: leaving its 'async with' block"
                " ended its turns for good; create a new TurnRegistry"
            )
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self._thread = threading.get_ident()
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
            # The turns' scopes are shielded: the registry stops each one itself (and the
            # turn tasks take no next turn), rather than cancelling the task group.
            self._lifecycle = _CANCELLING
            for conversation_id in self._table.busy():
                current = self._table.current(conversation_id)
                assert current is not None
                current._interrupt(TurnInterrupted())
        # The turn tasks never raise (a turn's failure is recorded on its job; only
        # KeyboardInterrupt and SystemExit escape), so the task group only needs to see a
        # cancellation, which may be its own; any other exception from the body propagates
        # as it is, not wrapped in an exception group.
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

    def submit(self, conversation_id: str, job: Job[Any], multitask: Multitask = "enqueue") -> int:
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
            UsageError: the registry was not entered yet, or this is not the thread of
                the event loop that entered it.

        When it raises, the job is untouched and never runs.
        """
        conversation_id = check_conversation_id(conversation_id)
        if not isinstance(job, Job):
            raise InvalidArgumentTypeError("job must be a Job")
        if not job._is_new:
            raise InvalidArgumentError("a Job can be submitted only once")
        mode = check_multitask(multitask)
        if self._lifecycle == _UNENTERED:
            raise UsageError(
                "enter the TurnRegistry with 'async with' before submitting turns:"
                " its turns run in the task group that block opens"
            )
        if threading.get_ident() != self._thread:
            raise UsageError(OTHER_THREAD)
        admission = self._table.admit(conversation_id, job, mode)
        for dropped in admission.dropped:
            dropped._drop()
        if admission.interrupted is not None:
            admission.interrupted._interrupt(TurnInterrupted())
        job._admit(self, conversation_id, queued=admission.position > 0)
        if not admission.position:
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
            TurnInterrupted, LeaseLostError: the turn was stopped. A turn that ended by a
                cancellation it raised itself also raises :class:`TurnInterrupted` here,
                from that cancellation (which is ``job.error``): raised bare, it would
                look like this caller being cancelled.
            DrainingError, CoordinationUnavailableError: the turn was refused.
            InvalidArgumentTypeError: ``run`` is not callable; nothing is submitted.
            UsageError: called from a running turn of the same conversation, or a task it
                started: the new turn could only start after the caller's own turn ended,
                so waiting would deadlock. Nothing is submitted; :meth:`submit` is
                allowed there.
            ...and everything :meth:`submit` raises, and the turn's own exception.
        """
        job = Job(run)
        await anyio.lowlevel.checkpoint_if_cancelled()
        running = running_turn()
        if running is not None and running._is_turn_of(self, conversation_id):
            raise UsageError(SELF_RUN)
        self.submit(conversation_id, job, multitask)
        try:
            await job.wait()
        except BaseException:
            job._abandon()
            raise
        return job._outcome()

    def waiting(self, conversation_id: str) -> int:
        """How many turns wait (not running) in the conversation; 0 when idle or unknown.

        Dropped jobs not yet reached count: they hold their place until then.

        Raises:
            InvalidArgumentError: ``conversation_id`` is not a nonempty string.
        """
        return self._table.waiting(check_conversation_id(conversation_id))

    def drain(self) -> None:
        """Refuse new turns with :class:`DrainingError`; idempotent.

        Running turns go on. Without a locker, queued turns still run; with one, lease
        acquisitions in progress are cancelled and every turn that has not got its lease
        yet is refused with :class:`DrainingError`.
        """
        self._table.drain()
        if self._leases is not None:
            self._leases.cancel_acquisitions()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until every admitted turn has finished.

        Args:
            timeout: seconds to wait at most (any finite real number ≥ 0); None waits
                without limit.

        Returns:
            True when no turn remains, False when ``timeout`` passed first.

        Raises:
            InvalidArgumentError: ``timeout`` is negative, NaN, infinite or too large to
                be a number of seconds (an :class:`InvalidArgumentTypeError` when it is
                not a number at all).
        """
        if timeout is not None:
            timeout = as_seconds(timeout, "timeout must be a nonnegative finite number or None")
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

    async def _turn_task(self, conversation_id: str, job: Job[Any], waited: bool) -> None:
        # A registry being left by an exception starts no turn's code: _sweep() ends the
        # jobs left (refusing the queued ones) once every turn task is over.
        if self._lifecycle != _OPEN:
            return
        while True:
            token = enter_turn(job)
            await self._take_turn(conversation_id, job, waited)
            leave_turn(token)
            if self._lifecycle != _OPEN:
                job._finish()
                return
            next_job = self._advance(conversation_id, job)
            if next_job is None:
                return
            context = next_job._take_context()
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

    def _advance(self, conversation_id: str, job: Job[Any]) -> Job[Any] | None:
        """Finish ``job`` and return the next job to take, forgetting an idle conversation.

        Dropped jobs reached on the way are finished and skipped.
        """
        while True:
            job._finish()
            next_job = self._table.advance(conversation_id, job)
            if next_job is None:
                if not self._table:
                    self._became_idle()
                return None
            if next_job._reach():
                return next_job
            job = next_job

    async def _take_turn(self, conversation_id: str, job: Job[Any], waited: bool) -> None:
        """Take the job's turn, recording its outcome on it (the caller finishes it).

        Returns normally however the turn ended, but for ``KeyboardInterrupt`` and
        ``SystemExit``. It awaits only inside the turn's shielded scope, so no
        cancellation but the turn's own stop ever lands in a turn task.
        """
        if self._leases is not None and self._table.draining and not job._stopped:
            # No lease will be acquired, so there is no dequeue to announce.
            job._refuse(DrainingError())
            return
        if waited:
            job._dequeued()
        if job._stopped:  # interrupted before its turn began
            job._end_stopped()
            return
        try:
            with job._open_scope():
                if self._leases is None:
                    await job._call(0, conversation_id)
                else:  # (on_dequeue may have called drain())
                    await self._leases.take(conversation_id, job, self._table.draining)
        finally:
            job._close_scope()

    def _became_idle(self) -> None:
        if self._idle is not None:
            self._idle.set()
            self._idle = None

    def _sweep(self) -> None:
        """End every job left once the turn tasks are over (the block was left early)."""
        for conversation_id in self._table.busy():
            current, *pending = self._table.forget(conversation_id)
            current._end_by_shutdown()
            for job in pending:
                if not job.dropped:
                    job._refuse(DrainingError())
                job._finish()
        self._became_idle()

"""The agent coordinator: fair, cancellation-safe slots for agent runs (CONTRACT §1).

Every decision (who is granted, who is skipped, who fails) is made by the synchronous
:class:`~lovely_coordinator._scheduler.Scheduler`; the classes here are thin async shells
that validate arguments, park tasks on a :class:`~lovely_coordinator._waiter.Parker`, keep
the current-permit context and publish updates. A grant is handed to the waiter inside
the call that frees the slot, so between a release and the next waiter's resumption the
slot belongs to that waiter and nobody can barge in.

Cancellation (always through anyio cancel scopes): a waiter cancelled while queued leaves
the queue; one whose cancellation reaches it after its grant but before it resumed hands
the slot on (the parker's ``on_undo``), so a slot is never leaked. (A cancellation
*requested* after the waiter was already woken with its grant is, as everywhere in anyio
and trio, delivered at its next checkpoint: the operation completed, and ``permit()``,
``run()`` and ``AgentReservation.run`` release the slot on the way out.) An ``acquire``
that is cancelled before it enqueued takes no acceptance order.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from contextvars import Token
from types import TracebackType
from typing import Any, Final, Literal, TypeVar, final

import anyio.lowlevel

from . import _context
from ._backend import Timer, call_at, current_loop, current_time_or_none
from ._config import CoordinatorConfig
from ._errors import (
    CoordinatorError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    PermitReleasedError,
    ReservationCancelledError,
    ReservationUsedError,
)
from ._registries import CoordinatorRegistries
from ._scheduler import DONE, GRANTED, INACTIVE, LENT, QUEUED, Scheduler, Ticket
from ._types import (
    CoordinatorStatistics,
    ModelTuple,
    ModelTupleLike,
    TupleStatistics,
    as_model_tuple,
)
from ._updates import StatisticsCallback, UpdateHub
from ._waiter import Parker

__all__ = [
    "AGENT_COORDINATOR_VERSION",
    "AgentCoordinator",
    "AgentPermit",
    "AgentReservation",
    "create_agent_coordinator",
    "current_permit",
]

T = TypeVar("T")

AGENT_COORDINATOR_VERSION: Final = 1
"""The shape of :class:`AgentCoordinator`; the process-global sentinel carries it."""

current_permit = _context.current_permit

_LIMIT_MESSAGE: Final = "max_concurrency must be a positive integer"
_ORDER_MESSAGE: Final = "acceptance_order must be a positive integer"
_TUPLE_LIMIT_MESSAGE: Final = "Tuple limit must be a positive integer or None"
_REOPEN_MESSAGE: Final = "reopen_after must be a finite number of seconds >= 0"
_REJECT_MESSAGE: Final = "reject_on_closed_tuple must be a bool"
_RELEASED_MESSAGE: Final = "Agent permit released while waiting to reacquire"
_CANCELLED_MESSAGE: Final = "Agent reservation cancelled"
_USED_MESSAGE: Final = "Agent reservation has already been used"


class _DefaultLimit(int):
    """The default ``max_concurrency`` (4), told apart from an explicit 4 by identity."""

    def __repr__(self) -> str:
        return "4"


_DEFAULT_LIMIT: Final = _DefaultLimit(4)


def _check_limit(limit: object) -> int:
    if type(limit) is not int:
        raise InvalidArgumentTypeError(_LIMIT_MESSAGE)
    if limit < 1:
        raise InvalidArgumentError(_LIMIT_MESSAGE)
    return limit


def _check_order(order: object) -> int:
    if type(order) is not int:
        raise InvalidArgumentTypeError(_ORDER_MESSAGE)
    if order < 1:
        raise InvalidArgumentError(_ORDER_MESSAGE)
    return order


def create_agent_coordinator(
    max_concurrency: int = _DEFAULT_LIMIT, *, config: CoordinatorConfig | None = None
) -> AgentCoordinator:
    """A fresh, independent coordinator.

    Args:
        max_concurrency: how many permits may be granted at once (an int ≥ 1).
        config: the full configuration; its ``max_concurrency`` is used. Passing a
            different ``max_concurrency`` explicitly as well is an error.

    Raises:
        InvalidArgumentError: ``max_concurrency`` is not an int ≥ 1 (``bool`` is not an
            int here), ``config`` is not a :class:`CoordinatorConfig`, or the two disagree.
    """
    return AgentCoordinator(max_concurrency, config=config)


@final
class AgentCoordinator(CoordinatorRegistries):
    """A counting semaphore for agent runs, fair by acceptance order, with tuple gates.

    Think of a waiting room with ``max_concurrency`` doors. Everyone takes a number (the
    *acceptance order*) when their work is accepted, and the smallest number that may go
    in goes in next. A ``(provider, model)`` tuple can be *closed* (its people wait, or
    leave if they asked to), or *capped* (at most so many of them inside at once); people
    who cannot go in are skipped without losing their place. A permit holder who has to
    wait for someone else can *lend* its door meanwhile and take one back afterwards,
    ahead of gates and caps.

    Use :func:`create_agent_coordinator` (or the process-global
    ``get_agent_coordinator``) rather than constructing one directly.
    """

    def __init__(
        self,
        max_concurrency: int = _DEFAULT_LIMIT,
        *,
        config: CoordinatorConfig | None = None,
    ) -> None:
        if config is None:
            limit = 4 if max_concurrency is _DEFAULT_LIMIT else _check_limit(max_concurrency)
            config = CoordinatorConfig(max_concurrency=limit)
        elif not isinstance(config, CoordinatorConfig):
            raise InvalidArgumentTypeError("config must be a CoordinatorConfig")
        elif (
            max_concurrency is not _DEFAULT_LIMIT
            and _check_limit(max_concurrency) != config.max_concurrency
        ):
            raise InvalidArgumentError(
                "max_concurrency differs from config.max_concurrency; pass only one"
            )
        self._hub = UpdateHub(self.statistics)
        super().__init__()
        self._config = config
        self._fresh_reacquire = config.reacquire == "fresh"
        self._scheduler = Scheduler(config.max_concurrency, dict(config.tuple_limits))
        # Timed reopens, all armed on the event loop ``_timers_loop`` (see _follow_loop).
        self._timers: dict[ModelTuple, _Reopen] = {}
        self._timers_loop: object | None = None

    def __repr__(self) -> str:
        s = self._scheduler
        return f"<AgentCoordinator {s.active}/{s.limit} active, {s.queued} queued, {s.lent} lent>"

    def _registries_changed(self) -> None:
        self._hub.notify()

    # -- properties ----------------------------------------------------------------------

    @property
    def version(self) -> int:
        """:data:`AGENT_COORDINATOR_VERSION`."""
        return AGENT_COORDINATOR_VERSION

    @property
    def config(self) -> CoordinatorConfig:
        """The configuration this coordinator was created with."""
        return self._config

    @property
    def max_concurrency(self) -> int:
        """The global cap on granted permits."""
        return self._scheduler.limit

    @property
    def active_count(self) -> int:
        """Granted slots: held permits and granted-but-unrun reservations (not lent ones)."""
        return self._scheduler.active

    @property
    def queued_count(self) -> int:
        """Every waiter: eligible, inactive reservations, gated, capped and reacquiring."""
        return self._scheduler.queued

    # -- scheduling knobs --------------------------------------------------------------------

    def next_acceptance_order(self) -> int:
        """The next acceptance order: 1, 2, 3, … and always above every order seen."""
        return self._scheduler.next_order()

    def set_max_concurrency(self, limit: int) -> None:
        """Change the global cap. Growing grants waiters at once, in order; shrinking
        revokes nothing (``active_count`` may stay above the cap until permits end).

        Raises:
            InvalidArgumentError: ``limit`` is not an int ≥ 1; the cap is unchanged.
        """
        self._scheduler.set_limit(_check_limit(limit))
        self._hub.notify()

    def set_tuple_limit(self, t: ModelTupleLike, limit: int | None) -> None:
        """Cap how many permits of tuple ``t`` may be granted at once (None: no cap).

        A waiter whose tuple is at its cap is skipped, never blocking other tuples.
        Lowering a cap revokes nothing; raising or removing it grants at once.

        Raises:
            InvalidArgumentError: a bad tuple, or ``limit`` not None or an int ≥ 1.
        """
        model_tuple = as_model_tuple(t)
        if limit is not None:
            if type(limit) is not int:
                raise InvalidArgumentTypeError(_TUPLE_LIMIT_MESSAGE)
            if limit < 1:
                raise InvalidArgumentError(_TUPLE_LIMIT_MESSAGE)
        self._scheduler.set_tuple_limit(model_tuple, limit)
        self._hub.notify()

    def close_tuple(self, t: ModelTupleLike, *, reopen_after: float | None = None) -> None:
        """Close tuple ``t``'s gate: its waiters stay queued but are not granted.

        Queued waiters on ``t`` that asked ``reject_on_closed_tuple=True`` (inactive
        reservations included) fail with :class:`TupleSuspendedError`. Running permits are
        untouched and nothing is granted. A closure is never shortened: with
        ``reopen_after`` the gate reopens by itself that many seconds from now, unless it
        is already closed until later or until further notice; without it, the gate
        stays closed until :meth:`open_tuple`.

        A timed reopen outlives the event loop it was armed on: when the coordinator is
        next used from another loop (a later ``anyio.run``), the reopen is re-armed there
        for the time that remains, or done at once if its time has passed. (Across loops
        the remaining time is real time; a trio ``MockClock`` does not carry over.)

        Raises:
            InvalidArgumentError: a bad tuple, or ``reopen_after`` not a finite number ≥ 0
                or given outside a running event loop.
        """
        model_tuple = as_model_tuple(t)
        if self._timers:
            self._follow_loop()
        deadline: float | None = None
        if reopen_after is not None:
            if type(reopen_after) not in (int, float):
                raise InvalidArgumentTypeError(_REOPEN_MESSAGE)
            if not (math.isfinite(reopen_after) and reopen_after >= 0):
                raise InvalidArgumentError(_REOPEN_MESSAGE)
            now = current_time_or_none()
            if now is None:  # no clock to count on, and no loop to reopen it later
                raise InvalidArgumentError("reopen_after needs a running event loop")
            deadline = now + reopen_after
        scheduler = self._scheduler
        scheduler.close(model_tuple, deadline)
        state = scheduler.tuple_state(model_tuple)
        assert state is not None  # a closed tuple is never idle
        self._arm_timer(model_tuple, state.reopens_at)
        self._hub.notify()

    def open_tuple(self, t: ModelTupleLike) -> None:
        """Open tuple ``t``'s gate (fine when open); its waiters may be granted at once.

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        self._arm_timer(model_tuple, None)  # a timer on an ended loop is cancelled as well
        self._scheduler.open(model_tuple)
        self._hub.notify()

    def is_tuple_open(self, t: ModelTupleLike) -> bool:
        """Whether tuple ``t``'s gate is open.

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        if self._timers:
            self._follow_loop()
        return self._scheduler.is_open(model_tuple)

    def tuple_reopens_at(self, t: ModelTupleLike) -> float | None:
        """When tuple ``t``'s gate reopens by itself, on the anyio clock of the calling
        event loop (outside any loop: of the loop that last armed it); None when open or
        closed until :meth:`open_tuple`.

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        if self._timers:
            self._follow_loop()
        state = self._scheduler.tuple_state(model_tuple)
        return None if state is None else state.reopens_at

    def _arm_timer(self, model_tuple: ModelTuple, deadline: float | None) -> None:
        """Make ``deadline`` (on the current loop's clock, None: no timer) the tuple's timed
        reopen. Called with the other timers already on the current loop."""
        current = self._timers.get(model_tuple)
        if current is not None and current.at == deadline:
            return
        if current is not None:
            del self._timers[model_tuple]
            current.timer.cancel()
        if deadline is not None:
            now = current_time_or_none()
            assert now is not None  # close_tuple refuses a reopen_after outside a loop
            self._timers_loop = current_loop()
            self._start_timer(model_tuple, deadline, time.monotonic() + (deadline - now))

    def _start_timer(self, model_tuple: ModelTuple, at: float, monotonic_at: float) -> None:
        """Arm the reopen of ``model_tuple`` at ``at`` on the current loop's clock."""
        reopen = _Reopen(at, monotonic_at)

        def fire() -> None:
            if self._timers.get(model_tuple) is not reopen:
                return  # replaced or cancelled after this call was already due
            del self._timers[model_tuple]
            self._scheduler.open(model_tuple)
            self._hub.notify()

        reopen.timer = call_at(at, fire)
        self._timers[model_tuple] = reopen

    def _follow_loop(self) -> None:
        """Move the timed reopens onto the calling event loop if they are on another one.

        A timer belongs to the loop it was armed on and dies with it (an ``anyio.run``
        that ended; trio's clock even starts at a random offset in every run). So every
        entry point that may see a closure calls this (when there are timers at all: the
        hot path pays one dict check, then one identity check): an elapsed reopen happens
        now, a pending one is re-armed here for the real time that remains and its
        ``reopens_at`` restated on this loop's clock. Outside any loop only elapsed
        reopens happen; the rest wait for the next loop.
        """
        loop = current_loop()
        if loop is self._timers_loop:
            return
        now = current_time_or_none()
        monotonic_now = time.monotonic()
        reopened = False
        for model_tuple, reopen in list(self._timers.items()):
            remaining = reopen.monotonic_at - monotonic_now
            if remaining <= 0:
                del self._timers[model_tuple]
                reopen.timer.cancel()  # harmless on an ended loop
                self._scheduler.open(model_tuple)
                reopened = True
            elif now is not None:
                reopen.timer.cancel()
                self._scheduler.retime(model_tuple, now + remaining)
                self._start_timer(model_tuple, now + remaining, reopen.monotonic_at)
        if now is not None:
            self._timers_loop = loop
        if reopened:
            self._hub.notify()

    # -- taking slots ------------------------------------------------------------------------

    def _enqueue(
        self, t: ModelTupleLike, acceptance_order: int | None, reject: bool, active: bool
    ) -> Ticket:
        """Validate a request and put it in line (granting it if it may run now)."""
        model_tuple = t if type(t) is ModelTuple else as_model_tuple(t)
        if self._timers:
            self._follow_loop()
        if type(reject) is not bool:
            raise InvalidArgumentTypeError(_REJECT_MESSAGE)
        if acceptance_order is not None:
            _check_order(acceptance_order)
        # A request refused for a closed gate draws no acceptance order.
        ticket = self._scheduler.enqueue(model_tuple, acceptance_order, active, reject)
        self._hub.notify()
        return ticket

    async def acquire(
        self,
        t: ModelTupleLike,
        /,
        *,
        acceptance_order: int | None = None,
        reject_on_closed_tuple: bool = False,
    ) -> AgentPermit:
        """Wait for a slot on tuple ``t`` and return the permit holding it.

        Waiters are served by (acceptance order, arrival). A waiter whose tuple is
        closed or at its cap is skipped and keeps its place.

        Args:
            t: the ``(provider, model)`` the work runs on.
            acceptance_order: the order the work was accepted in; by default
                :meth:`next_acceptance_order` (drawn only once the call is not cancelled).
            reject_on_closed_tuple: fail instead of waiting while ``t`` is closed, and
                when it closes while this call waits.

        Raises:
            InvalidArgumentError: a bad tuple or acceptance order.
            TupleSuspendedError: ``reject_on_closed_tuple`` and ``t`` is or gets closed.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        ticket = self._enqueue(t, acceptance_order, reject_on_closed_tuple, True)
        await _Admission(self, ticket)._wait()
        return AgentPermit(self, ticket)

    def permit(
        self,
        t: ModelTupleLike,
        /,
        *,
        acceptance_order: int | None = None,
        reject_on_closed_tuple: bool = False,
    ) -> _PermitContext:
        """``async with coordinator.permit(t) as permit:`` — acquire, make it the current
        permit for the body (and every task started in it), release on exit.

        The exit may run in another task than the entry (an ``AsyncExitStack`` handed
        over, a framework closing a stream elsewhere): the permit is released all the
        same. The current permit is then restored only where that is sound: in the
        exiting task's context if the permit is current there (its enclosing permit, if
        any, becomes current again); the entering task's context keeps the (released)
        permit as current until that task's context ends, since no other task can change it.

        Arguments and errors as for :meth:`acquire`.
        """
        return _PermitContext(self, t, acceptance_order, reject_on_closed_tuple)

    async def run(
        self,
        t: ModelTupleLike,
        work: Callable[[], Awaitable[T]],
        /,
        *,
        acceptance_order: int | None = None,
        reject_on_closed_tuple: bool = False,
    ) -> T:
        """Run ``work()`` under a permit on ``t``; return or re-raise what it does.

        Arguments and errors as for :meth:`acquire`; if acquiring fails, ``work`` never runs.
        """
        permit = await self.acquire(
            t, acceptance_order=acceptance_order, reject_on_closed_tuple=reject_on_closed_tuple
        )
        return await permit._run(work)

    def reserve(
        self,
        t: ModelTupleLike,
        /,
        *,
        acceptance_order: int | None = None,
        reject_on_closed_tuple: bool = False,
    ) -> AgentReservation:
        """Take a place in line now without becoming eligible (see :class:`AgentReservation`).

        Raises:
            InvalidArgumentError: a bad tuple or acceptance order.
            TupleSuspendedError: ``reject_on_closed_tuple`` and ``t`` is closed.
        """
        ticket = self._enqueue(t, acceptance_order, reject_on_closed_tuple, False)
        return AgentReservation(self, ticket)

    # -- lending -------------------------------------------------------------------------------

    def current_permit(self) -> AgentPermit | None:
        """The permit of *this* coordinator the calling code runs under, or ``None``.

        The innermost current permit issued by this coordinator, skipping permits of other
        coordinators nested around or inside it (the module-level ``current_permit()``
        returns the innermost permit of any coordinator). Integrations use it to decide
        whether a request already holds a slot here: a permit from the Bash pool must not
        stand in for a model permit. Like ``current_permit()``, a permit stays current
        after it is released, until its body ends; check ``permit.held``.
        """
        return _context.find_permit(self)

    async def with_lent_permit(self, wait: Callable[[], Awaitable[T]]) -> T:
        """Await ``wait()`` while lending the current permit of this coordinator, if any.

        See :meth:`AgentPermit.lend`; without a current permit this is ``await wait()``.
        """
        permit = self.current_permit()
        if permit is None:
            return await wait()
        return await permit.lend(wait)

    @asynccontextmanager
    async def lending(self) -> AsyncIterator[None]:
        """``async with coordinator.lending():`` — :meth:`with_lent_permit` for a block."""
        permit = self.current_permit()
        if permit is None or permit._ticket.state == DONE:
            yield
            return
        permit._lend_begin()
        try:
            yield
        except BaseException:
            await permit._lend_end()
            raise
        await permit._lend_end()

    # -- observing -------------------------------------------------------------------------------

    def statistics(self) -> CoordinatorStatistics:
        """A snapshot of the scheduling state (one entry per non-idle tuple, sorted)."""
        if self._timers:
            self._follow_loop()
        s = self._scheduler
        tuples = sorted(
            (
                TupleStatistics(t.tuple, t.active, t.queued, t.limit, t.open, t.reopens_at)
                for t in s.tuple_states()
            ),
            key=_by_tuple,
        )
        return CoordinatorStatistics(
            max_concurrency=s.limit,
            active=s.active,
            queued=s.queued,
            lent=s.lent,
            residents=self.resident_count,
            tuples=tuple(tuples),
        )

    def subscribe(self, callback: StatisticsCallback) -> Callable[[], None]:
        """Call ``callback(statistics)`` after scheduling changes: asynchronously (never
        inside the scheduling call), coalesced, exceptions logged and swallowed.

        The callback runs in the contextvars context of this ``subscribe()`` call (a
        snapshot taken now, as ``Future.add_done_callback`` does), not in whatever
        context the event loop happens to deliver from; each call gets a fresh copy of
        that snapshot, so what one call sets in context variables is gone by the next.

        Returns:
            An idempotent unsubscribe that removes this subscription only.
        """
        return self._hub.subscribe(callback)

    def watch(self) -> AsyncGenerator[CoordinatorStatistics]:
        """``async for s in coordinator.watch():`` the current statistics, then the latest
        statistics after each change (coalesced).

        An async generator that never ends by itself: to leave it early, close it, e.g.
        ``async with contextlib.aclosing(coordinator.watch()) as updates:`` (trio asks
        this of every async generator left before it ends).
        """
        return self._hub.watch()


def _by_tuple(statistics: TupleStatistics) -> ModelTuple:
    return statistics.tuple


@final
class _Reopen:
    """A timed reopen: its time on the clock of the loop it is armed on (``at``), the same
    instant on ``time.monotonic()`` (which outlives that loop), and the loop's timer."""

    __slots__ = ("at", "monotonic_at", "timer")

    timer: Timer

    def __init__(self, at: float, monotonic_at: float) -> None:
        self.at = at
        self.monotonic_at = monotonic_at


class _ReusedError(CoordinatorError, RuntimeError):
    """A single-use object was used again (a ``permit()`` context manager)."""


class _Admission:
    """A ticket's wait for its grant, with the parker's callbacks as bound methods.

    (Bound methods of one small object cost less memory per waiter than two closures.)
    """

    __slots__ = ("_coordinator", "_ticket")

    def __init__(self, coordinator: AgentCoordinator, ticket: Ticket | None) -> None:
        self._coordinator = coordinator
        self._ticket = ticket

    def _wait(self) -> Coroutine[Any, Any, bool]:
        """The wait for the ticket's grant (it is QUEUED or GRANTED already); await it.

        Returned rather than awaited here, so a waiter costs one coroutine frame less.
        A ticket granted inside the call still makes the wait a checkpoint, and a
        cancellation landing there hands the slot on like any cancellation after a grant.
        """
        ticket = self._ticket
        assert ticket is not None
        parker: Parker[bool] = Parker()
        if ticket.state == GRANTED:
            parker.grant(True)
        else:
            ticket.parker = parker
        return parker.wait(self._abort, self._undo)

    def _abort(self) -> None:
        assert self._ticket is not None
        self._coordinator._scheduler.discard(self._ticket)
        self._coordinator._hub.notify()

    def _undo(self, _: bool) -> None:
        ticket = self._ticket
        assert ticket is not None
        if ticket.state == GRANTED:  # not already given back (a reservation's cancel)
            self._coordinator._scheduler.release(ticket)
            self._coordinator._hub.notify()


@final
class _PermitContext(_Admission):
    """What :meth:`AgentCoordinator.permit` returns (a class, not a generator: it is hot)."""

    __slots__ = ("_order", "_permit", "_reject", "_t", "_token")

    def __init__(
        self,
        coordinator: AgentCoordinator,
        t: ModelTupleLike,
        acceptance_order: int | None,
        reject: bool,
    ) -> None:
        self._coordinator = coordinator
        self._ticket = None
        self._t = t
        self._order = acceptance_order
        self._reject = reject
        self._permit: AgentPermit | None = None
        self._token: Token[_context._Frame | None] | None = None

    async def __aenter__(self) -> AgentPermit:
        if self._ticket is not None:
            raise _ReusedError("a permit() context manager can be entered only once")
        coordinator = self._coordinator
        # acquire(), inlined: one coroutine frame less for every parked waiter.
        await anyio.lowlevel.checkpoint_if_cancelled()
        ticket = coordinator._enqueue(self._t, self._order, self._reject, True)
        self._ticket = ticket
        await self._wait()
        permit = self._permit = AgentPermit(coordinator, ticket)
        self._token = _context.enter_permit(permit, coordinator)
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        permit = self._permit
        assert permit is not None
        assert self._token is not None
        try:
            _context.exit_permit(self._token, permit)
        finally:
            permit.release()


@final
class AgentPermit:
    """One granted slot on a model tuple.

    States: ``"held"`` (the slot is counted in ``active_count``), ``"lent"`` (the slot was
    given back while the holder waits on other work, see :meth:`lend`) and
    ``"released"`` (final). Permits come from the coordinator; do not construct them.
    """

    __slots__ = ("_attempt", "_coordinator", "_lends", "_order", "_revoked", "_ticket")

    def __init__(self, coordinator: AgentCoordinator, ticket: Ticket) -> None:
        self._coordinator = coordinator
        self._ticket = ticket
        self._order = ticket.order
        self._lends = 0
        # The parker of the reacquire that will make this permit held again, while its
        # lend has not resumed; a release or a new lend clears it.
        self._attempt: Parker[bool] | None = None
        # A reacquire that was granted and then released before its lend resumed; that
        # lend raises PermitReleasedError.
        self._revoked: Parker[bool] | None = None

    def __repr__(self) -> str:
        return f"<AgentPermit {self.tuple} order={self._order} {self.state}>"

    @property
    def held(self) -> bool:
        """Whether the permit currently holds its slot."""
        return self._ticket.state == GRANTED

    @property
    def state(self) -> Literal["held", "lent", "released"]:
        """``"held"``, ``"lent"`` (also while reacquiring) or ``"released"``."""
        state = self._ticket.state
        if state == GRANTED:
            return "held"
        if state == DONE:
            return "released"
        return "lent"

    @property
    def tuple(self) -> ModelTuple:
        """The model tuple the permit's slot is on."""
        return self._ticket.tuple_state.tuple

    @property
    def acceptance_order(self) -> int:
        """The acceptance order the permit was granted with."""
        return self._order

    def release(self) -> None:
        """Give the permit up. Idempotent.

        From held, the slot goes to the next waiter at once. From lent, nothing is
        returned (the slot already was), and a lend waiting to reacquire fails with
        :class:`PermitReleasedError`.
        """
        ticket = self._ticket
        state = ticket.state
        if state == DONE:
            return
        scheduler = self._coordinator._scheduler
        attempt, self._attempt = self._attempt, None
        if state == QUEUED:  # a reacquire is waiting: it fails
            scheduler.fail(ticket, PermitReleasedError(_RELEASED_MESSAGE))
        else:
            if state == GRANTED and attempt is not None:
                self._revoked = attempt  # granted, but its lend has not resumed yet
            scheduler.release(ticket)
        self._coordinator._hub.notify()

    async def lend(self, wait: Callable[[], Awaitable[T]]) -> T:
        """Give the slot back while awaiting ``wait()``, then take a slot again.

        Overlapping lends of one permit share the one returned slot; only the last to
        finish reacquires, bypassing closed gates and tuple caps, with the acceptance
        order chosen by ``CoordinatorConfig.reacquire``. ``wait``'s exception is
        re-raised after the reacquire. If the permit is released meanwhile, ``wait``'s
        outcome is returned without reacquiring; on a released permit this is just
        ``await wait()``.

        Raises:
            PermitReleasedError: the permit was released while waiting to reacquire.

        If the reacquire is cancelled, the permit becomes released and the cancellation
        propagates.
        """
        if self._ticket.state == DONE:
            return await wait()
        self._lend_begin()
        try:
            result = await wait()
        except BaseException:
            await self._lend_end()
            raise
        await self._lend_end()
        return result

    def _lend_begin(self) -> None:
        ticket = self._ticket
        scheduler = self._coordinator._scheduler
        state = ticket.state
        self._attempt = None  # a reacquire in flight is superseded by this lend
        if state == GRANTED:
            scheduler.lend(ticket)
            self._coordinator._hub.notify()
        elif state == QUEUED:
            # Another lend is waiting to reacquire; this one will reacquire when it ends,
            # so that wait is pointless: take it out of line and let its lend return.
            parker = ticket.parker
            scheduler.withdraw(ticket)
            if parker is not None:
                parker.grant(False)
            self._coordinator._hub.notify()
        self._lends += 1

    async def _lend_end(self) -> None:
        self._lends -= 1
        ticket = self._ticket
        if self._lends or ticket.state != LENT:
            return  # others still lend it (the last one reacquires), or it was released
        coordinator = self._coordinator
        scheduler = coordinator._scheduler
        hub = coordinator._hub
        order = scheduler.next_order() if coordinator._fresh_reacquire else self._order
        parker: Parker[bool] = Parker()
        self._attempt = ticket.parker = parker
        scheduler.reacquire(ticket, order)  # may grant at once (through the parker)
        hub.notify()

        def abort() -> None:  # cancelled while queued: the permit is released
            if self._attempt is parker:
                self._attempt = None
            scheduler.discard(ticket)
            hub.notify()

        def undo(granted: bool) -> None:  # cancelled after the grant: released as well
            if granted and self._attempt is parker:
                self._attempt = None
                self.release()

        granted = await parker.wait(abort, undo)
        if self._attempt is parker:
            self._attempt = None
        elif granted and self._revoked is parker:
            self._revoked = None
            raise PermitReleasedError(_RELEASED_MESSAGE)

    async def _run(self, work: Callable[[], Awaitable[T]]) -> T:
        token = _context.enter_permit(self, self._coordinator)
        try:
            return await work()
        finally:
            _context.exit_permit(token, self)
            self.release()


@final
class AgentReservation:
    """A place in line taken now, granted only once activated.

    It counts in ``queued_count`` from the start and keeps its acceptance order, so once
    :meth:`activate`\\ d (or :meth:`run`) it beats all work accepted after it.
    Reservations come from :meth:`AgentCoordinator.reserve`; do not construct them.
    """

    __slots__ = ("_cancelled", "_consumed", "_coordinator", "_order", "_ticket", "_used")

    def __init__(self, coordinator: AgentCoordinator, ticket: Ticket) -> None:
        self._coordinator = coordinator
        self._ticket = ticket
        self._order = ticket.order
        self._used = False
        self._consumed = False
        self._cancelled = False

    def __repr__(self) -> str:
        state = self._ticket.state
        if self._consumed and state != DONE:
            label = "running"
        else:
            label = ("inactive", "queued", "granted", "lent", "done")[state]
        return f"<AgentReservation {self._ticket.tuple_state.tuple} order={self._order} {label}>"

    @property
    def acceptance_order(self) -> int:
        """The acceptance order the reservation holds its place with."""
        return self._order

    def activate(self) -> None:
        """Become eligible; granted at once if a slot is free. No-op once not queued."""
        if self._ticket.state == INACTIVE:
            self._coordinator._scheduler.activate(self._ticket)
            self._coordinator._hub.notify()

    def cancel(self, reason: BaseException | None = None) -> None:
        """Give up the place or the unused slot.

        Queued: the pending (or next) :meth:`run` raises ``reason``, or
        :class:`ReservationCancelledError` without one. Granted but not yet running: the
        slot goes to the next waiter and a later :meth:`run` raises
        :class:`ReservationCancelledError`. Otherwise: no-op.

        Raises:
            InvalidArgumentTypeError: ``reason`` is neither None nor an exception.
        """
        if reason is not None and not isinstance(reason, BaseException):
            raise InvalidArgumentTypeError("reason must be an exception or None")
        ticket = self._ticket
        state = ticket.state
        scheduler = self._coordinator._scheduler
        if state in (INACTIVE, QUEUED):
            error = reason if reason is not None else ReservationCancelledError(_CANCELLED_MESSAGE)
            scheduler.fail(ticket, error)
        elif state == GRANTED and not self._consumed:
            self._cancelled = True
            scheduler.release(ticket)
        else:
            return
        self._coordinator._hub.notify()

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """Activate, wait for the slot, and run ``work()`` under its permit; then release.

        Raises:
            ReservationUsedError: ``run`` was already called.
            ReservationCancelledError: the reservation was cancelled (or the ``reason``
                given to :meth:`cancel`).
            TupleSuspendedError: it asked ``reject_on_closed_tuple`` and its tuple closed.
        """
        if self._used:
            raise ReservationUsedError(_USED_MESSAGE)
        self._used = True
        ticket = self._ticket
        if ticket.state == DONE:
            await anyio.lowlevel.checkpoint()
            error, ticket.error = ticket.error, None
            raise error if error is not None else ReservationCancelledError(_CANCELLED_MESSAGE)
        self.activate()
        await _Admission(self._coordinator, ticket)._wait()
        if self._cancelled:
            raise ReservationCancelledError(_CANCELLED_MESSAGE)
        self._consumed = True
        return await AgentPermit(self._coordinator, ticket)._run(work)

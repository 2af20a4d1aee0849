"""The agent coordinator: fair, cancellation-safe slots and model requests (CONTRACT §1, §5).

Every decision (who is granted, who is skipped, who fails) is made by the synchronous
:class:`~lovely_coordinator._scheduler.Scheduler`; :class:`AgentCoordinator` is a thin
shell that validates arguments, holds the lock, parks tasks on a
:class:`~lovely_coordinator._waiter.Parker` and publishes changes. A grant is handed to the
waiter inside the call that frees the slot, so between a release and the next waiter's
resumption the slot belongs to that waiter and nobody can barge in.

Cancellation (always through anyio cancel scopes): a waiter cancelled while queued leaves
the queue; one whose cancellation reaches it after its grant but before it resumed hands
the slot on, so a slot is never leaked. (A cancellation *requested* after the waiter was
already woken with its grant is, as everywhere in anyio and trio, delivered at its next
checkpoint: the operation completed, and ``permit()``, ``run()`` and ``request()`` release
on the way out.) A call cancelled before it enqueued takes no acceptance order.

Threads: the coordinator is process-global, so event loops in several threads may use it
at once. Every state change happens under one re-entrant lock; a grant made on one thread
wakes a task parked on another through that task's loop (``_waiter``), and timed events
keep running on the coordinator's home loop (``_timers``). The guarantees are the same.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, TypeVar, final

import anyio.lowlevel

from ._config import CoordinatorConfig
from ._errors import InvalidArgumentError, InvalidArgumentTypeError, PermitReleasedError
from ._lines import DONE, GRANTED, QUEUED, Ticket
from ._permits import (
    RELEASED_MESSAGE,
    TOKENS_MESSAGE,
    WAIT_MESSAGE,
    WORK_MESSAGE,
    Admission,
    AgentPermit,
    AgentReservation,
    PermitContext,
    RequestContext,
    find_permit,
)
from ._registries import CoordinatorRegistries
from ._scheduler import Scheduler
from ._statistics import snapshot
from ._timers import LoopClock, WakeupTimer
from ._types import CoordinatorStatistics, ModelTuple, ModelTupleLike, as_model_tuple
from ._updates import StatisticsCallback, UpdateHub
from ._validate import as_bool, as_callable, as_index, as_optional_index, as_seconds
from ._waiter import Parker

__all__ = ["AGENT_COORDINATOR_VERSION", "AgentCoordinator", "create_agent_coordinator"]

T = TypeVar("T")

AGENT_COORDINATOR_VERSION: Final = 1
"""The shape of :class:`AgentCoordinator`; the process-global sentinel carries it."""

LIMIT_MESSAGE: Final = "max_concurrency must be a positive integer"
_ORDER_MESSAGE: Final = "acceptance_order must be a positive integer"
_TUPLE_LIMIT_MESSAGE: Final = "Tuple limit must be a positive integer or None"
_REOPEN_MESSAGE: Final = "reopen_after must be a finite number of seconds >= 0"
_REJECT_MESSAGE: Final = "reject_on_closed_tuple must be a bool"
_BUDGET_MESSAGE: Final = "Budget must be a positive finite number or None"
_REMAINING_MESSAGE: Final = "Remaining budget must be a finite number >= 0 or None"


class _DefaultLimit(int):
    """The default ``max_concurrency`` (4), told apart from an explicit 4 by identity."""

    def __repr__(self) -> str:
        return "4"


DEFAULT_LIMIT: Final = _DefaultLimit(4)


def create_agent_coordinator(
    max_concurrency: int = DEFAULT_LIMIT, *, config: CoordinatorConfig | None = None
) -> AgentCoordinator:
    """A fresh, independent coordinator.

    Args:
        max_concurrency: how many permits may be granted at once (an int ≥ 1).
        config: the full configuration; its ``max_concurrency`` is used. Passing a
            different ``max_concurrency`` explicitly as well is an error.

    Raises:
        InvalidArgumentError: ``max_concurrency`` is not an int ≥ 1 (``bool`` is not an
            int here), ``config`` is not a valid :class:`CoordinatorConfig`, or the two
            disagree.
    """
    return AgentCoordinator(max_concurrency, config=config)


def _budget(value: object) -> float | None:
    return None if value is None else as_seconds(value, _BUDGET_MESSAGE, positive=True)


def _remaining(value: object) -> float | None:
    return None if value is None else as_seconds(value, _REMAINING_MESSAGE)


@final
class AgentCoordinator(CoordinatorRegistries):
    """A counting semaphore for agent runs and model calls, fair by acceptance order.

    Think of a waiting room with ``max_concurrency`` doors. Everyone takes a number (the
    *acceptance order*) when their work is accepted, and the smallest number that may go
    in goes in next. A ``(provider, model)`` tuple can be *closed* (its people wait, or
    leave if they asked to), *capped* (at most so many of them inside at once) or
    *budgeted* (so many calls and tokens per minute); people who cannot go in are skipped
    without losing their place. A permit holder who has to wait for someone else can
    *lend* its door meanwhile and take one back afterwards, ahead of gates and caps.

    Use :func:`create_agent_coordinator` (or the process-global
    ``get_agent_coordinator``) rather than constructing one directly.
    """

    def __init__(
        self, max_concurrency: int = DEFAULT_LIMIT, *, config: CoordinatorConfig | None = None
    ) -> None:
        if config is None:
            limit = (
                4 if max_concurrency is DEFAULT_LIMIT else as_index(max_concurrency, LIMIT_MESSAGE)
            )
            config = CoordinatorConfig(max_concurrency=limit)
        elif not isinstance(config, CoordinatorConfig):
            raise InvalidArgumentTypeError("config must be a CoordinatorConfig")
        else:
            # A config made with model_construct() skipped validation: check it again.
            config = CoordinatorConfig.model_validate(dict(config))
            if (
                max_concurrency is not DEFAULT_LIMIT
                and as_index(max_concurrency, LIMIT_MESSAGE) != config.max_concurrency
            ):
                raise InvalidArgumentError(
                    "max_concurrency differs from config.max_concurrency; pass only one"
                )
        self._config = config
        self._lock = threading.RLock()
        self._clock = LoopClock()
        self._hub = UpdateHub(self.statistics, self._lock)
        super().__init__()
        self._scheduler = Scheduler(
            config.max_concurrency,
            dict(config.tuple_limits),
            fresh_reacquire=config.reacquire == "fresh",
            max_queued=config.max_queued,
            clock=self._clock.now,
        )
        self._timer = WakeupTimer(self._clock, self._advance, self._lock)
        self._scheduler.on_change = self._on_change

    def __repr__(self) -> str:
        s = self._scheduler
        return f"<AgentCoordinator {s.active}/{s.limit} active, {s.queued} queued, {s.lent} lent>"

    # -- the change point ----------------------------------------------------------------------

    def _on_change(self) -> None:
        # The scheduler's one change hook (under the lock): tell listeners, and keep the
        # one timer at the scheduler's next wake-up.
        self._hub.notify()
        scheduler = self._scheduler
        if scheduler._wakeups or self._timer.armed_at is not None:
            self._timer.rearm(scheduler.next_wakeup())

    def _registries_changed(self) -> None:
        with self._lock:
            self._hub.notify()

    def _follow(self) -> None:
        """If the calling loop adopts the coordinator, move its instants and timer here."""
        delta = self._clock.follow()
        if delta is None:
            return
        scheduler = self._scheduler
        if delta:
            scheduler.shift_time(delta)
        if not scheduler.advance():  # what fell due meanwhile happens now
            self._timer.rearm(scheduler.next_wakeup())

    def _advance(self) -> None:
        self._scheduler.advance()  # its change hook re-arms the timer

    # -- properties ------------------------------------------------------------------------------

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
        """Granted slots: held permits, granted-but-unrun reservations and model requests
        on a slot of their own (not lent permits)."""
        return self._scheduler.active

    @property
    def queued_count(self) -> int:
        """Every waiter: eligible, inactive reservations, gated, capped, budgeted and
        reacquiring."""
        return self._scheduler.queued

    # -- settings --------------------------------------------------------------------------------

    def next_acceptance_order(self) -> int:
        """The next acceptance order: 1, 2, 3, … and always above every order seen."""
        with self._lock:
            return self._scheduler.next_order()

    def set_max_concurrency(self, limit: int) -> None:
        """Change the global cap. Growing grants waiters at once, in order; shrinking
        revokes nothing (``active_count`` may stay above the cap until permits end).

        Raises:
            InvalidArgumentError: ``limit`` is not an int ≥ 1; the cap is unchanged.
        """
        value = as_index(limit, LIMIT_MESSAGE)
        with self._lock:
            self._scheduler.set_limit(value)

    def set_tuple_limit(self, t: ModelTupleLike, limit: int | None) -> None:
        """Cap how many slots of tuple ``t`` may be taken at once (None: no cap).

        A waiter whose tuple is at its cap is skipped, never blocking other tuples.
        Lowering a cap revokes nothing; raising or removing it grants at once.

        Raises:
            InvalidArgumentError: a bad tuple, or ``limit`` not None or an int ≥ 1.
        """
        model_tuple = as_model_tuple(t)
        value = as_optional_index(limit, _TUPLE_LIMIT_MESSAGE)
        with self._lock:
            self._scheduler.set_tuple_limit(model_tuple, value)

    def close_tuple(self, t: ModelTupleLike, *, reopen_after: float | None = None) -> None:
        """Close tuple ``t``'s gate: its waiters stay queued but are not granted.

        Queued waiters on ``t`` that asked ``reject_on_closed_tuple=True`` (inactive
        reservations included) fail with :class:`TupleSuspendedError`. Running permits are
        untouched and nothing is granted. A closure is never shortened: with
        ``reopen_after`` the gate reopens by itself that many seconds from now, unless it
        is already closed until later or until further notice; without it, the gate
        stays closed until :meth:`open_tuple`.

        A timed reopen outlives the event loop it was armed on: when the coordinator is
        next used from another loop (a later ``anyio.run``), the reopen moves there for
        the time that remains, or happens at once if its time has passed. (Across loops
        the remaining time is real time; a trio ``MockClock`` does not carry over.)

        Raises:
            InvalidArgumentError: a bad tuple, or ``reopen_after`` not a finite number ≥ 0
                (nothing changed).
        """
        model_tuple = as_model_tuple(t)
        after = None if reopen_after is None else as_seconds(reopen_after, _REOPEN_MESSAGE)
        with self._lock:
            self._follow()
            at = None if after is None else self._clock.now() + after
            self._scheduler.close(model_tuple, at)

    def open_tuple(self, t: ModelTupleLike) -> None:
        """Open tuple ``t``'s gate (fine when open); its waiters may be granted at once.

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        with self._lock:
            self._scheduler.open(model_tuple)

    def is_tuple_open(self, t: ModelTupleLike) -> bool:
        """Whether tuple ``t``'s gate is open (a pure read).

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        with self._lock:
            return self._scheduler.is_open(model_tuple, self._clock.now())

    def tuple_reopens_at(self, t: ModelTupleLike) -> float | None:
        """When tuple ``t``'s gate reopens by itself, on the anyio clock of the calling
        event loop (outside any loop: of the coordinator's home loop); None when open or
        closed until :meth:`open_tuple`. A pure read.

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        with self._lock:
            now = self._clock.now()
            if self._scheduler.is_open(model_tuple, now):
                return None
            state = self._scheduler.tuple_state(model_tuple)
            at = None if state is None else state.reopens_at
            return None if at is None else at + self._clock.here_minus_home()

    def set_budget(
        self,
        t: ModelTupleLike,
        *,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
    ) -> None:
        """Budget tuple ``t``'s model requests (CONTRACT §5): token buckets of requests
        and of tokens per minute, refilled continuously and full when first set.

        ``None`` removes a dimension; both ``None`` removes the budget. A changed budget
        keeps what was already spent. Permits never draw from a budget.

        Raises:
            InvalidArgumentError: a bad tuple, or a value that is not a finite number
                > 0 (``bool`` is not a number here); nothing changed.
        """
        model_tuple = as_model_tuple(t)
        requests, tokens = _budget(requests_per_minute), _budget(tokens_per_minute)
        with self._lock:
            self._follow()
            self._scheduler.set_budget(model_tuple, requests, tokens)

    def learn_budget(
        self,
        t: ModelTupleLike,
        *,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        requests_remaining: float | None = None,
        tokens_remaining: float | None = None,
    ) -> None:
        """Correct tuple ``t``'s budget from what the provider reports (for extensions).

        A per-minute limit sets that dimension's budget unless :meth:`set_budget` set it
        explicitly (then the explicit one stands); what was spent stays spent. A
        remaining amount lowers what is available to at most that (it never raises it),
        in a dimension that has a budget. Processes that share one provider quota
        converge through this without any shared store.

        Raises:
            InvalidArgumentError: a bad tuple, a limit that is not a finite number > 0 or
                a remaining amount that is not a finite number ≥ 0; nothing changed.
        """
        model_tuple = as_model_tuple(t)
        requests, tokens = _budget(requests_per_minute), _budget(tokens_per_minute)
        left_requests, left_tokens = _remaining(requests_remaining), _remaining(tokens_remaining)
        with self._lock:
            self._follow()
            self._scheduler.learn_budget(model_tuple, requests, tokens, left_requests, left_tokens)

    # -- taking slots --------------------------------------------------------------------------

    def _check(
        self, t: ModelTupleLike, acceptance_order: int | None, reject: object
    ) -> tuple[ModelTuple, int | None]:
        model_tuple = t if type(t) is ModelTuple else as_model_tuple(t)
        if reject is not False and reject is not True:
            as_bool(reject, _REJECT_MESSAGE)
        if acceptance_order is not None:
            acceptance_order = as_index(acceptance_order, _ORDER_MESSAGE)
        return model_tuple, acceptance_order

    async def _acquire(self, t: ModelTuple, order: int | None, reject: bool) -> AgentPermit:
        await anyio.lowlevel.checkpoint_if_cancelled()
        parker: Parker[bool] = Parker()
        with self._lock:
            if self._scheduler._wakeups:
                self._follow()
            ticket = self._scheduler.enqueue(t, order, True, reject)
            self._attach_locked(ticket, parker)
        await parker.wait(Admission(self, ticket), self._lock)
        return AgentPermit(self, ticket)

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
            CoordinatorBusyError: ``max_queued`` waiters already wait.
        """
        model_tuple, order = self._check(t, acceptance_order, reject_on_closed_tuple)
        return await self._acquire(model_tuple, order, reject_on_closed_tuple)

    def permit(
        self,
        t: ModelTupleLike,
        /,
        *,
        acceptance_order: int | None = None,
        reject_on_closed_tuple: bool = False,
    ) -> PermitContext:
        """``async with coordinator.permit(t) as permit:`` — acquire, make it the current
        permit for the body (and every task started in it), release on exit.

        The exit may run in another task than the entry (an ``AsyncExitStack`` handed
        over, a framework closing a stream elsewhere): the permit is released all the
        same. Arguments and errors as for :meth:`acquire`; entering it twice is a
        :class:`UsageError`.
        """
        model_tuple, order = self._check(t, acceptance_order, reject_on_closed_tuple)
        return PermitContext(self, model_tuple, order, reject_on_closed_tuple)

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

        Arguments and errors as for :meth:`acquire`, plus ``InvalidArgumentTypeError``
        when ``work`` is not callable (before anything else happens); if acquiring
        fails, ``work`` never runs.
        """
        as_callable(work, WORK_MESSAGE)
        model_tuple, order = self._check(t, acceptance_order, reject_on_closed_tuple)
        permit = await self._acquire(model_tuple, order, reject_on_closed_tuple)
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
            CoordinatorBusyError: ``max_queued`` waiters already wait.
        """
        model_tuple, order = self._check(t, acceptance_order, reject_on_closed_tuple)
        with self._lock:
            ticket = self._scheduler.enqueue(model_tuple, order, False, reject_on_closed_tuple)
        return AgentReservation(self, ticket)

    def request(
        self,
        t: ModelTupleLike,
        /,
        *,
        tokens: int = 0,
        acceptance_order: int | None = None,
        reject_on_closed_tuple: bool = False,
    ) -> RequestContext:
        """``async with coordinator.request(t, tokens=n) as call:`` — one model call.

        It is admitted once, atomically and in (acceptance order, arrival) with every
        other waiter, when ``t``'s gate is open, ``t``'s budget holds 1 request and
        ``tokens`` tokens, and a slot covers it: the current permit of this coordinator
        when the current task holds one that covers no other request right now,
        otherwise a slot of its own (the global cap and ``t``'s cap). A waiting request
        takes its task's permit as soon as that permit is free. A request entered again
        by the task already inside a request of this coordinator on ``t`` is that request
        (one slot, one draw). At exit a slot of its own is released; what was drawn from
        the budget stays spent (``call.settle(actual)`` corrects the token charge).

        Raises:
            InvalidArgumentError: a bad tuple, acceptance order, or ``tokens`` not an int
                ≥ 0 (raised here, before anything happens).
            TupleSuspendedError: ``reject_on_closed_tuple`` and ``t`` is or gets closed.
            CoordinatorBusyError: ``max_queued`` waiters already wait.
            UsageError: the context manager is entered twice.
        """
        charge = as_index(tokens, TOKENS_MESSAGE, minimum=0)
        model_tuple, order = self._check(t, acceptance_order, reject_on_closed_tuple)
        return RequestContext(self, model_tuple, charge, order, reject_on_closed_tuple)

    # -- lending -------------------------------------------------------------------------------

    def current_permit(self) -> AgentPermit | None:
        """The permit of *this* coordinator the calling code runs under, or ``None``.

        The innermost current permit issued by this coordinator, skipping permits of other
        coordinators nested around or inside it (the module-level ``current_permit()``
        returns the innermost permit of any coordinator). Like ``current_permit()``, a
        permit stays current after it is released, until its body ends; check
        ``permit.held``.
        """
        return find_permit(self)

    async def with_lent_permit(self, wait: Callable[[], Awaitable[T]]) -> T:
        """Await ``wait()`` while lending the current permit of this coordinator, if any.

        See :meth:`AgentPermit.lend`; without a current permit this is ``await wait()``.

        Raises:
            InvalidArgumentTypeError: ``wait`` is not callable (nothing was lent).
        """
        as_callable(wait, WAIT_MESSAGE)
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
        self._lend_begin(permit._ticket)
        try:
            yield
        except BaseException:
            await permit._lend_end()
            raise
        await permit._lend_end()

    # -- observing -------------------------------------------------------------------------------

    def statistics(self) -> CoordinatorStatistics:
        """A snapshot of the scheduling state (one entry per non-idle tuple, sorted).

        A pure read: it changes nothing, and arms or fires no timer.
        """
        with self._lock:
            return snapshot(self._scheduler, self._clock, self.resident_count)

    def subscribe(self, callback: StatisticsCallback) -> Callable[[], None]:
        """Call ``callback(statistics)`` after scheduling changes: asynchronously (never
        inside the scheduling call), coalesced, on the loop it subscribed from; whatever
        it raises is logged and swallowed. It runs in the contextvars context of this
        ``subscribe()`` call (a fresh copy of that snapshot for each call).

        Returns:
            An idempotent unsubscribe that removes this subscription only.

        Raises:
            InvalidArgumentTypeError: ``callback`` is not callable.
        """
        return self._hub.subscribe(as_callable(callback, "callback must be callable"))

    def watch(self) -> AsyncGenerator[CoordinatorStatistics]:
        """``async for s in coordinator.watch():`` the current statistics, then the latest
        statistics after each change (coalesced).

        An async generator that never ends by itself: to leave it early, close it, e.g.
        ``async with contextlib.aclosing(coordinator.watch()) as updates:`` (trio asks
        this of every async generator left before it ends).
        """
        return self._hub.watch()

    # -- what permits, reservations and requests call (each under the lock) ------------------

    def _attach_locked(self, ticket: Ticket, parker: Parker[bool]) -> None:
        if ticket.state == GRANTED:
            parker.grant(True)
        else:
            ticket.parker = parker

    def _attach(self, ticket: Ticket, parker: Parker[bool], *, activate: bool) -> None:
        with self._lock:
            if activate:
                self._scheduler.activate(ticket)
            self._attach_locked(ticket, parker)

    def _activate(self, ticket: Ticket) -> None:
        with self._lock:
            self._scheduler.activate(ticket)

    def _enqueue_request(
        self,
        t: ModelTuple,
        order: int | None,
        reject: bool,
        tokens: int,
        cover: Ticket | None,
        parker: Parker[bool],
    ) -> Ticket:
        with self._lock:
            self._follow()
            ticket = self._scheduler.enqueue_request(t, order, reject, tokens, cover)
            self._attach_locked(ticket, parker)
            return ticket

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            state = ticket.state
            if state == QUEUED and ticket.bypass:  # a lend waits to reacquire: it fails
                self._scheduler.fail(ticket, PermitReleasedError(RELEASED_MESSAGE))
            elif state != DONE:
                self._scheduler.release(ticket)

    def _discard(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.state == QUEUED or ticket.state == 0:
                self._scheduler.discard(ticket)

    def _fail(self, ticket: Ticket, error: BaseException) -> None:
        with self._lock:
            self._scheduler.fail(ticket, error)

    def _lend_begin(self, ticket: Ticket) -> None:
        with self._lock:
            withdrawn = self._scheduler.lend_begin(ticket)
            if withdrawn is not None:
                withdrawn.grant(False)  # that lend returns; this one will reacquire

    def _lend_end(self, ticket: Ticket, parker: Parker[bool]) -> bool:
        with self._lock:
            if self._scheduler._wakeups:
                self._follow()
            return self._scheduler.lend_end(ticket, parker)

    def _settle(self, ticket: Ticket, tokens: int) -> None:
        with self._lock:
            self._follow()
            self._scheduler.settle(ticket, tokens)

"""The agent coordinator: fair, cancellation-safe slots and model requests (CONTRACT §1, §5).

Every decision (who is granted, who is skipped, who fails) is made by the synchronous
:class:`~lovely_coordinator._agents.scheduler.Scheduler`; :class:`AgentCoordinator` is a thin
shell that validates arguments, holds the lock, parks tasks on a
:class:`~lovely_coordinator._base.waiter.Parker` and publishes changes. A grant is handed to the
waiter inside the call that frees the slot, so between a release and the next waiter's
resumption the slot belongs to that waiter and nobody can barge in.

Composition: an :class:`AgentCoordinator` *owns* its machinery, a ``core.CoordinatorCore``
(the lock, the scheduler, the clock and timer, the update hub: what the handles it gives
out talk to) and its registries. Taking slots and lending are here; its other public
methods come in three flat parts (settings, ``controls.py``; observation, ``observe.py``:
statistics, subscriptions, instruments and the endpoint; registries, ``registries.py``),
each over that machinery, none overriding another.

Cancellation (always through anyio cancel scopes): a waiter cancelled while queued leaves
the queue; one whose cancellation reaches it after its grant but before it resumed hands
the slot on, so a slot is never leaked. (A cancellation *requested* after the waiter was
already woken with its grant is, as everywhere in anyio and trio, delivered at its next
checkpoint: the operation completed, and ``permit()``, ``run()`` and ``request()`` release
on the way out.) A call cancelled before it enqueued takes no acceptance order.

Threads: the coordinator is process-global, so event loops in several threads may use it
at once. Every state change happens under one re-entrant lock; a grant made on one thread
wakes a task parked on another through that task's loop (``_base.waiter``), and timed
events keep running on the coordinator's home loop (``timers``). The guarantees are the same.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, TypeVar, final

from .._base.config import CoordinatorConfig
from .._base.errors import InvalidArgumentError, InvalidArgumentTypeError
from .._base.types import ModelTuple, ModelTupleLike, as_model_tuple
from .._base.validate import as_bool, as_callable, as_index
from .blocking import BlockingRequestContext, as_timeout
from .controls import LIMIT_MESSAGE, CoordinatorControls
from .core import CoordinatorCore
from .observe import CoordinatorObservation
from .permits import (
    WAIT_MESSAGE,
    WORK_MESSAGE,
    AgentPermit,
    AgentReservation,
    PermitContext,
    find_permit,
)
from .registries import CoordinatorRegistries
from .requests import RequestContext, as_tokens
from .tickets import DONE

__all__ = ["AGENT_COORDINATOR_VERSION", "AgentCoordinator", "create_agent_coordinator"]

T = TypeVar("T")

AGENT_COORDINATOR_VERSION: Final = 1
"""The shape of :class:`AgentCoordinator`; the process-global sentinel carries it."""

_ORDER_MESSAGE: Final = "acceptance_order must be a positive integer"
_REJECT_MESSAGE: Final = "reject_on_closed_tuple must be a bool"
_CURRENT_MESSAGE: Final = "current must be a bool"


class _DefaultLimit(int):
    """The default ``max_concurrency`` (4), told apart from an explicit 4 by identity."""

    def __repr__(self) -> str:
        return "4"


DEFAULT_LIMIT: Final[_DefaultLimit] = _DefaultLimit(4)


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


@final
class AgentCoordinator(CoordinatorControls, CoordinatorObservation, CoordinatorRegistries):
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
        core = self._core = CoordinatorCore(config)
        CoordinatorRegistries.__init__(self, core._registries_changed)
        core.residents = self._residents.__len__
        # The core's parts, for reads here (and for tests and extensions that look inside).
        self._scheduler = core._scheduler
        self._clock = core._clock
        self._lock = core._lock

    def __repr__(self) -> str:
        s = self._scheduler
        return f"<AgentCoordinator {s.active}/{s.limit} active, {s.queued} queued, {s.lent} lent>"

    # -- properties ------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """:data:`AGENT_COORDINATOR_VERSION`."""
        return AGENT_COORDINATOR_VERSION

    @property
    def config(self) -> CoordinatorConfig:
        """The configuration this coordinator was created with."""
        return self._core._config

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

    # -- taking slots --------------------------------------------------------------------------

    def _check(
        self, t: ModelTupleLike, acceptance_order: int | None, reject: object
    ) -> tuple[ModelTuple, int | None]:
        if type(t) is ModelTuple:
            model_tuple = t
        else:
            # A plain pair the scheduler knows already is that tuple: no new ModelTuple
            # per call for callers that pass the same pair again.
            known = self._scheduler.known_tuple(t) if type(t) is tuple else None
            model_tuple = as_model_tuple(t) if known is None else known
        if reject is not False and reject is not True:
            as_bool(reject, _REJECT_MESSAGE)
        if acceptance_order is not None:
            acceptance_order = as_index(acceptance_order, _ORDER_MESSAGE)
        return model_tuple, acceptance_order

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
        core = self._core
        return AgentPermit(core, await core._acquire(model_tuple, order, reject_on_closed_tuple))

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
        return PermitContext(self._core, model_tuple, order, reject_on_closed_tuple)

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
        core = self._core
        ticket = await core._acquire(model_tuple, order, reject_on_closed_tuple)
        return await AgentPermit(core, ticket)._run(work)

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
        return AgentReservation(self._core, ticket)

    def request(
        self,
        t: ModelTupleLike,
        /,
        *,
        tokens: int = 0,
        acceptance_order: int | None = None,
        reject_on_closed_tuple: bool = False,
        current: bool = True,
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
        the budget stays spent (``call.settle(actual)`` corrects the token charge); a
        request cancelled before its body began gives back what it drew.

        ``current=False`` (for extensions whose caller's code does not run inside the
        call, e.g. a transport returning a streamed response) enters a request that does
        not become the task's current one: a later request of the task on ``t`` is a
        call of its own, never joined to this one. It still joins an enclosing current
        request of the task on ``t``, like any request.

        Raises:
            InvalidArgumentError: a bad tuple, acceptance order, or ``tokens`` not an int
                in [0, 2**53] (raised here, before anything happens); an
                :class:`InvalidArgumentTypeError` when ``current`` is not a bool.
            TupleSuspendedError: ``reject_on_closed_tuple`` and ``t`` is or gets closed.
            CoordinatorBusyError: ``max_queued`` waiters already wait.
            UsageError: the context manager is entered twice.
        """
        charge = as_tokens(tokens)
        model_tuple, order = self._check(t, acceptance_order, reject_on_closed_tuple)
        as_bool(current, _CURRENT_MESSAGE)
        return RequestContext(
            self._core, model_tuple, charge, order, reject_on_closed_tuple, current
        )

    def request_sync(
        self,
        t: ModelTupleLike,
        /,
        *,
        tokens: int = 0,
        acceptance_order: int | None = None,
        reject_on_closed_tuple: bool = False,
        timeout: float | None = None,
    ) -> BlockingRequestContext:
        """``with coordinator.request_sync(t, tokens=n) as call:`` — :meth:`request`
        for a thread without an event loop (a sync SDK client in a thread pool).

        The same admission, in the same line as every async waiter: the gate, the
        budget, a slot of its own (a thread has no current permit, so it never covers
        one), the same settle and release. Any number of threads may wait at once; each
        blocks only itself. The wait is made on a private daemon loop of the process
        (see ``blocking``), so timed reopens and budget refills wake it even when no
        other loop runs.

        Args:
            timeout: the longest wait for admission, in seconds (``None``: no bound). Past
                it, nothing is held or drawn. 0 admits only what can be admitted at once.

        Raises:
            InvalidArgumentError: as :meth:`request`, or a bad ``timeout`` (raised here).
            AdmissionTimeoutError: not admitted within ``timeout`` (a ``TimeoutError``).
            TupleSuspendedError: ``reject_on_closed_tuple`` and ``t`` is or gets closed.
            CoordinatorBusyError: ``max_queued`` waiters already wait.
            UsageError: entered twice, or entered in a thread that runs an event loop
                (blocking it could stop the very release it waits for).

        A tuple a ``RedisFleet`` governs is admitted by the fleet first (on the fleet's
        event loop, the thread blocking meanwhile), within the same ``timeout``.
        """
        charge = as_tokens(tokens)
        model_tuple, order = self._check(t, acceptance_order, reject_on_closed_tuple)
        limit = as_timeout(timeout)
        return BlockingRequestContext(
            self._core, model_tuple, charge, order, reject_on_closed_tuple, limit
        )

    # -- lending -------------------------------------------------------------------------------

    def current_permit(self) -> AgentPermit | None:
        """The permit of *this* coordinator the calling code runs under, or ``None``.

        The innermost current permit issued by this coordinator, skipping permits of other
        coordinators nested around or inside it (the module-level ``current_permit()``
        returns the innermost permit of any coordinator). Like ``current_permit()``, a
        permit stays current after it is released, until its body ends; check
        ``permit.held``.
        """
        return find_permit(self._core)

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
        self._core._lend_begin(permit._ticket)
        try:
            yield
        except BaseException:
            await permit._lend_end()
            raise
        await permit._lend_end()

"""Permits, reservations and model requests: the handles a coordinator gives out.

Each is a thin shell over a scheduler ticket. Whatever changes scheduling state goes
through the coordinator's own methods (``_release``, ``_lend_begin``, ...), which hold its
lock and call the scheduler; nothing here touches the scheduler directly.

The current permit and request
------------------------------
``run(...)``, ``permit(...)`` and a reservation's ``run`` make their permit *current* for
the body and every task started in it (a ``ContextVar``, copied into tasks at spawn);
``with_lent_permit`` and ``request()`` look it up. The variable holds a chain of frames,
``(permit, coordinator, enclosing frame)``, since permits of two coordinators nest (an
agent run, inside it a run on the Bash pool): ``current_permit()`` is the innermost one,
while a coordinator uses the innermost permit *it* issued. A second variable holds the
model request the running code is inside, so that a ``request()`` entered again by the
same task (an SDK call inside a framework's request, both coordinated) joins it instead
of counting the call twice. Both variables are shared by every copy of the library in the
process (``_base/process_wide.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, final

import anyio.lowlevel

from .._base.errors import (
    InvalidArgumentTypeError,
    PermitReleasedError,
    ReservationCancelledError,
    ReservationUsedError,
    UsageError,
)
from .._base.process_wide import process_wide
from .._base.types import ModelTuple
from .._base.validate import as_callable
from .._base.waiter import PENDING, Parker, checkpoint
from .core import RELEASED_MESSAGE
from .tickets import DONE, GRANTED, INACTIVE, QUEUED, STATE_NAMES, PermitTicket

if TYPE_CHECKING:
    from .core import CoordinatorCore

__all__ = [
    "CONTEXT_VERSION",
    "RELEASED_MESSAGE",
    "AgentPermit",
    "AgentReservation",
    "PermitContext",
    "current_permit",
    "find_permit",
    "restore",
]

T = TypeVar("T")

CANCELLED_MESSAGE: Final = "Agent reservation cancelled"
USED_MESSAGE: Final = "Agent reservation has already been used"
WORK_MESSAGE: Final = "work must be a callable returning an awaitable"
WAIT_MESSAGE: Final = "wait must be a callable returning an awaitable"

# (permit, the coordinator that issued it, the enclosing frame). A plain tuple: entering
# a permit is on the hot path of every acquire.
_Frame = tuple["AgentPermit", object, "_Frame | None"]
CONTEXT_VERSION: Final = 1  # of the shared context variables (see _base/process_wide.py)
_current: ContextVar[_Frame | None] = process_wide(
    "current permit",
    CONTEXT_VERSION,
    lambda: ContextVar("lovely_coordinator_permit", default=None),
)


def current_permit() -> AgentPermit | None:
    """The permit the calling code runs under (the innermost one), or ``None``.

    Set by ``AgentCoordinator.run``/``permit`` and ``AgentReservation.run`` for their body
    and every task started in it. A permit stays current after it is released (until its
    body ends); check ``permit.state`` when that matters.
    """
    frame = _current.get()
    return None if frame is None else frame[0]


def find_permit(owner: object) -> AgentPermit | None:
    """The innermost current permit issued by ``owner``, or ``None``."""
    frame = _current.get()
    while frame is not None:
        if frame[1] is owner:
            return frame[0]
        frame = frame[2]
    return None


def _enter(permit: AgentPermit) -> tuple[_Frame, Token[_Frame | None]]:
    frame = (permit, permit._coordinator, _current.get())
    return frame, _current.set(frame)


def restore(var: ContextVar[Any], frame: tuple[Any, ...], token: Token[Any]) -> None:
    """Take ``frame`` (set with ``token``) out of the current context's chain, as far as
    it is there.

    Normally it is the current frame, and its enclosing frame becomes current again. An
    exit may run in another context, though (frameworks enter a stream's context manager
    in one task and exit it in another; pydantic-ai does): the same holds there if the
    context was copied from inside the body. An exit may also come out of order (a stream
    closed inside a later request of the same task): then the frames entered after it stay
    current and only its own frame leaves the chain. A context that never saw it is left
    alone. Never raises.
    """
    current = var.get()
    if current is frame:  # the usual case, and the cheapest way back: the token's reset
        try:
            var.reset(token)
        except ValueError:  # a token of another context
            var.set(frame[-1])
        return
    handle = frame[0]
    later = []
    while current is not None and current[0] is not handle:
        later.append(current)
        current = current[-1]
    if current is None:
        return  # never seen here
    rest = current[-1]
    for newer in reversed(later):  # rebuilt without it: frames are immutable
        rest = (*newer[:-1], rest)
    var.set(rest)


@final
class PermitContext(PermitTicket):
    """What ``AgentCoordinator.permit`` returns (a class, not a generator: it is hot).

    It *is* the permit's ticket, and the ticket is its own parker: one object per call
    (the :class:`AgentPermit` handle is made only once the slot is held).
    """

    __slots__ = ("_coordinator", "_frame", "_order", "_t", "_token")

    def __init__(
        self, coordinator: CoordinatorCore, t: ModelTuple, order: int | None, reject: bool
    ) -> None:
        PermitTicket.__init__(self, reject)
        self._coordinator = coordinator
        self._t = t
        self._order = order
        self._frame: _Frame | None = None
        self._token: Token[_Frame | None] | None = None

    async def __aenter__(self) -> AgentPermit:
        if self.seq:  # it took a place in line already
            raise UsageError("a permit() context manager can be entered only once")
        coordinator = self._coordinator
        # The checkpoint, before it takes a place: cancelled there, it took nothing.
        arriving = coordinator._arrive(self._t)
        if arriving:  # likely granted at once: this yield is its only suspension
            try:
                await checkpoint()
            except BaseException:
                coordinator._arrived()
                raise
        else:  # it will park: the park is its suspension
            await anyio.lowlevel.checkpoint_if_cancelled()
        coordinator._enqueue_permit(self, self._t, self._order, arriving)
        if self._state == PENDING:  # it waits: Parker.wait, inlined (a frame less)
            lock = coordinator._lock
            try:
                await self.sleep(lock)
            except BaseException:
                self.cancelled(coordinator, self, lock)
                raise
        self.outcome()
        permit = AgentPermit(coordinator, self)
        frame = self._frame = (permit, coordinator, _current.get())  # _enter, inlined
        self._token = _current.set(frame)
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        frame, token = self._frame, self._token
        assert frame is not None
        assert token is not None
        self._frame = self._token = None  # (the frame holds the permit, which holds self)
        try:
            restore(_current, frame, token)
        finally:
            if self.state != DONE:
                self._coordinator._release(self)


@final
class AgentPermit:
    """One granted slot on a model tuple.

    States: ``"held"`` (the slot is counted in ``active_count``), ``"lent"`` (the slot was
    given back while the holder waits on other work, see :meth:`lend`) and
    ``"released"`` (final). Permits come from the coordinator; do not construct them.
    """

    __slots__ = ("_coordinator", "_order", "_ticket")

    def __init__(self, coordinator: CoordinatorCore, ticket: PermitTicket) -> None:
        self._coordinator = coordinator
        self._ticket = ticket
        self._order = ticket.order

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

        From held, the slot goes to the next waiter at once (or, while a model request is
        in flight on it, as soon as that request ends). From lent, nothing is returned
        (the slot already was), and a lend waiting to reacquire fails with
        :class:`PermitReleasedError`.
        """
        if self._ticket.state != DONE:
            self._coordinator._release(self._ticket)

    async def lend(self, wait: Callable[[], Awaitable[T]]) -> T:
        """Give the slot back while awaiting ``wait()``, then take a slot again.

        Overlapping lends of one permit share the one returned slot; only the last to
        finish reacquires, bypassing closed gates and tuple caps, with the acceptance
        order chosen by ``CoordinatorConfig.reacquire``. ``wait``'s exception is
        re-raised after the reacquire. If the permit is released meanwhile, ``wait``'s
        outcome is returned without reacquiring; on a released permit this is just
        ``await wait()``.

        Raises:
            InvalidArgumentTypeError: ``wait`` is not callable (nothing was lent).
            PermitReleasedError: the permit was released while waiting to reacquire.

        If the reacquire is cancelled, the permit becomes released and the cancellation
        propagates.
        """
        as_callable(wait, WAIT_MESSAGE)
        if self._ticket.state == DONE:
            return await wait()
        self._coordinator._lend_begin(self._ticket)
        try:
            result = await wait()
        except BaseException:
            await self._lend_end()
            raise
        await self._lend_end()
        return result

    async def _lend_end(self) -> None:
        coordinator = self._coordinator
        ticket = self._ticket
        parker: Parker[bool] = Parker()
        if not coordinator._lend_end(ticket, parker):
            return  # others still lend it (the last one reacquires), or it was released
        granted = await parker.wait(coordinator, ticket, coordinator._lock)
        if granted and ticket.state == DONE:  # released between its grant and now
            raise PermitReleasedError(RELEASED_MESSAGE)

    async def _run(self, work: Callable[[], Awaitable[T]]) -> T:
        frame, token = _enter(self)
        try:
            return await work()
        finally:
            restore(_current, frame, token)
            self.release()


@final
class AgentReservation:
    """A place in line taken now, granted only once activated.

    It counts in ``queued_count`` from the start and keeps its acceptance order, so once
    :meth:`activate`\\ d (or :meth:`run`) it beats all work accepted after it.
    Reservations come from :meth:`AgentCoordinator.reserve`; do not construct them.
    """

    __slots__ = ("_coordinator", "_order", "_phase", "_ticket")

    # _phase: "new" (run not called), "waiting" (run waits for the slot), "running"
    # (its work runs: cancel is a no-op from here on), "cancelled" (granted, then given
    # back by cancel before run started).

    def __init__(self, coordinator: CoordinatorCore, ticket: PermitTicket) -> None:
        self._coordinator = coordinator
        self._ticket = ticket
        self._order = ticket.order
        self._phase = "new"

    def __repr__(self) -> str:
        state = self._ticket.state
        label = self._phase if self._phase in ("running", "cancelled") else STATE_NAMES[state]
        if state == DONE:
            label = "done"
        return f"<AgentReservation {self._ticket.tuple_state.tuple} order={self._order} {label}>"

    @property
    def acceptance_order(self) -> int:
        """The acceptance order the reservation holds its place with."""
        return self._order

    def activate(self) -> None:
        """Become eligible; granted at once if a slot is free. No-op once not queued."""
        if self._ticket.state == INACTIVE:
            self._coordinator._activate(self._ticket)

    def cancel(self, reason: BaseException | None = None) -> None:
        """Give up the place or the unused slot.

        Queued: the pending (or next) :meth:`run` raises ``reason``, or
        :class:`ReservationCancelledError` without one. Granted but not yet running: the
        slot goes to the next waiter and a later :meth:`run` raises
        :class:`ReservationCancelledError`. Once its work runs: no-op (even while the
        work lends the permit and waits to reacquire it).

        Raises:
            InvalidArgumentTypeError: ``reason`` is neither None nor an exception.
        """
        if reason is not None and not isinstance(reason, BaseException):
            raise InvalidArgumentTypeError("reason must be an exception or None")
        if self._phase in ("running", "cancelled"):
            return
        ticket = self._ticket
        state = ticket.state
        if state in (INACTIVE, QUEUED):
            error = reason if reason is not None else ReservationCancelledError(CANCELLED_MESSAGE)
            self._coordinator._fail(ticket, error)
        elif state == GRANTED:
            self._phase = "cancelled"
            self._coordinator._release(ticket)

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """Activate, wait for the slot, and run ``work()`` under its permit; then release.

        Raises:
            InvalidArgumentTypeError: ``work`` is not callable (the reservation is
                unchanged and may still be run).
            ReservationUsedError: ``run`` was already called.
            ReservationCancelledError: the reservation was cancelled (or the ``reason``
                given to :meth:`cancel`).
            TupleSuspendedError: it asked ``reject_on_closed_tuple`` and its tuple closed.
        """
        as_callable(work, WORK_MESSAGE)
        if self._phase != "new" and self._phase != "cancelled":
            raise ReservationUsedError(USED_MESSAGE)
        if self._phase == "cancelled":
            self._phase = "done"
            await anyio.lowlevel.checkpoint()
            raise ReservationCancelledError(CANCELLED_MESSAGE)
        self._phase = "waiting"
        coordinator = self._coordinator
        ticket = self._ticket
        if ticket.state == DONE:
            self._phase = "done"
            await anyio.lowlevel.checkpoint()
            error, ticket.error = ticket.error, None
            raise error if error is not None else ReservationCancelledError(CANCELLED_MESSAGE)
        await coordinator._activate_and_wait(ticket)
        if self._phase == "cancelled":
            self._phase = "done"
            raise ReservationCancelledError(CANCELLED_MESSAGE)
        self._phase = "running"
        return await AgentPermit(coordinator, ticket)._run(work)

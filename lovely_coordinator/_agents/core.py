"""The coordinator's machinery under its public API: the lock, the change point, the clock.

:class:`CoordinatorCore` is what permits, reservations and model requests talk to (the
methods below, each of which holds the lock and calls the scheduler), and what keeps the
world around the scheduler in step with it: the one change hook that notifies listeners
and keeps the one timer at the next wake-up, and the home loop that timed events run on.
``AgentCoordinator`` owns one (composition: it is the public face, the core the
machinery); every handle it gives out holds the core, never the public object.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final

import anyio.lowlevel

from .._base.config import CoordinatorConfig
from .._base.errors import PermitReleasedError
from .._base.types import CoordinatorStatistics, ModelTuple
from .._base.waiter import Parker
from .scheduler import Scheduler
from .statistics import snapshot
from .tickets import DONE, GRANTED, QUEUED, PermitTicket, RequestTicket, Ticket
from .timers import LoopClock, WakeupTimer
from .updates import UpdateHub

__all__ = ["RELEASED_MESSAGE", "CoordinatorCore"]

RELEASED_MESSAGE: Final = "Agent permit released while waiting to reacquire"


def _no_residents() -> int:
    return 0


class CoordinatorCore:
    """The lock, scheduler, clock, timer and hub of one coordinator (see the module).

    ``residents`` counts the coordinator's residents for its statistics (its owner sets
    it to its registry's count).
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.residents: Callable[[], int] = _no_residents
        self._config = config
        self._lock = threading.RLock()
        self._arriving = 0  # permit() callers between their checkpoint and their place
        self._clock = LoopClock()
        self._hub = UpdateHub(self._statistics, self._lock, self._update_hook)
        self._scheduler = Scheduler(
            config.max_concurrency,
            dict(config.tuple_limits),
            fresh_reacquire=config.reacquire == "fresh",
            max_queued=config.max_queued,
            clock=self._clock.now,
        )
        self._timer = WakeupTimer(self._clock, self._advance, self._lock, self._adopt)
        self._scheduler.on_change = self._on_change

    # -- the change point ----------------------------------------------------------------------

    def _on_change(self) -> None:
        # The scheduler's one change hook (under the lock): tell listeners, and keep the
        # one timer at the scheduler's next wake-up.
        if self._hub.listening:
            self._hub.notify()
        scheduler = self._scheduler
        if scheduler.wakeups or self._timer.armed_at is not None:
            self._timer.rearm(scheduler.next_wakeup())
        self._update_hook()

    def _update_hook(self) -> None:
        # The scheduler calls the hook only while it has something to do (see engine.py).
        self._scheduler.hooked = self._hub.listening or self._timer.armed_at is not None

    def _registries_changed(self) -> None:
        with self._lock:
            if self._hub.listening:
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
            self._update_hook()

    def _adopt(self) -> None:
        # On a loop of another thread, after the home loop shut down with a timer pending.
        with self._lock:
            self._follow()

    def _advance(self) -> None:
        # Its change hook re-arms the timer; when nothing was due (a stale timer that
        # fired before its cancel arrived from another thread) re-arm here.
        if not self._scheduler.advance():
            self._timer.rearm(self._scheduler.next_wakeup())
            self._update_hook()

    def _statistics(self) -> CoordinatorStatistics:
        with self._lock:
            return snapshot(self._scheduler, self._clock, self.residents())

    # -- taking a slot --------------------------------------------------------------------------

    def _park(self, ticket: Ticket) -> None:
        """The tail of every scheduling call that left ``ticket`` waiting (under the lock).

        A ticket waits as its own parker from *before* the call that places or activates
        it (``ticket.parker = ticket``), so a grant inside that call resolves it through
        the one grant rule (``Engine._grant``), like any later grant. The call leaves
        ``parker`` set exactly when the ticket still waits; then it is a guest of the
        clock. (The one grant made while nobody waited, a reservation's on an earlier
        ``activate()``, resolves it when its run starts.) The caller then awaits the
        ticket's wait outside the lock (``Parker.wait``, or its steps inlined): the sleep,
        or for a ticket granted already just the checkpoint, where a cancellation undoes
        the grant (``_parker_undo``). ``permit()``'s caller passed its checkpoint before
        it took its place (:meth:`_arrive`), so one granted at once skips the wait:
        the hottest path there is pays one suspension, as a semaphore's does.
        """
        self._clock.visit()  # a guest: it takes the timer over if home ends

    def _enqueue_permit(
        self, ticket: PermitTicket, t: ModelTuple, order: int | None, arriving: bool = False
    ) -> None:
        """Place a fresh permit ``ticket`` in line (``arriving``: its caller is one, see
        :meth:`_arrive`); then await its wait, unless it was granted at once."""
        with self._lock:
            if arriving:
                self._arriving -= 1
            if self._scheduler.wakeups:
                self._follow()
            ticket.parker = ticket  # (see _park)
            try:
                self._scheduler.enqueue(t, order, True, ticket.reject, ticket)
            except BaseException:
                ticket.parker = None  # refused: nothing waits
                raise
            if ticket.parker is not None:
                self._park(ticket)

    def _arrive(self, t: ModelTuple) -> bool:
        """Whether ``permit()``'s caller on ``t`` yields before it takes a place (then it
        counts as arriving until :meth:`_enqueue_permit` or :meth:`_arrived`).

        The caller must pass a checkpoint *before* it takes a place: cancelled there, it
        took nothing (no place in line, no acceptance order). One that will most likely
        be granted at once yields there (a plain ``waiter.checkpoint``), and that is its
        only suspension: nothing was granted before it, so no grant is undone. One that
        will park must not yield twice (its park is its suspension), so it only checks
        (``checkpoint_if_cancelled``). The callers still arriving count against the free
        slots, so that many arriving together do not all guess a slot of their own. (The
        guess only decides the cost: a caller whose slot was taken meanwhile parks too.)
        """
        scheduler = self._scheduler
        if scheduler.active + self._arriving >= scheduler.limit:  # (the cheap test first)
            return False
        with self._lock:
            if not scheduler.runs_at_once(t, self._arriving):
                return False
            self._arriving += 1
            return True

    def _arrived(self) -> None:
        # An arriving caller was cancelled at its checkpoint: it took nothing.
        with self._lock:
            self._arriving -= 1

    async def _acquire(self, t: ModelTuple, order: int | None, reject: bool) -> PermitTicket:
        """Wait for a permit's slot (``permit()`` does the same without this frame)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        ticket = PermitTicket(reject)
        self._enqueue_permit(ticket, t, order)
        await ticket.wait(self, ticket, self._lock)
        return ticket

    # -- what permits, reservations and requests call (each under the lock) ------------------

    def _parker_abort(self, ticket: Ticket) -> None:
        # A wait for ``ticket`` was cancelled while queued: it leaves the line.
        self._discard(ticket)

    def _parker_undo(self, ticket: Ticket, granted: bool) -> None:
        # A wait for ``ticket`` was cancelled after its grant: the slot goes on at once
        # (unless it was given back already, by a reservation's cancel). ``False`` is a
        # withdrawn reacquire: the ticket is another lend's now, nothing to give back.
        with self._lock:
            if granted and ticket.state == GRANTED:
                if isinstance(ticket, RequestTicket):
                    self._scheduler.refund(ticket)  # the call was never made
                self._release(ticket)

    def _activate_and_wait(self, ticket: PermitTicket) -> Coroutine[Any, Any, object]:
        """A reservation's run: activate its ticket and return the wait for its slot."""
        with self._lock:
            if ticket.state == GRANTED:
                ticket.grant(True)  # granted on an earlier activate(), while nobody waited
            else:
                ticket.parker = ticket  # (see _park)
                self._scheduler.activate(ticket)
                if ticket.parker is not None:
                    self._park(ticket)
        return ticket.wait(self, ticket, self._lock)

    def _activate(self, ticket: Ticket) -> None:
        with self._lock:
            self._scheduler.activate(ticket)

    def _enqueue_request(
        self, ticket: RequestTicket, t: ModelTuple, order: int | None, cover: PermitTicket | None
    ) -> None:
        """Place a fresh request ``ticket`` in line (see :meth:`_enqueue_permit`)."""
        with self._lock:
            scheduler = self._scheduler
            if scheduler.reads_clock(t):
                self._follow()  # it must be this loop's clock
            ticket.parker = ticket  # (see _park)
            try:
                scheduler.enqueue_request(t, order, ticket.reject, ticket.tokens, cover, ticket)
            except BaseException:
                ticket.parker = None  # refused: nothing waits
                raise
            if ticket.parker is not None:
                self._park(ticket)

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

    def _lend_begin(self, ticket: PermitTicket) -> None:
        with self._lock:
            withdrawn = self._scheduler.lend_begin(ticket)
            if withdrawn is not None:
                withdrawn.grant(False)  # that lend returns; this one will reacquire

    def _lend_end(self, ticket: PermitTicket, parker: Parker[bool]) -> bool:
        with self._lock:
            if self._scheduler.wakeups:
                self._follow()
            self._clock.visit()  # it may park to reacquire (see _enqueue_permit)
            return self._scheduler.lend_end(ticket, parker)

    def _settle(self, ticket: RequestTicket, tokens: int, increase: int = 0) -> None:
        # ``increase``: how much more than its largest earlier settlement (instruments).
        with self._lock:
            self._follow()
            self._scheduler.settle(ticket, tokens)
            observer = self._scheduler.observer
            if increase and observer is not None:
                observer.settled(ticket.tuple_state.tuple, increase)

"""The coordinator's whole scheduling decision, as pure synchronous code.

Nothing here awaits or sleeps, and the only clock deciding anything is the one the caller
passes in (read only where a budget needs it); ``time.monotonic()`` stamps when a ticket
really queues (``Ticket.since``), for how long it waited, never for a decision.
:class:`Scheduler` is a state machine over *tickets*
(``tickets.py``): permits, reservations and model requests. The async shell calls it, and
the scheduler hands grants over by calling ``parker.grant(True)`` / ``parker.fail(error)``
inside the very call that frees the slot, so nobody can barge in between. Every public
method that changes state ends by announcing it once (:meth:`_changed`: a version
counter and the ``on_change`` hook) — the single place the shell learns of changes.

The rule
--------
While fewer than ``limit`` slots are taken, the queued ticket with the smallest
``(acceptance order, arrival)`` key *that may run now* gets the next slot. A permit may
run when its tuple is open and below its cap (a lending permit's reacquire bypasses
both). A model request needs the same and one more thing: its tuple's budget must hold
1 request and its tokens. Tickets that may not run are skipped and keep their place.

A request may also run on the slot of its task's current permit (its *cover*) instead of
a slot of its own: a permit covers one request at a time. A request entered while its
cover is free is *covered* at once; otherwise it waits for a slot of its own *and* as a
*candidate* of its cover, and is covered as soon as the cover is free. So requests in
flight never outnumber slots, and a task holding the only slot that fans out requests
never deadlocks: its requests take turns on its own slot.

Rule L: a waiting request holds no slot (CONTRACT §9)
----------------------------------------------------
A permit whose holder has a covered request waiting, and no request in flight on it, is
*parked*: its slot is lent to the other waiters (it counts as lent) while the request
waits for its gate, its budget, its tuple's calls or a slot, and the request takes the
slot back when it is admitted, as its cover's. The covered request competes for slots
like any waiter, with the better of its own acceptance order and its cover's as its
*rank*: ahead of all work accepted after its permit, as the permit itself was. (When
nothing else could take the slot and the request may run at once, it simply runs on the
slot its permit holds: the same outcome, without the round trip.) A parked permit that
is lent or released hands its request back to a slot of its own; one whose request
leaves unrun (cancelled, refused by a closing gate) covers its next candidate, or takes
its slot back at once if one is free, else as a reacquire that its holder does not wait
for (its holder runs on meanwhile, as a lender's child does).

Caps: two bounds (CONTRACT §9)
------------------------------
A tuple's cap bounds two things apart: its *slots* (permits held on it and requests on
slots of their own; a reacquire, or a parked permit taking its slot back, may take it
past them, as §1 says of reacquires) and its *calls* (its requests in flight, on any
slot, covered by a permit of any tuple; nothing takes it past them). A permit needs a
slot below the cap; a request on a slot of its own needs both; a covered request needs a
call below the cap and a free slot, whichever tuple its cover is on.

Why nothing deadlocks: a waiter holds nothing that another waiter needs. A request waits
for a gate (opens), a budget (refills), its tuple's calls (held by requests in flight,
which end) or a slot (held by permits whose holders are not waiting on a request, by
requests in flight and by reacquires, which all end or become lent); a permit waits for
slots of the same kinds. A holder waiting on its own request has lent its slot (rule L)
or has a request in flight on it, which ends. Order within a tuple: requests take its
calls and its budget in rank order (an own-slot request's rank is its acceptance order),
so a small request never overtakes a larger one of better rank waiting for the budget.
The liveness invariant of tests/agents/test_scheduler.py checks all this after every step.

Budgets are strict within a tuple: once the budget holds back the earliest request that
could otherwise run (the *block*), no later request of that tuple draws until the budget
holds enough for it (``block_until``). The instant is a wake-up in ``wakeups``, the same
heap as the timed reopens of gates; the shell keeps one timer armed at the earliest one
and calls :meth:`advance` when it fires. Budgets never hold back permits.

Data structures, and why every operation is O(log n)
----------------------------------------------------
* Each tuple has three lines (``lines.Line``): permits, requests wanting a slot of their
  own, covered requests (keyed by rank). All three compete for slots through ``_ready``,
  a heap of lines keyed by (a lower bound of) their head's key; a line is pushed when it may have
  become runnable and a popped entry is re-checked (lazy deletion), so closing a gate,
  hitting a cap or a budget costs nothing up front.
* ``_bypass`` is a heap of reacquiring permits, which ignore gates and caps.
* Each permit keeps a heap of its candidates; a request leaves it lazily.
* Removing a ticket only marks it; lines and heaps that are mostly dead are rebuilt, so
  memory follows the live waiters and rebuilds cost O(1) amortised per removal.

Layers
------
One class in four modules, each layer calling only those under it: ``engine.Engine`` (the
state, the one grant loop and the grants of rule L), ``lending.Lending`` (waiting,
leaving, lends, parked permits), ``settings.Settings`` (caps, gates, budgets, time) and
:class:`Scheduler` (taking a place in line, releasing). It composes its tuple table
(``tuple_table.TupleTable``: each tuple's lines and counts), a ``budgets.Budget`` per
budgeted tuple and one ``wakeups.Wakeups`` heap. (Why layers and not one module: the
grant loop, rule L and leaving call one another, and together they are over a
thousand lines; each layer is a part that reads in one sitting.)
"""

from __future__ import annotations

import heapq
from typing import final

from .._base.errors import CoordinatorBusyError, TupleSuspendedError
from .._base.types import ModelTuple
from .._base.waiter import Wakeable
from .scheduler_checks import check_invariants
from .settings import SUSPENDED_MESSAGE, Settings
from .tickets import (
    DONE,
    GRANTED,
    INACTIVE,
    LENT,
    QUEUED,
    PermitTicket,
    RequestTicket,
    Ticket,
    TupleState,
)

__all__ = ["SUSPENDED_MESSAGE", "Scheduler"]


@final
class Scheduler(Settings):
    """Who gets the next slot. Synchronous; every call leaves the invariants true.

    Invariants (``check_invariants`` verifies them; the tests call it after every step):
        * ``active`` = slots taken (sum of the tuples' ``active``), ``queued`` = INACTIVE
          + QUEUED tickets, ``lent`` = LENT and parked permits plus queued reacquires.
        * Work-conserving: after every call, if ``active < limit`` then no queued ticket
          may run now.
        * A permit covers at most one request; a waiting covered request's cover is held
          and parked, and the request's rank is the better of the two orders; one in
          flight has its cover's slot (deferred, if the cover was lent or released); a
          free held permit has no live candidate.
        * No request is granted while its tuple's calls are at its cap.
        * Every budget block has a live wake-up at ``block_until``; every timed closure a
          live wake-up at ``reopens_at``.
        * The tuple table's own (``tuple_table.TupleTable``): an idle tuple is kept only
          among the last few idle ones.
        * ``_counter`` is at least every acceptance order seen.
    """

    __slots__ = ()

    # -- taking a place in line ----------------------------------------------------------------

    def _admit(self, model_tuple: ModelTuple, reject: bool) -> TupleState:
        """The newcomer's tuple, unless its closed gate refuses it."""
        state = self.tuples.states.get(model_tuple)
        if state is None:
            state = self.tuples.state(model_tuple)
        elif reject and not state.open:
            self._refused(state)
            raise TupleSuspendedError(SUSPENDED_MESSAGE)
        return state

    def _refused(self, state: TupleState) -> None:
        # A newcomer is rejected before it takes a place (instruments count it).
        if self.observer is not None:
            self.observer.refused(state.tuple)

    def _would_run(self, state: TupleState, order: int | None, tokens: int) -> bool:
        """Whether a new request on a slot of its own would be admitted at once (for
        max_queued; a pure read)."""
        if not (self.active < self.limit and state.line_admits(state.requests)):
            return False
        budget = state.budget
        if budget is None:
            return True
        key = (self._counter + 1 if order is None else order, self._seq + 1)
        block = state.block
        if block is not None and key > block.key:
            return False
        return budget.holds(tokens, self._clock())

    def _busy(self, state: TupleState, may_run_now: bool) -> None:
        # max_queued bounds the waiters: a newcomer that would have to wait while that many
        # already wait is refused (before it draws an order); one that runs at once is not.
        if self.max_queued is not None and self.queued >= self.max_queued and not may_run_now:
            self._refused(state)
            self.tuples.forget_if_idle(state)  # it may have been created just now
            raise CoordinatorBusyError()

    def _place(self, ticket: Ticket, order: int | None, state: TupleState) -> None:
        """The newcomer takes its place: its key (its acceptance order, drawn or seen, and
        its arrival), its tuple, and the queued counts (it is queued until granted)."""
        if order is None:
            self._counter += 1
            order = self._counter
        elif order > self._counter:
            self._counter = order
        self._seq += 1
        ticket.order = order
        ticket.seq = self._seq
        ticket.tuple_state = state
        if ticket.request:
            ticket.accepted = order  # type: ignore[misc]  # (a request: its own field)
        else:
            ticket.origin = order  # type: ignore[misc]  # (a permit: it has the slot)
        self.queued += 1
        state.queued += 1
        if ticket.reject:
            if state.foreground is None:
                state.foreground = {}
            state.foreground[ticket] = None

    def runs_at_once(self, model_tuple: ModelTuple, ahead: int = 0) -> bool:
        """Whether a permit on ``model_tuple`` enqueued now, after ``ahead`` others that
        will take slots first, would most likely be granted in that call: the condition
        of :meth:`enqueue`'s fast path (a pure read, a hint for the shell: it may be
        stale by the time the permit comes)."""
        if self.active + ahead >= self.limit or self._ready or self._bypass:
            return False
        state = self.tuples.states.get(model_tuple)
        return state is None or state.line_admits(state.permits)

    def enqueue(
        self,
        model_tuple: ModelTuple,
        order: int | None,
        active: bool,
        reject: bool,
        ticket: PermitTicket | None = None,
    ) -> PermitTicket:
        """A permit's (or, not ``active``, a reservation's) place in line.

        Arguments must already be valid. ``order`` None draws a fresh acceptance order
        (only once the request is admitted); an explicit one raises the counter. An active
        ticket may be granted at once. ``ticket``: a fresh ticket to place (the caller's
        context manager, which is one), else a new one; ``reject`` is then its own.

        Raises:
            TupleSuspendedError: ``reject`` and the tuple's gate is closed.
            CoordinatorBusyError: ``max_queued`` waiters wait and this one would too.
            (Either way nothing changed and no order was drawn.)
        """
        state = self._admit(model_tuple, reject)
        if ticket is None:
            ticket = PermitTicket(reject)
        may_run = active and self.active < self.limit and state.line_admits(state.permits)
        if may_run and not self._ready and not self._bypass:
            # With both heaps empty nobody else may run (work conservation), so a
            # newcomer that may run is the best waiter there is: granted at once.
            self._place(ticket, order, state)
            self._grant(ticket)
        else:
            if self.max_queued is not None:
                self._busy(state, may_run)
            self._place(ticket, order, state)
            if active:
                self._make_eligible(ticket)
            else:
                if state.inactive is None:
                    state.inactive = {}
                state.inactive[ticket] = None  # held only here until activated
            if ticket.state != GRANTED:
                self._waits(ticket)
        self.version += 1  # (_changed(), inlined in the two hottest mutators)
        if self.hooked or self.wakeups:
            self.on_change()
        return ticket

    def enqueue_request(
        self,
        model_tuple: ModelTuple,
        order: int | None,
        reject: bool,
        tokens: int,
        cover: PermitTicket | None,
        ticket: RequestTicket | None = None,
    ) -> RequestTicket:
        """A model request's place in line; ``cover`` is the current permit, if any.

        ``ticket``: as for :meth:`enqueue` (``reject`` and ``tokens`` are then its own).
        Raises as :meth:`enqueue`.
        """
        state = self._admit(model_tuple, reject)
        if cover is not None and cover.state == DONE:
            cover = None  # a released permit covers nothing
        if (
            cover is None
            and self.active < self.limit
            and not self._ready
            and not self._bypass
            and state.line_admits(state.requests)
            and (state.budget is None or self._would_run(state, order, tokens))
        ):
            # The uncontended path: with both heaps empty nobody else may run, so it is
            # the best waiter there is: granted at once.
            ticket = self._new_request(ticket, order, state, reject, tokens)
            self._grant(ticket)
            self._changed()
            return ticket
        covered = cover is not None and cover.state == GRANTED and cover.covering is None
        if self.max_queued is not None:
            # A request its permit covers is never refused: that permit was admitted, and
            # covers one request at a time, so these waiters are bounded by the permits.
            self._busy(state, covered or self._would_run(state, order, tokens))
        ticket = self._new_request(ticket, order, state, reject, tokens)
        ticket.state = QUEUED
        if cover is None:
            self._wait_own(ticket)
        else:
            ticket.cover = cover
            if covered:
                self._reserve(cover, ticket)
                self._drain()
            else:
                if cover.candidates is None:
                    cover.candidates = []
                heapq.heappush(cover.candidates, (ticket.order, ticket.seq, ticket))
                self._wait_own(ticket)
        if ticket.state == QUEUED:
            self._waits(ticket)
        self._changed()
        return ticket

    def _new_request(
        self,
        ticket: RequestTicket | None,
        order: int | None,
        state: TupleState,
        reject: bool,
        tokens: int,
    ) -> RequestTicket:
        if ticket is None:
            ticket = RequestTicket(reject, tokens)
        self._place(ticket, order, state)
        return ticket

    def _wait_own(self, ticket: RequestTicket) -> None:
        state = ticket.tuple_state
        state.requests.push(ticket)
        self._offer(state.requests)
        self._drain()

    def activate(self, ticket: Ticket) -> None:
        """Make an inactive ticket eligible (granting it at once if it may run). Else no-op."""
        if ticket.state == INACTIVE:
            inactive = ticket.tuple_state.inactive
            assert inactive is not None
            del inactive[ticket]
            self._make_eligible(ticket)
            self._changed()

    def _make_eligible(self, ticket: Ticket) -> None:
        ticket.state = QUEUED
        state = ticket.tuple_state
        line = state.permits
        line.push(ticket)
        if self.active >= self.limit:
            # No capacity: nothing can be granted; only the ready entry may need a better
            # key (the common case, a ticket behind the head, needs nothing at all).
            current = line.entry
            if current is None or (ticket.order, ticket.seq) < (current[0], current[1]):
                self._offer(line)
            return
        self._offer(line)
        self._drain()

    # -- leaving -------------------------------------------------------------------------------

    def fail(self, ticket: Ticket, error: BaseException) -> None:
        """Remove a queued ticket and make its waiter raise ``error`` (stored if none waits).

        A failed reacquire also ends the lend (``lent`` drops).
        """
        parker = self._discard(ticket)
        if parker is not None:
            parker.fail(error)
        else:
            ticket.error = error
        self._changed()

    def discard(self, ticket: Ticket) -> Wakeable | None:
        """Remove a queued ticket without waking anyone (its waiter was cancelled).

        Returns:
            The parker that was attached, now detached.
        """
        parker = self._discard(ticket)
        self._changed()
        return parker

    def release(self, ticket: Ticket) -> None:
        """End a GRANTED or LENT ticket: a slot of its own goes to the next waiter at once.

        A permit with a request in flight on its slot keeps the slot until that request
        ends; a request it merely reserved goes back to waiting for a slot of its own.
        """
        state = ticket.state
        ticket.state = DONE
        if isinstance(ticket, RequestTicket):
            assert state == GRANTED
            self._end_request(ticket)
        else:
            assert isinstance(ticket, PermitTicket)
            if state == GRANTED:
                if ticket.parked:
                    self._unpark(ticket)  # its slot is lent already: nothing to return
                    self.tuples.forget_if_idle(ticket.tuple_state)  # (it was lent until now)
                elif ticket.covering is not None:
                    ticket.deferred = True  # a request is in flight on its slot
                else:
                    self._return_slot(ticket.tuple_state)
            else:
                assert state == LENT
                self.lent -= 1
                ticket.tuple_state.lent -= 1
                self.tuples.forget_if_idle(ticket.tuple_state)
            if ticket.candidates is not None:
                ticket.candidates = None
        self.version += 1  # (_changed(), inlined)
        if self.hooked or self.wakeups:
            self.on_change()

    def _end_request(self, ticket: RequestTicket) -> None:
        state = ticket.tuple_state
        cover = ticket.cover
        state.calls -= 1
        if not ticket.covered or cover is None:
            self._return_slot(state)  # (it wakes the tuple if its calls were at its cap)
            return
        # Every change first, then one drain: the cover's next request is reserved (rule
        # L) before anything is granted, so it competes with its rank like the others.
        cover.covering = None
        home = cover.tuple_state
        if cover.deferred:
            cover.deferred = False
            self.active -= 1
            home.active -= 1
            if home.limit is not None and home.active == home.limit - 1:
                self._offer_all(home)  # its slots just dropped below its cap
        else:
            self._hand_cover(cover)
        if state.limit is not None and state.calls == state.limit - 1:
            self._offer_all(state)  # its calls just dropped below its cap
        self._drain()
        self.tuples.forget_if_idle(home)
        self.tuples.forget_if_idle(state)

    # -- checking ---------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert every invariant above (O(n); for tests). A pure read: it changes nothing."""
        check_invariants(self)

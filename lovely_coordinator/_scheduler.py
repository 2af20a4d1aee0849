"""The coordinator's whole scheduling decision, as pure synchronous code.

Nothing here awaits or sleeps, and the only clock is the one the caller passes in (read
only where a budget needs it). :class:`Scheduler` is a state machine over *tickets*
(``_lines.py``): permits, reservations and model requests. The async shell calls it, and
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
cover is free is *covered* at once and waits only for the gate, the budget and (when the
cover is on another tuple) its own tuple's cap; otherwise it waits for a slot of its own
*and* as a *candidate* of its cover, and takes the cover as soon as the cover is free.
So requests in flight never outnumber slots, and a task holding the only slot that fans
out requests never deadlocks: its requests take turns on its own slot.

Budgets are strict within a tuple: once the budget holds back the earliest request that
could otherwise run (the *block*), no later request of that tuple draws until the budget
holds enough for it (``block_until``). The instant is a wake-up in ``_wakeups``, the same
heap as the timed reopens of gates; the shell keeps one timer armed at the earliest one
and calls :meth:`advance` when it fires. Budgets never hold back permits.

Data structures, and why every operation is O(log n)
----------------------------------------------------
* Each tuple has three lines (``_lines.Line``): permits, requests wanting a slot of their
  own, covered requests. The first two compete for slots through ``_ready``, a heap of
  lines keyed by (a lower bound of) their head's key; a line is pushed when it may have
  become runnable and a popped entry is re-checked (lazy deletion), so closing a gate,
  hitting a cap or a budget costs nothing up front.
* ``_bypass`` is a heap of reacquiring permits, which ignore gates and caps.
* Each permit keeps a heap of its candidates; a request leaves it lazily.
* Removing a ticket only marks it; lines and heaps that are mostly dead are rebuilt, so
  memory follows the live waiters and rebuilds cost O(1) amortised per removal.
"""

from __future__ import annotations

import heapq
from typing import final

from ._errors import CoordinatorBusyError, TupleSuspendedError
from ._lines import DONE, GRANTED, INACTIVE, LENT, QUEUED, Ticket, TupleState, Wakeable
from ._scheduler_checks import check_invariants
from ._settings import SUSPENDED_MESSAGE, Settings
from ._types import ModelTuple

__all__ = ["SUSPENDED_MESSAGE", "Scheduler"]


@final
class Scheduler(Settings):
    """Who gets the next slot. Synchronous; every call leaves the invariants true.

    Invariants (``check_invariants`` verifies them; the tests call it after every step):
        * ``active`` = slots taken (sum of the tuples' ``active``), ``queued`` = INACTIVE
          + QUEUED tickets, ``lent`` = LENT permits plus queued reacquires.
        * Work-conserving: after every call, if ``active < limit`` then no queued ticket
          may run now; and no covered request that may run waits.
        * A permit covers at most one request; a covered request's cover is held (or,
          in flight, keeps its slot deferred); a free held permit has no live candidate.
        * Every budget block has a live wake-up at ``block_until``; every timed closure a
          live wake-up at ``reopens_at``.
        * Every idle tuple in ``_tuples`` is also in ``_idle`` (at most ``IDLE_KEPT``).
        * ``_counter`` is at least every acceptance order seen.
    """

    __slots__ = ()

    # -- taking a place in line ----------------------------------------------------------------

    def _admit(self, model_tuple: ModelTuple, reject: bool) -> TupleState:
        """The newcomer's tuple, unless its closed gate refuses it."""
        state = self._tuples.get(model_tuple)
        if state is None:
            state = self._tuples[model_tuple] = TupleState(model_tuple)
        elif reject and not state.open:
            raise TupleSuspendedError(SUSPENDED_MESSAGE)
        return state

    def _would_run(
        self, state: TupleState, order: int | None, tokens: int, cover: Ticket | None
    ) -> bool:
        """Whether a new request would be admitted at once (for max_queued; a pure read)."""
        if cover is not None:
            if not state.open or (cover.tuple_state is not state and state.capped):
                return False
        elif not (self.active < self.limit and state.admits):
            return False
        if not state.budgeted:
            return True
        key = (self._counter + 1 if order is None else order, self._seq + 1)
        block = state.block
        if block is not None and key > block.key:
            return False
        now = self._clock()
        requests, token_bucket = state.request_bucket, state.token_bucket
        if requests is not None and not requests.holds(1, now):
            return False
        return token_bucket is None or token_bucket.holds(tokens, now)

    def _busy(self, state: TupleState, may_run_now: bool) -> None:
        # max_queued bounds the waiters: a newcomer that would have to wait while that many
        # already wait is refused (before it draws an order); one that runs at once is not.
        if self.max_queued is not None and self.queued >= self.max_queued and not may_run_now:
            self._forget_if_idle(state)  # it may have been created just now
            raise CoordinatorBusyError()

    def _new_ticket(
        self, state: TupleState, order: int | None, reject: bool, request: bool
    ) -> Ticket:
        if order is None:
            self._counter += 1
            order = self._counter
        elif order > self._counter:
            self._counter = order
        self._seq += 1
        ticket = Ticket(order, self._seq, state, reject, request)
        self.queued += 1
        state.queued += 1
        if reject:
            if state.foreground is None:
                state.foreground = {}
            state.foreground[ticket] = None
        return ticket

    def _idle_capacity(self, state: TupleState) -> bool:
        # With both heaps empty nobody else may run (work conservation), so a newcomer
        # that may run is the best waiter there is.
        return self.active < self.limit and not self._ready and not self._bypass and state.admits

    def enqueue(
        self, model_tuple: ModelTuple, order: int | None, active: bool, reject: bool
    ) -> Ticket:
        """A permit's (or, not ``active``, a reservation's) place in line.

        Arguments must already be valid. ``order`` None draws a fresh acceptance order
        (only once the request is admitted); an explicit one raises the counter. An active
        ticket may be granted at once.

        Raises:
            TupleSuspendedError: ``reject`` and the tuple's gate is closed.
            CoordinatorBusyError: ``max_queued`` waiters wait and this one would too.
            (Either way nothing changed and no order was drawn.)
        """
        state = self._admit(model_tuple, reject)
        fast = active and self._idle_capacity(state)
        if self.max_queued is not None:
            self._busy(state, active and self.active < self.limit and state.admits)
        ticket = self._new_ticket(state, order, reject, False)
        if fast:
            ticket.state = QUEUED
            self._grant(ticket)
        elif active:
            self._make_eligible(ticket)
        self._changed()
        return ticket

    def enqueue_request(
        self,
        model_tuple: ModelTuple,
        order: int | None,
        reject: bool,
        tokens: int,
        cover: Ticket | None,
    ) -> Ticket:
        """A model request's place in line; ``cover`` is the current permit, if any.

        Raises as :meth:`enqueue`.
        """
        state = self._admit(model_tuple, reject)
        if cover is not None and cover.state == DONE:
            cover = None  # a released permit covers nothing
        covered = cover is not None and cover.state == GRANTED and cover.covering is None
        if self.max_queued is not None:
            self._busy(state, self._would_run(state, order, tokens, cover if covered else None))
        ticket = self._new_ticket(state, order, reject, True)
        ticket.tokens = tokens
        ticket.state = QUEUED
        if cover is None:
            self._wait_own(ticket)
        else:
            ticket.cover = cover
            if covered:
                ticket.covered = True
                cover.covering = ticket
                state.covered.push(ticket)
                self._serve_covered(state)
            else:
                if cover.candidates is None:
                    cover.candidates = []
                heapq.heappush(cover.candidates, (ticket.order, ticket.seq, ticket))
                self._wait_own(ticket)
        self._changed()
        return ticket

    def _wait_own(self, ticket: Ticket) -> None:
        state = ticket.tuple_state
        state.requests.push(ticket)
        self._offer(state.requests)
        self._drain()

    def activate(self, ticket: Ticket) -> None:
        """Make an inactive ticket eligible (granting it at once if it may run). Else no-op."""
        if ticket.state == INACTIVE:
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
        if ticket.request:
            assert state == GRANTED
            self._end_request(ticket)
        elif state == GRANTED:
            if self._give_up_cover(ticket):
                ticket.deferred = True
            else:
                self._return_slot(ticket.tuple_state)
        else:
            assert state == LENT
            self.lent -= 1
        ticket.candidates = None
        self._changed()

    def _end_request(self, ticket: Ticket) -> None:
        state = ticket.tuple_state
        cover = ticket.cover
        if not ticket.covered or cover is None:
            self._return_slot(state)
            return
        cover.covering = None
        if cover.tuple_state is not state:
            state.borrowed -= 1
            if state.limit is not None and state.active + state.borrowed == state.limit - 1:
                self._wake_tuple(state)  # it just dropped below its cap
        if cover.deferred:
            cover.deferred = False
            self._return_slot(cover.tuple_state)
        else:
            self._hand_cover(cover)
            self._drain()
        self._forget_if_idle(state)

    def _give_up_cover(self, permit: Ticket) -> bool:
        """A held permit stops covering; True if a request is in flight on its slot."""
        request = permit.covering
        if request is None:
            return False
        if request.state == GRANTED:
            return True
        self._uncover(request)  # reserved only: back to a slot of its own
        return False

    def _uncover(self, request: Ticket) -> None:
        state = request.tuple_state
        cover = request.cover
        assert cover is not None
        state.covered.remove(request)
        request.covered = False
        cover.covering = None
        if cover.state == DONE:
            request.cover = None
        else:  # lent: it may cover again once it is held again
            if cover.candidates is None:
                cover.candidates = []
            heapq.heappush(cover.candidates, (request.order, request.seq, request))
        state.requests.push(request)
        self._offer(state.requests)
        self._drain()

    # -- lending ---------------------------------------------------------------------------------

    def lend_begin(self, ticket: Ticket) -> Wakeable | None:
        """A lend of a permit starts; returns a parker that must now be told ``False``.

        Held: its slot goes back (unless a request is in flight on it: then it stays
        taken until that request ends). Already lent: just counted. Waiting to reacquire
        (an earlier lend ended): that wait is withdrawn, since this lend will reacquire
        when it ends; the returned parker is that earlier lend's, to be woken with False.
        """
        state = ticket.state
        withdrawn: Wakeable | None = None
        if state == GRANTED:
            ticket.state = LENT
            self.lent += 1
            if self._give_up_cover(ticket):
                ticket.deferred = True
            else:
                self._return_slot(ticket.tuple_state)
        elif state == QUEUED:
            assert ticket.bypass
            self._unqueue(ticket)  # it leaves the queue, and stays counted in lent
            ticket.state = LENT
            ticket.bypass = False
            withdrawn, ticket.parker = ticket.parker, None
            self._forget_if_idle(ticket.tuple_state)
        ticket.lends += 1
        self._changed()
        return withdrawn

    def lend_end(self, ticket: Ticket, parker: Wakeable) -> bool:
        """A lend ends; True if it reacquires (``parker`` is then told when it is held).

        Only the last of overlapping lends reacquires, with a fresh acceptance order or
        the permit's original one (``fresh_reacquire``), bypassing gates and caps; it may
        be granted inside this call. A permit whose slot stayed taken (a request in flight
        on it) is simply held again. Released meanwhile: nothing to reacquire.
        """
        ticket.lends -= 1
        if ticket.lends or ticket.state != LENT:
            return False
        if ticket.deferred:
            ticket.deferred = False
            ticket.state = GRANTED
            self.lent -= 1
            self._changed()
            return False
        order = self.next_order() if self.fresh_reacquire else ticket.origin
        state = self._state(ticket.tuple_state.tuple)  # it may have been forgotten meanwhile
        ticket.tuple_state = state
        if order > self._counter:
            self._counter = order
        self._seq += 1
        ticket.order = order
        ticket.seq = self._seq
        ticket.state = QUEUED
        ticket.bypass = True
        ticket.reject = False  # a reacquire is never failed by a closing gate
        ticket.parker = parker
        self.queued += 1
        state.queued += 1
        heapq.heappush(self._bypass, (order, ticket.seq, ticket))
        self._drain()
        self._changed()
        return True

    # -- checking ---------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert every invariant above (O(n); for tests). A pure read: it changes nothing."""
        check_invariants(self)

"""The scheduler's lending and covers: a permit gives its slot back while its holder
waits, for a child (a lend) or for its own request (rule L, a *parked* permit).

A permit held by a parent agent is *lent* while the parent waits for a child: its slot
goes to the next waiter, and the permit takes a slot back (a *reacquire*) when the wait
ends, bypassing gates and caps. Overlapping lends share the one returned slot and only the
last one to end reacquires. A permit with a model request in flight on its slot keeps the
slot (deferred) until the request ends. A permit that covers a waiting request is parked:
its slot is lent until the request takes it back (``engine.Engine._reserve``). Leaving the queue
(``_discard``) is here too: a covered request that leaves hands its cover's slot back. See
``scheduler.py`` for the rules as a whole.
"""

from __future__ import annotations

import heapq
from time import monotonic

from .._base.waiter import Wakeable
from .engine import Engine, bypass_live
from .instruments import CANCELLED, WaitOutcome
from .lines import COMPACT_MIN
from .tickets import DONE, GRANTED, INACTIVE, LENT, QUEUED, PermitTicket, RequestTicket, Ticket

__all__ = ["Lending"]


class Lending(Engine):
    """Waiting and leaving, lending and covers, on top of the grant loop."""

    __slots__ = ()

    # -- waiting --------------------------------------------------------------------------------

    def _waits(self, ticket: Ticket) -> None:
        """``ticket`` really queued (it was not granted in the call that enqueued it)."""
        ticket.since = monotonic()
        if self.observer is not None:
            self.observer.started(ticket)

    # -- leaving ---------------------------------------------------------------------------------

    def _discard(self, ticket: Ticket, outcome: WaitOutcome = CANCELLED) -> Wakeable | None:
        assert ticket.state in (INACTIVE, QUEUED)
        if self.observer is not None:
            self.observer.ended(ticket, outcome)
        state = ticket.tuple_state
        covered = ticket.covered
        self._unqueue(ticket)
        if ticket.bypass:
            self.lent -= 1
            state.lent -= 1
            ticket.bypass = False
        ticket.state = DONE
        parker, ticket.parker = ticket.parker, None
        if isinstance(ticket, RequestTicket):
            cover = ticket.cover
            if covered and cover is not None:
                ticket.covered = False
                cover.covering = None
                self._take_back(cover)  # it was parked for this request (rule L)
            if state.block is ticket:
                self._unblock(state)  # the front left: the next one may need less
        self.tuples.forget_if_idle(state)
        return parker

    def _unqueue(self, ticket: Ticket) -> None:
        state = ticket.tuple_state
        self.queued -= 1
        state.queued -= 1
        if ticket.reject and state.foreground is not None:
            state.foreground.pop(ticket, None)
        if ticket.state != QUEUED:
            inactive = state.inactive
            assert inactive is not None
            del inactive[ticket]  # inactive: in no line, only there
            return
        if ticket.bypass:
            self._bypass_dead += 1
            if self._bypass_dead > COMPACT_MIN and 2 * self._bypass_dead > len(self._bypass):
                ticket.state = DONE  # so the rebuild drops it
                self._bypass = [e for e in self._bypass if bypass_live(e)]
                heapq.heapify(self._bypass)
                self._bypass_dead = 0
        elif ticket.line is not None:
            ticket.line.remove(ticket)

    # -- parked permits ---------------------------------------------------------------------

    def _unpark(self, permit: PermitTicket) -> None:
        """A parked permit is lent or released: its reserved request goes back to a slot
        of its own (and, lent, to waiting for the permit as a candidate)."""
        request = permit.covering
        assert permit.parked
        assert request is not None
        permit.parked = False
        if permit.state == DONE:
            self.lent -= 1
            permit.tuple_state.lent -= 1
        self._uncover(request)

    def _uncover(self, request: RequestTicket) -> None:
        state = request.tuple_state
        cover = request.cover
        assert cover is not None
        state.covered.remove(request)
        request.covered = False
        request.order = request.accepted  # its rank was its cover's (rule L)
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

    # -- covers (rule L) ------------------------------------------------------------------

    def _take_back(self, cover: PermitTicket) -> None:
        """A parked permit whose request left unrun (and that covers nothing now) takes
        its slot back: at once if one is free, else as a reacquire (its holder does not
        wait for it), ahead of work accepted after it."""
        if cover.candidates:
            self._hand_cover(cover)
            if cover.covering is not None:
                self._drain()  # the candidate may run where the request could not
                return
        cover.parked = False
        home = cover.tuple_state
        if self.active < self.limit:
            self.lent -= 1
            home.lent -= 1
            self.active += 1
            home.active += 1
            return
        cover.state = QUEUED
        cover.bypass = True
        self._seq += 1
        cover.seq = self._seq
        cover.since = None
        self.queued += 1
        home.queued += 1
        heapq.heappush(self._bypass, (cover.order, cover.seq, cover))
        self._waits(cover)

    # -- lending ---------------------------------------------------------------------------------

    def lend_begin(self, ticket: PermitTicket) -> Wakeable | None:
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
            if ticket.parked:
                self._unpark(ticket)  # lent already (counted so), its slot out already
            else:
                self.lent += 1
                ticket.tuple_state.lent += 1
                if ticket.covering is not None:
                    ticket.deferred = True  # a request is in flight on its slot
                else:
                    self._return_slot(ticket.tuple_state)
        elif state == QUEUED:
            assert ticket.bypass
            if self.observer is not None:
                self.observer.ended(ticket, "cancelled")  # this reacquire is withdrawn
            self._unqueue(ticket)  # it leaves the queue, and stays counted in lent
            ticket.state = LENT
            ticket.bypass = False
            withdrawn, ticket.parker = ticket.parker, None
            self.tuples.forget_if_idle(ticket.tuple_state)
        ticket.lends += 1
        self._changed()
        return withdrawn

    def lend_end(self, ticket: PermitTicket, parker: Wakeable) -> bool:
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
            ticket.tuple_state.lent -= 1
            self._changed()
            return False
        order = self.next_order() if self.fresh_reacquire else ticket.origin
        state = self.tuples.state(ticket.tuple_state.tuple)  # it may have been forgotten meanwhile
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
        ticket.since = None  # a new wait: stamped below if it really queues
        self.queued += 1
        state.queued += 1
        heapq.heappush(self._bypass, (order, ticket.seq, ticket))
        self._drain()
        if ticket.state == QUEUED:
            self._waits(ticket)
        self._changed()
        return True

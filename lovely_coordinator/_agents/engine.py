"""The scheduler's grant machinery: who may run now, and the one loop that grants.

:class:`Engine` holds the scheduler's state and decides, for every line, whether its head
may run now (gate, cap, budget) and grants in ``(acceptance order, arrival)`` order while
slots are free. A grant may cover a request (rule L): a reacquired permit with a
request waiting for its slot takes it on at once (:meth:`Engine._hand_cover`,
:meth:`Engine._reserve`), so those are here too, and the engine never calls up into
the layers built on it. ``scheduler.Scheduler`` builds the operations (enqueue,
release, lend, close, budgets) on top of it; see that module for the rules as a whole.

Budgets and time
----------------
A tuple's budget is a ``budgets.Budget`` (its buckets' arithmetic, testable alone).
Before a request draws, :meth:`Engine._may_draw` checks its tuple's *block* (the earliest
request the budget holds back: no later request of the tuple may overtake it) and then
the budget; a request it cannot hold yet becomes the block, with the instant it becomes
affordable as a wake-up. Wake-ups of both kinds (budget blocks and timed gate reopens)
live in one heap, ``wakeups`` (``wakeups.Wakeups``, lazy deletion); the shell arms one
timer at :meth:`Engine.next_wakeup` and calls ``advance`` when it fires. The clock is the
caller's (``clock``), read only when a budget is involved, so tests can drive it and the
hot path never reads it.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

from .._base.types import ModelTuple
from .events import BUDGETS, budget_exhausted
from .lines import PERMITS
from .tickets import (
    GRANTED,
    QUEUED,
    Entry,
    PermitTicket,
    ReadyEntry,
    RequestTicket,
    Ticket,
    TicketLine,
    TupleState,
)
from .tuple_table import TupleTable
from .wakeups import BUDGET, Wakeups

if TYPE_CHECKING:
    from .instruments import Dispatch

__all__ = ["Engine", "bypass_live"]


def _no_clock() -> float:
    return 0.0


def _nothing() -> None:
    pass


class Engine:
    """The scheduler's state and grant loop (see the module docstring)."""

    __slots__ = (
        "_bypass",
        "_bypass_dead",
        "_clock",
        "_counter",
        "_ready",
        "_seq",
        "active",
        "fresh_reacquire",
        "hooked",
        "lent",
        "limit",
        "max_queued",
        "observer",
        "on_change",
        "queued",
        "tuples",
        "version",
        "wakeups",
    )

    def __init__(
        self,
        limit: int,
        tuple_limits: dict[ModelTuple, int] | None = None,
        *,
        fresh_reacquire: bool = True,
        max_queued: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.limit = limit
        self.fresh_reacquire = fresh_reacquire
        self.max_queued = max_queued
        self.active = 0
        self.queued = 0
        self.lent = 0
        self.version = 0
        # The change hook, called when ``hooked`` (someone listens, a timer is armed) or
        # a wake-up exists (its timer must be armed): the hot path pays two reads.
        self.on_change: Callable[[], object] = _nothing
        self.hooked = False
        # The registered instruments (``instruments``), told of every wait's start and
        # end; None while there are none, which is all the hot paths test.
        self.observer: Dispatch | None = None
        self._clock: Callable[[], float] = clock or _no_clock
        self._counter = 0
        self._seq = 0
        self.tuples = TupleTable()
        self._ready: list[ReadyEntry] = []
        self._bypass: list[Entry] = []
        self._bypass_dead = 0
        self.wakeups = Wakeups()
        for model_tuple, tuple_limit in (tuple_limits or {}).items():
            self.tuples.state(model_tuple).limit = tuple_limit

    def _changed(self) -> None:
        """The one place a change is announced (every public mutator ends with it)."""
        self.version += 1
        if self.hooked or self.wakeups:
            self.on_change()

    # -- reads --------------------------------------------------------------------------------

    def next_order(self) -> int:
        """A fresh acceptance order, larger than every order seen so far."""
        self._counter += 1
        return self._counter

    def tuple_state(self, model_tuple: ModelTuple) -> TupleState | None:
        """The tuple's bookkeeping, or None when it is idle (open, uncapped, unused)."""
        state = self.tuples.states.get(model_tuple)
        return None if state is None or state.idle else state

    def known_tuple(self, pair: tuple[object, ...]) -> ModelTuple | None:
        """The tuple equal to ``pair`` that the scheduler holds state for, or None (a
        pure read, safe without the lock: one dict lookup)."""
        state = self.tuples.states.get(pair)  # type: ignore[call-overload]
        return None if state is None else state.tuple

    def tuple_states(self) -> Iterator[TupleState]:
        """Every non-idle tuple, in no particular order."""
        return self.tuples.busy()

    def reacquires(self) -> Iterator[Entry]:
        """The live entries ``(order, seq, ticket)`` of the reacquires waiting for a slot,
        in no particular order (a pure read)."""
        return (entry for entry in self._bypass if bypass_live(entry))

    def next_wakeup(self) -> float | None:
        """The earliest instant a timer must call :meth:`advance` at, or None.

        (Drops wake-ups that no longer apply from the top of the heap; no other effect.)
        """
        return self.wakeups.next()

    def reads_clock(self, model_tuple: ModelTuple) -> bool:
        """Whether a request on ``model_tuple`` may read the clock: a wake-up is pending,
        or its tuple has a budget (the shell first makes the clock the caller's loop's)."""
        if self.wakeups:
            return True
        state = self.tuples.states.get(model_tuple)
        return state is not None and state.budget is not None

    # -- who may run ----------------------------------------------------------------------------

    def _offer(self, line: TicketLine) -> None:
        """Make sure a runnable line with a live head is represented in ``_ready``."""
        state = line.state
        if not state.line_admits(line):
            return
        head = line.head()
        if head is None:
            return
        block = state.block
        if line.kind != PERMITS and block is not None and head.key > block.key:
            return  # held back behind the budget's front until its wake-up
        entry = line.entry
        if (
            entry is None
            or head.order < entry[0]
            or (head.order == entry[0] and head.seq < entry[1])
        ):
            entry = line.entry = (head.order, head.seq, line)
            heapq.heappush(self._ready, entry)
            if len(self._ready) > 4 * len(self.tuples) + 64:
                self._ready = [e for e in self._ready if e is e[2].entry]
                heapq.heapify(self._ready)

    def _wake_tuple(self, state: TupleState) -> None:
        """Something may now run on this tuple (a gate opened, a cap or budget moved)."""
        self._offer_all(state)
        self._drain()

    def _offer_all(self, state: TupleState) -> None:
        self._offer(state.permits)
        self._offer(state.requests)
        self._offer(state.covered)

    def _may_draw(self, state: TupleState, ticket: Ticket) -> bool:
        """Whether request ``ticket`` may draw from its tuple's budget now.

        While the tuple is blocked, its front and every request behind it wait for the
        block's wake-up (or a change of the budget); only a request ahead of the front
        may try. One that the budget cannot hold yet becomes the block, with a wake-up at
        the instant it can.
        """
        budget = state.budget
        if budget is None:
            return True
        block = state.block
        if block is not None and (block is ticket or ticket.key > block.key):
            return False
        now = self._clock()
        ready = budget.ready_at(ticket.tokens, now)
        if ready == now:
            return True
        state.block = ticket
        self._block_until(state, ready)
        if BUDGETS.isEnabledFor(logging.DEBUG):
            budget_exhausted(state, ticket, ready, now)
        return False

    def _block_until(self, state: TupleState, instant: float) -> None:
        if state.block_until != instant:
            state.block_until = instant
            self.wakeups.add(instant, BUDGET, state)

    def _unblock(self, state: TupleState) -> None:
        """Forget the tuple's block and let its requests try again (in key order)."""
        if state.block is None:
            return
        state.block = None
        state.block_until = None  # its wake-up is dead now
        self._wake_tuple(state)

    # -- granting -------------------------------------------------------------------------------

    def _drain(self) -> None:
        """Grant slots while there is capacity and someone may run (the only grant loop)."""
        ready = self._ready
        bypass = self._bypass
        while self.active < self.limit:
            while bypass and not bypass_live(bypass[0]):
                heapq.heappop(bypass)
                self._bypass_dead -= 1
            # Settle the top of the ready heap on a line that may run, with its true key.
            while ready:
                entry = ready[0]
                line = entry[2]
                if entry is not line.entry:
                    heapq.heappop(ready)  # superseded by a better entry, or forgotten
                    continue
                state = line.state
                head = line.head() if state.line_admits(line) else None
                block = state.block
                if head is None or (
                    line.kind != PERMITS and block is not None and head.key > block.key
                ):
                    line.entry = None
                    heapq.heappop(ready)
                    continue
                if head.seq != entry[1]:
                    line.entry = (head.order, head.seq, line)
                    heapq.heapreplace(ready, line.entry)
                    continue
                break
            if bypass and (not ready or _before(bypass[0], ready[0])):
                self._grant(heapq.heappop(bypass)[2])
            elif ready:
                line = ready[0][2]
                if line.kind != PERMITS and not self._may_draw(line.state, line.first()):
                    line.entry = None
                    heapq.heappop(ready)
                    continue
                self._grant_from(line)
            else:
                break

    def _grant_from(self, line: TicketLine) -> None:
        """Grant the head of ``line``, whose entry the drain just settled on top of
        ``_ready``, and re-key the line there (the only caller is :meth:`_drain`)."""
        # Never touches _ready: a permit granted from its line covers nothing yet, and a
        # covered request's cover takes its slot back without offering anything.
        self._grant(line.pop())
        head = line.head() if line.state.line_admits(line) else None
        ready = self._ready
        assert ready[0] is line.entry
        if head is None:
            heapq.heappop(ready)
            line.entry = None
        else:
            line.entry = (head.order, head.seq, line)
            heapq.heapreplace(ready, line.entry)

    def _grant(self, ticket: Ticket) -> None:
        """Grant queued ``ticket`` (the one rule of every grant; it left its line, or never
        entered one). It gets a slot of its own, or, covered, runs on its cover's slot:
        the slot the cover holds, or, parked, the one it lent, which it takes back."""
        state = ticket.tuple_state
        if self.observer is not None:
            self.observer.ended(ticket, "granted")
        ticket.state = GRANTED
        self.queued -= 1
        state.queued -= 1
        if not ticket.covered:
            self.active += 1
            state.active += 1
        else:
            cover = ticket.cover
            assert cover is not None
            if cover.parked:
                cover.parked = False
                self.lent -= 1
                cover.tuple_state.lent -= 1
                cover.tuple_state.active += 1
                self.active += 1
        if ticket.reject and state.foreground is not None:
            state.foreground.pop(ticket, None)
        if ticket.bypass:
            ticket.bypass = False
            self.lent -= 1
            state.lent -= 1
        elif ticket.request:
            state.calls += 1
            self._draw(state, ticket)
        parker = ticket.parker
        if parker is not None:
            ticket.parker = None
            parker.grant(True)
        if ticket.candidates:  # a reacquired permit may cover at once
            self._hand_cover(cast(PermitTicket, ticket))

    def _draw(self, state: TupleState, ticket: Ticket) -> None:
        budget = state.budget
        if budget is None:
            return
        now = self._clock()
        budget.draw(ticket.tokens, now)
        block = state.block
        if block is not None:
            # A request ahead of the front drew: the front waits longer now.
            self._block_until(state, budget.ready_at(block.tokens, now))

    def _return_slot(self, state: TupleState) -> None:
        self.active -= 1
        state.active -= 1
        if self.queued:  # else nobody could take the slot
            limit = state.limit
            if limit is not None and (state.active == limit - 1 or state.calls == limit - 1):
                self._wake_tuple(state)  # its slots or calls just dropped below its cap
            self._drain()
        if not state.active and not state.queued:
            self.tuples.forget_if_idle(state)

    # -- covers (rule L) ------------------------------------------------------------------

    def _hand_cover(self, cover: PermitTicket) -> None:
        """Give a held permit that covers nothing to its best waiting candidate, if any.

        Grants nothing by itself, unless the candidate may run on the cover's slot at
        once (see :meth:`_reserve`); the caller drains.
        """
        heap = cover.candidates
        if cover.state != GRANTED or cover.covering is not None or not heap:
            return
        while heap:
            _order, seq, request = heapq.heappop(heap)
            state = request.tuple_state
            if request.seq == seq and request.line is state.requests:
                state.requests.remove(request)
                self._reserve(cover, request)
                return

    def _reserve(self, cover: PermitTicket, request: RequestTicket) -> None:
        """``request`` is covered by ``cover`` (held, covering nothing) from now on.

        Rule L: its rank is the better of its own order and its cover's; it runs on the
        cover's slot at once if nothing else could take that slot and it may run now;
        otherwise the cover is parked (its slot lent to the others, and counted lent)
        and the request waits in its tuple's covered line like any waiter for a slot.
        Either way the outcome is the drain's, had the cover been parked first. The
        caller drains (the drain itself calls this for a reacquired cover, and goes on).
        """
        state = request.tuple_state
        request.covered = True
        cover.covering = request
        if cover.order < request.accepted:
            request.order = cover.order
        home = cover.tuple_state
        if (
            not cover.parked
            and (home.limit is None or home.active != home.limit)  # parking frees no line
            and not self._ready
            and not self._bypass
            and self.active <= self.limit
            and state.open
            and (state.limit is None or state.calls < state.limit)
            and self._may_draw(state, request)
        ):
            self._grant(request)  # on the slot its cover holds
            return
        state.covered.push(request)
        if not cover.parked:
            cover.parked = True
            self.lent += 1
            home.lent += 1
            self.active -= 1
            home.active -= 1
            limit = home.limit
            if limit is not None and home.active == limit - 1:
                self._offer_all(home)  # its slots just dropped below its cap
        self._offer(state.covered)


def bypass_live(entry: Entry) -> bool:
    ticket = entry[2]
    return ticket.state == QUEUED and ticket.bypass and ticket.seq == entry[1]


def _before(a: Entry, b: ReadyEntry) -> bool:
    """Whether entry ``a`` sorts before entry ``b`` (keys only; they are never equal)."""
    return a[0] < b[0] or (a[0] == b[0] and a[1] < b[1])

"""The agent coordinator's whole fairness decision, as pure synchronous code.

Nothing here awaits, sleeps or looks at a clock. :class:`Scheduler` is a state machine over
*tickets* (one per place in line, later the slot of a permit). The async shell in
``_coordinator.py`` calls it, and the scheduler hands grants over by calling
``parker.grant(True)`` / ``parker.fail(error)`` on the ticket's parker, inside the very
call that frees the slot, so nobody can barge in between.

The rule
--------
While fewer than ``limit`` slots are granted, the queued ticket with the smallest
``(acceptance order, arrival)`` key *that may run now* gets the next slot. A ticket may run
now when it is eligible (a reservation must be activated) and either it is a lending
permit's reacquire (which bypasses gates and caps) or its tuple is open and below its
per-tuple cap. Tickets that may not run are skipped and keep their place.

Data structures, and why every operation is O(log n)
----------------------------------------------------
* Each tuple has a heap of its eligible, non-reacquire tickets, keyed ``(order, seq)``.
* ``_ready`` is a heap of tuples, keyed by (a lower bound of) their best ticket's key.
  A tuple is pushed when it may have become runnable; a popped entry is re-checked
  (lazy deletion), so closing a gate or hitting a cap costs nothing up front.
* ``_bypass`` is a heap of reacquiring tickets, which ignore gates and caps.
* Removing a ticket (cancel) only marks it: its heap entry dies in place and is dropped
  when it reaches the top. Dead entries are counted, and a heap that is more than half
  dead is rebuilt, so memory stays proportional to the live waiters and the rebuild is
  amortised O(1) per removal.

A grant pops at most a few entries per removed ticket, so every operation costs
O(log n) amortised in the number of waiters; ``close_tuple`` touches only the tuple's
``reject_on_closed_tuple`` waiters, the ones it must fail.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Final, Protocol, final

from ._errors import TupleSuspendedError
from ._types import ModelTuple

__all__ = [
    "DONE",
    "GRANTED",
    "INACTIVE",
    "LENT",
    "QUEUED",
    "SUSPENDED_MESSAGE",
    "Scheduler",
    "Ticket",
    "TupleState",
    "Wakeable",
]

SUSPENDED_MESSAGE: Final = (
    "Provider/model is suspended by a provider limit; foreground work cannot wait for recovery"
)

# Ticket states. INACTIVE and QUEUED are "queued" (counted in queued_count); GRANTED is a
# held slot (counted in active_count); LENT is a permit that gave its slot back while its
# holder waits; DONE is terminal (released, cancelled or failed).
INACTIVE: Final = 0
QUEUED: Final = 1
GRANTED: Final = 2
LENT: Final = 3
DONE: Final = 4

# A heap is rebuilt once it holds more than this many dead entries and they are the
# majority; below that, dead entries are cheaper to pop as they surface.
_COMPACT_MIN: Final = 64

# How many idle tuples stay cached for reuse (see ``Scheduler._forget_if_idle``).
_IDLE_KEPT: Final = 64


class Wakeable(Protocol):
    """What the scheduler needs of a parked task (``_waiter.Parker`` fits)."""

    def grant(self, value: bool) -> None: ...

    def fail(self, error: BaseException) -> None: ...


@final
class Ticket:
    """A place in line; once granted, the slot a permit holds (and lends, and reacquires).

    Attributes:
        order: acceptance order of the current place in line.
        seq: arrival number of the current place in line (unique per scheduler).
        state: INACTIVE, QUEUED, GRANTED, LENT or DONE.
        tuple_state: the tuple's bookkeeping (refreshed on every reacquire).
        reject: fail when the tuple's gate closes while queued.
        bypass: the current place in line is a reacquire (ignores gates and caps).
        parker: the task waiting for this ticket, if one is parked.
        error: why the ticket failed, when nobody was parked to receive it.
    """

    __slots__ = ("bypass", "error", "order", "parker", "reject", "seq", "state", "tuple_state")

    def __init__(self, order: int, seq: int, tuple_state: TupleState, reject: bool) -> None:
        self.order = order
        self.seq = seq
        self.state = INACTIVE
        self.tuple_state = tuple_state
        self.reject = reject
        self.bypass = False
        self.parker: Wakeable | None = None
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        state = ("inactive", "queued", "granted", "lent", "done")[self.state]
        return f"<Ticket {self.tuple_state.tuple} order={self.order} seq={self.seq} {state}>"


# (order, seq, ticket) in a tuple's heap or the bypass heap; (order, seq, tuple_state) in
# the ready heap. seq is unique, so comparison never reaches the third item.
_Entry = tuple[int, int, Ticket]
_ReadyEntry = tuple[int, int, "TupleState"]


@final
class TupleState:
    """The bookkeeping of one model tuple.

    Invariants (checked by :meth:`Scheduler.check_invariants`):
        * ``active`` counts this tuple's GRANTED tickets; ``queued`` its INACTIVE and
          QUEUED ones (reacquires included).
        * ``heap`` holds every QUEUED non-bypass ticket of the tuple once, plus ``dead``
          entries whose ticket left the queue without being popped.
        * ``foreground`` holds exactly the queued tickets with ``reject`` set.
        * If the tuple is runnable and has a live heap entry, ``entry`` is in the ready
          heap and its key is at most the key of the tuple's best live ticket.
    """

    __slots__ = (
        "active",
        "dead",
        "entry",
        "foreground",
        "heap",
        "limit",
        "open",
        "queued",
        "reopens_at",
        "tuple",
    )

    def __init__(self, model_tuple: ModelTuple) -> None:
        self.tuple = model_tuple
        self.heap: list[_Entry] = []
        self.dead = 0
        self.active = 0
        self.queued = 0
        self.limit: int | None = None
        self.open = True
        self.reopens_at: float | None = None
        self.entry: _ReadyEntry | None = None
        self.foreground: dict[Ticket, None] | None = None  # created on first use

    @property
    def runnable(self) -> bool:
        """Open and below its cap: its eligible tickets may be granted now."""
        return self.open and (self.limit is None or self.active < self.limit)

    def head(self) -> Ticket | None:
        """The best live ticket of the heap, dropping dead entries from the top."""
        heap = self.heap
        while heap:
            _order, seq, ticket = heap[0]
            if ticket.state == QUEUED and ticket.seq == seq:
                return ticket
            heapq.heappop(heap)
            self.dead -= 1
        return None

    @property
    def idle(self) -> bool:
        """Nothing worth remembering: no work, open, uncapped."""
        return not self.queued and not self.active and self.open and self.limit is None


def _live(entry: _Entry) -> bool:
    ticket = entry[2]
    return ticket.state == QUEUED and ticket.seq == entry[1]


@final
class Scheduler:
    """Who gets the next slot. Synchronous; every call leaves the invariants true.

    Invariants (``check_invariants`` verifies them; the tests call it after every step):
        * ``active`` = GRANTED tickets, ``queued`` = INACTIVE + QUEUED tickets, ``lent`` =
          LENT tickets plus QUEUED reacquires; each equals the sum over tuples where a
          tuple count exists.
        * Work-conserving: after every call, if ``active < limit`` then no queued ticket
          may run now (no live bypass entry, no runnable tuple with a live head).
        * Every idle tuple in ``_tuples`` is also in ``_idle``, which holds at most
          ``_IDLE_KEPT`` entries, so memory follows the tuples in use.
        * ``_counter`` is at least every acceptance order seen.
    """

    __slots__ = (
        "_bypass",
        "_bypass_dead",
        "_counter",
        "_idle",
        "_ready",
        "_seq",
        "_tuples",
        "active",
        "lent",
        "limit",
        "queued",
    )

    def __init__(self, limit: int, tuple_limits: dict[ModelTuple, int] | None = None) -> None:
        self.limit = limit
        self.active = 0
        self.queued = 0
        self.lent = 0
        self._counter = 0
        self._seq = 0
        self._tuples: dict[ModelTuple, TupleState] = {}
        self._idle: dict[ModelTuple, TupleState] = {}  # recently idle, oldest first
        self._ready: list[_ReadyEntry] = []
        self._bypass: list[_Entry] = []
        self._bypass_dead = 0
        for model_tuple, tuple_limit in (tuple_limits or {}).items():
            self._state(model_tuple).limit = tuple_limit

    # -- acceptance orders --------------------------------------------------------------

    def next_order(self) -> int:
        """A fresh acceptance order, larger than every order seen so far."""
        self._counter += 1
        return self._counter

    # -- tuples ---------------------------------------------------------------------------

    def tuple_state(self, model_tuple: ModelTuple) -> TupleState | None:
        """The tuple's bookkeeping, or None when it is idle (open, uncapped, unused)."""
        state = self._tuples.get(model_tuple)
        return None if state is None or state.idle else state

    def tuple_states(self) -> Iterator[TupleState]:
        """Every non-idle tuple, in no particular order."""
        return (state for state in self._tuples.values() if not state.idle)

    def is_open(self, model_tuple: ModelTuple) -> bool:
        state = self._tuples.get(model_tuple)
        return state is None or state.open

    def _state(self, model_tuple: ModelTuple) -> TupleState:
        state = self._tuples.get(model_tuple)
        if state is None:
            state = self._tuples[model_tuple] = TupleState(model_tuple)
        return state

    def _forget_if_idle(self, state: TupleState) -> None:
        """Let an idle tuple go, keeping the most recent few for reuse.

        A tuple that goes idle is usually used again at once (acquire, release, acquire…),
        so the last ``_IDLE_KEPT`` idle states stay in ``_tuples``; older ones are dropped,
        so memory follows the tuples in use. O(1).
        """
        if not state.idle:
            return
        idle = self._idle
        idle[state.tuple] = state
        if len(idle) > _IDLE_KEPT:
            model_tuple = next(iter(idle))
            oldest = idle.pop(model_tuple)
            if oldest.idle and self._tuples.get(model_tuple) is oldest:
                del self._tuples[model_tuple]
                oldest.entry = None  # any ready entry of it is now stale

    # -- enqueue, activate, withdraw -------------------------------------------------------

    def enqueue(
        self, model_tuple: ModelTuple, order: int | None, active: bool, reject: bool
    ) -> Ticket:
        """Take a place in line; with ``active`` it is eligible (and may be granted at once).

        Arguments must already be valid. ``order`` None draws a fresh acceptance order
        (only once the request is admitted); an explicit one raises the counter.

        Raises:
            TupleSuspendedError: ``reject`` is set and the tuple's gate is closed (nothing
                changed, no order drawn).
        """
        state = self._tuples.get(model_tuple)
        if state is None:
            state = self._tuples[model_tuple] = TupleState(model_tuple)
        elif reject and not state.open:
            raise TupleSuspendedError(SUSPENDED_MESSAGE)
        if order is None:
            self._counter += 1
            order = self._counter
        elif order > self._counter:
            self._counter = order
        self._seq += 1
        ticket = Ticket(order, self._seq, state, reject)
        self.queued += 1
        state.queued += 1
        if reject:
            if state.foreground is None:
                state.foreground = {}
            state.foreground[ticket] = None
        if active:
            if (
                self.active < self.limit
                and not self._ready
                and not self._bypass
                and state.open
                and (state.limit is None or state.active < state.limit)
            ):
                # Fast path: with both heaps empty nobody else may run (invariant), so
                # this ticket is the best one and never needs a heap entry.
                ticket.state = QUEUED
                self._grant(ticket)
            else:
                self._make_eligible(ticket)
        return ticket

    def activate(self, ticket: Ticket) -> None:
        """Make an inactive ticket eligible (granting it at once if it may run). Else no-op."""
        if ticket.state == INACTIVE:
            self._make_eligible(ticket)

    def _make_eligible(self, ticket: Ticket) -> None:
        ticket.state = QUEUED
        state = ticket.tuple_state
        entry = (ticket.order, ticket.seq, ticket)
        heapq.heappush(state.heap, entry)
        if self.active >= self.limit:
            # No capacity: nothing can be granted; only the ready entry may need a better
            # key (the common case, a ticket behind the head, needs nothing at all).
            current = state.entry
            if current is None or entry < current:  # type: ignore[operator]
                self._offer(state)
            return
        if state.runnable and not self._bypass and not self._ready:
            # Fast path: nobody else could run, so this ticket is the best one.
            self._grant_from(state)
            return
        self._offer(state)
        self._drain()

    def reacquire(self, ticket: Ticket, order: int) -> None:
        """Queue a LENT ticket to take a slot back, bypassing gates and caps."""
        assert ticket.state == LENT
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
        self.queued += 1
        state.queued += 1
        heapq.heappush(self._bypass, (order, ticket.seq, ticket))
        self._drain()

    def withdraw(self, ticket: Ticket) -> None:
        """Take a queued reacquire out of line again; the ticket goes back to LENT.

        The caller owns ``ticket.parker`` (it is detached here, not woken).
        """
        assert ticket.state == QUEUED
        assert ticket.bypass
        self._unqueue(ticket)
        ticket.state = LENT
        ticket.bypass = False
        ticket.parker = None
        self._forget_if_idle(ticket.tuple_state)

    # -- leaving ---------------------------------------------------------------------------

    def fail(self, ticket: Ticket, error: BaseException) -> None:
        """Remove a queued ticket and make its waiter raise ``error`` (stored if none waits).

        A failed reacquire also ends the lend (``lent`` drops). No grant can follow from
        this: removing a waiter frees no capacity.
        """
        parker = self.discard(ticket)
        if parker is not None:
            parker.fail(error)
        else:
            ticket.error = error

    def discard(self, ticket: Ticket) -> Wakeable | None:
        """Remove a queued ticket without waking anyone (its waiter was cancelled).

        Returns:
            The parker that was attached, now detached (for :meth:`fail` to wake).
        """
        assert ticket.state in (INACTIVE, QUEUED)
        self._unqueue(ticket)
        if ticket.bypass:
            self.lent -= 1
            ticket.bypass = False
        ticket.state = DONE
        parker, ticket.parker = ticket.parker, None
        self._forget_if_idle(ticket.tuple_state)
        return parker

    def release(self, ticket: Ticket) -> None:
        """End a GRANTED or LENT ticket. A granted slot goes to the next waiter at once."""
        if ticket.state == GRANTED:
            ticket.state = DONE
            self._return_slot(ticket.tuple_state)
        else:
            assert ticket.state == LENT
            ticket.state = DONE
            self.lent -= 1

    def lend(self, ticket: Ticket) -> None:
        """Give a GRANTED ticket's slot back while its holder waits (the ticket is LENT)."""
        assert ticket.state == GRANTED
        ticket.state = LENT
        self.lent += 1
        self._return_slot(ticket.tuple_state)

    def _return_slot(self, state: TupleState) -> None:
        self.active -= 1
        state.active -= 1
        if self.queued:  # else nobody could take the slot
            if state.limit is not None and state.active == state.limit - 1:
                self._offer(state)  # it just dropped below its cap
            self._drain()
        if not state.active and not state.queued:
            self._forget_if_idle(state)

    def _unqueue(self, ticket: Ticket) -> None:
        state = ticket.tuple_state
        self.queued -= 1
        state.queued -= 1
        if ticket.reject and state.foreground is not None:
            state.foreground.pop(ticket, None)
        if ticket.state != QUEUED:
            return  # inactive: in no heap
        if ticket.bypass:
            self._bypass_dead += 1
            if self._bypass_dead > _COMPACT_MIN and 2 * self._bypass_dead > len(self._bypass):
                ticket.state = DONE  # so the rebuild drops it
                self._bypass = [e for e in self._bypass if _live(e)]
                heapq.heapify(self._bypass)
                self._bypass_dead = 0
        else:
            state.dead += 1
            if state.dead > _COMPACT_MIN and 2 * state.dead > len(state.heap):
                ticket.state = DONE
                state.heap = [e for e in state.heap if _live(e)]
                heapq.heapify(state.heap)
                state.dead = 0

    # -- limits and gates --------------------------------------------------------------------

    def set_limit(self, limit: int) -> None:
        """Change the global cap. Growing grants at once, in order; shrinking revokes nothing."""
        self.limit = limit
        self._drain()

    def set_tuple_limit(self, model_tuple: ModelTuple, limit: int | None) -> None:
        """Cap (or, with None, uncap) a tuple. A raised cap grants at once."""
        state = self._state(model_tuple)
        state.limit = limit
        self._offer(state)
        self._drain()
        self._forget_if_idle(state)

    def close(self, model_tuple: ModelTuple, reopens_at: float | None) -> None:
        """Close the tuple's gate and fail its ``reject`` waiters. Grants nothing.

        A closure is never shortened: closing a closed tuple keeps the later of the two
        reopen times, and a closure without a reopen time (None) lasts until :meth:`open`.
        """
        state = self._state(model_tuple)
        if state.open:
            state.open = False
            state.reopens_at = reopens_at
        elif reopens_at is None:
            state.reopens_at = None
        elif state.reopens_at is not None and reopens_at > state.reopens_at:
            state.reopens_at = reopens_at
        foreground = state.foreground
        if foreground:
            state.foreground = None
            for ticket in sorted(foreground, key=_key):
                self.fail(ticket, TupleSuspendedError(SUSPENDED_MESSAGE))

    def retime(self, model_tuple: ModelTuple, reopens_at: float) -> None:
        """Restate a timed closure's reopen time on another clock (same instant, new
        numbers: the coordinator moved to another event loop). Unlike :meth:`close`, this
        may move the time either way; the tuple must be closed with a reopen time."""
        state = self._tuples[model_tuple]
        assert not state.open
        assert state.reopens_at is not None
        state.reopens_at = reopens_at

    def open(self, model_tuple: ModelTuple) -> None:
        """Open the tuple's gate (fine when open); its waiters may be granted at once."""
        state = self._tuples.get(model_tuple)
        if state is None or state.open:
            return
        state.open = True
        state.reopens_at = None
        self._offer(state)
        self._drain()
        self._forget_if_idle(state)

    # -- granting ------------------------------------------------------------------------------

    def _offer(self, state: TupleState) -> None:
        """Make sure a runnable tuple with eligible waiters is represented in ``_ready``."""
        if not state.runnable:
            return
        head = state.head()
        if head is None:
            return
        entry = state.entry
        if (
            entry is None
            or head.order < entry[0]
            or (head.order == entry[0] and head.seq < entry[1])
        ):
            entry = state.entry = (head.order, head.seq, state)
            heapq.heappush(self._ready, entry)
            if len(self._ready) > 2 * len(self._tuples) + _COMPACT_MIN:
                self._ready = [e for e in self._ready if e is e[2].entry]
                heapq.heapify(self._ready)

    def _drain(self) -> None:
        """Grant slots while there is capacity and someone may run (the only grant loop)."""
        ready = self._ready
        bypass = self._bypass
        while self.active < self.limit:
            while bypass and not _live(bypass[0]):
                heapq.heappop(bypass)
                self._bypass_dead -= 1
            # Settle the top of the ready heap on a tuple that may run, with its true key.
            while ready:
                entry = ready[0]
                state = entry[2]
                if entry is not state.entry:
                    heapq.heappop(ready)  # superseded by a better entry, or forgotten
                    continue
                head = state.head() if state.runnable else None
                if head is None:
                    state.entry = None
                    heapq.heappop(ready)
                    continue
                if head.seq != entry[1]:
                    state.entry = (head.order, head.seq, state)
                    heapq.heapreplace(ready, state.entry)
                    continue
                break
            if bypass and (not ready or _before(bypass[0], ready[0])):
                self._grant(heapq.heappop(bypass)[2])
            elif ready:
                self._grant_from(ready[0][2], cleaned=True)
            else:
                return

    def _grant_from(self, state: TupleState, cleaned: bool = False) -> None:
        """Grant the best ticket of ``state``'s heap and re-key the tuple in ``_ready``.

        ``cleaned``: the caller just checked that the heap's top entry is live.
        """
        if not cleaned:
            state.head()  # drop dead entries from the top
        ticket = heapq.heappop(state.heap)[2]
        self._grant(ticket)
        limit = state.limit
        head = state.head() if state.open and (limit is None or state.active < limit) else None
        entry = state.entry
        if head is None:
            if entry is not None and self._ready and self._ready[0] is entry:
                heapq.heappop(self._ready)
                state.entry = None
            return
        new = (head.order, head.seq, state)
        if entry is not None and self._ready and self._ready[0] is entry:
            state.entry = new
            heapq.heapreplace(self._ready, new)
        elif (
            entry is None
            or head.order < entry[0]
            or (head.order == entry[0] and head.seq < entry[1])
        ):
            state.entry = new
            heapq.heappush(self._ready, new)

    def _grant(self, ticket: Ticket) -> None:
        state = ticket.tuple_state
        ticket.state = GRANTED
        self.queued -= 1
        state.queued -= 1
        self.active += 1
        state.active += 1
        if ticket.reject and state.foreground is not None:
            state.foreground.pop(ticket, None)
        if ticket.bypass:
            ticket.bypass = False
            self.lent -= 1
        parker = ticket.parker
        if parker is not None:
            ticket.parker = None
            parker.grant(True)

    # -- checking -------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert every invariant above (O(n); for tests)."""
        assert self._counter >= 0
        for model_tuple, state in self._tuples.items():
            assert state.tuple == model_tuple
            assert not state.idle or model_tuple in self._idle, f"idle tuple kept: {model_tuple}"
            assert state.active >= 0
            assert state.queued >= 0
            live = [e for e in state.heap if _live(e)]
            assert len(state.heap) - len(live) == state.dead
            assert all(not e[2].bypass and e[2].tuple_state is state for e in live)
            assert len({id(e[2]) for e in live}) == len(live)
            for i in range(1, len(state.heap)):
                assert state.heap[(i - 1) // 2][:2] <= state.heap[i][:2]
            for ticket in state.foreground or ():
                assert ticket.reject
                assert ticket.state in (INACTIVE, QUEUED)
            if state.runnable and live:
                best = min(e[:2] for e in live)
                assert state.entry is not None
                assert state.entry[:2] <= best
                assert any(e is state.entry for e in self._ready)
        assert len(self._idle) <= _IDLE_KEPT
        bypass_live = [e for e in self._bypass if _live(e)]
        assert len(self._bypass) - len(bypass_live) == self._bypass_dead
        assert all(e[2].bypass for e in bypass_live)
        assert self.active == sum(s.active for s in self._tuples.values())
        assert self.queued == sum(s.queued for s in self._tuples.values())
        assert self.lent >= len(bypass_live)
        if self.active < self.limit:
            assert not bypass_live, "a reacquire could run but waits"
            for state in self._tuples.values():
                assert not (state.runnable and state.head() is not None), (
                    f"{state.tuple} could run but waits"
                )


def _before(a: _Entry, b: _ReadyEntry) -> bool:
    """Whether entry ``a`` sorts before entry ``b`` (keys only; they are never equal)."""
    return a[0] < b[0] or (a[0] == b[0] and a[1] < b[1])


def _key(ticket: Ticket) -> tuple[int, int]:
    return (ticket.order, ticket.seq)

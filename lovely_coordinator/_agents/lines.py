"""The line the scheduler's tickets wait in: :class:`Line`, best ``(order, seq)`` first.

A plain synchronous container with no decisions in it (those are ``scheduler.py``'s). A
line holds the queued tickets of one tuple and one kind, and keeps on each ticket where
its live occurrence is, so a ticket leaves in O(1) and is forgotten lazily (see the
class).

Line is generic: over what it holds, anything :class:`Queued` (the four attributes it
reads and writes on a ticket), and over its owner, anything with a ``tuple`` (read for the
repr only). It imports nothing of the scheduler's, because tickets, lines and tuple
states refer to one another: a ticket knows its line and its tuple, a tuple holds its
three lines. Tickets and tuple states live together in ``tickets.py``, which builds lines
and so imports this module; were Line to name them back, even in annotations only, each
module would import the other. Generic, it names neither, and the imports stay a tree.
``tickets.TicketLine`` is the line the scheduler uses (``Line[TupleState, Ticket]``).
The type parameters are for the type checker only: ``Generic`` adds no field and no call
per line, and nothing checks them at runtime.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Final, Generic, Protocol, TypeVar, final

__all__ = [
    "COMPACT_MIN",
    "COVERED",
    "LEFT",
    "PERMITS",
    "REQUESTS",
    "Line",
    "Owner",
    "Queued",
]

# Line kinds.
PERMITS: Final = 0  # permits and reservations: a slot, the gate, the tuple cap
REQUESTS: Final = 1  # model requests wanting a slot of their own: the same, plus the budget
COVERED: Final = 2  # model requests on a permit's lent slot: a slot, the gate, calls, budget

# A ticket's ``entry`` once it left a line (see Line.push).
LEFT: Final = object()

# A line is rebuilt once it holds more than this many dead entries and they are the
# majority; below that, dead entries are cheaper to pop as they surface.
COMPACT_MIN: Final = 64


class Queued(Protocol):
    """What a line reads and writes on the tickets it holds (see :class:`Line`).

    Attributes:
        order, seq: the ticket's place in line, ``(acceptance order, arrival)``; seq is
            unique among the tickets a line ever holds.
        line: the line holding the ticket's live occurrence, while queued in one.
        entry: that live occurrence (see the line's invariants), :data:`LEFT` once the
            ticket left a line, None before it ever was in one.
    """

    order: int
    seq: int
    # Any: an attribute a protocol lets write must match exactly, and a ticket's own
    # ``line`` is its concrete line type; a line only stores itself there and compares.
    line: Line[Any, Any] | None
    entry: object


class Owner(Protocol):
    """What a line reads of its owner (a tuple's state): its ``tuple``, for the repr."""

    @property
    def tuple(self) -> object: ...


S = TypeVar("S", bound=Owner)
Q = TypeVar("Q", bound=Queued)


@final
class Line(Generic[S, Q]):
    """The queued tickets of one tuple and one kind, best ``(order, seq)`` first.

    Tickets usually arrive in increasing key order (fresh acceptance orders only grow),
    so a line starts as a FIFO: a deque *of the tickets themselves*, appended to and
    popped from at O(1), with no entry object per waiter (a parked waiter's objects are
    the coordinator's memory and its collector's work). The first push that would break
    the order (an explicit, earlier acceptance order; a ticket coming back to a line, whose
    dead occurrence may still be in it) turns it into a heap of ``(order, seq, ticket)``
    entries, which it stays until it is empty again. Both keep the best at index 0.

    Invariants:
        * Every ticket whose ``line`` is this line has exactly one live occurrence here,
          its ``entry``: the ticket itself in a FIFO, its entry tuple in a heap. An
          occurrence is live exactly when it is its ticket's ``entry`` (and, bare, the
          ticket's ``line`` is this one); a ticket that left a line has ``entry``
          :data:`LEFT` until it is queued again.
        * ``dead`` counts the occurrences that are not live.
        * With ``fifo``, ``items`` is a deque of tickets whose live ones are sorted by key,
          each at most ``last`` (the key of the last push); otherwise a heap of entries.
        * ``entry`` is this line's entry in the scheduler's ready heap, or None.
    """

    __slots__ = ("dead", "entry", "fifo", "items", "kind", "last", "state")

    def __init__(self, state: S, kind: int) -> None:
        self.state = state
        self.kind = kind
        # A deque of tickets (fifo) or a heap list of entries: typed loosely, the two
        # representations are the invariant's business (see above).
        self.items: Any = deque()
        self.fifo = True
        self.last = (0, 0)
        self.dead = 0
        self.entry: tuple[int, int, Line[S, Q]] | None = None

    def __lt__(self, other: Line[S, Q]) -> bool:
        # Only the scheduler's ready heap compares lines, and only when two entries tie on
        # ``(order, seq)``: one ticket was the head of two lines of its tuple (a request
        # moved to the covered line, a lend coming back), and the line it left still holds
        # its old entry until that entry reaches the top and is re-keyed or dropped. Any
        # fixed order will do there; a heap must never fail to compare.
        return self.kind < other.kind

    def __repr__(self) -> str:
        kind = ("permits", "requests", "covered")[self.kind]
        return f"<Line {self.state.tuple} {kind} {len(self.items) - self.dead} live>"

    def live(self, item: Q | tuple[int, int, Q]) -> bool:
        """Whether ``item`` of ``items`` is its ticket's live occurrence."""
        if isinstance(item, tuple):
            return item[2].entry is item
        return item.entry is item and item.line is self

    def push(self, ticket: Q) -> None:
        ticket.line = self
        items = self.items
        if self.fifo:
            key = (ticket.order, ticket.seq)
            # Only a ticket that never left a line may be stored bare: one that did may
            # still have a dead occurrence here, which a bare push would revive.
            if not items or (ticket.entry is None and key > self.last):
                items.append(ticket)
                ticket.entry = ticket
                self.last = key
                return
            items = self._to_heap()
        entry = ticket.entry = (ticket.order, ticket.seq, ticket)
        heapq.heappush(items, entry)

    def _to_heap(self) -> list[tuple[int, int, Q]]:
        # Out of order: a heap from now on, of the live tickets only.
        live: list[tuple[int, int, Q]] = []
        for ticket in self.items:
            if ticket.entry is ticket and ticket.line is self:
                entry = ticket.entry = (ticket.order, ticket.seq, ticket)
                live.append(entry)
        heapq.heapify(live)
        self.items = live
        self.fifo = False
        self.dead = 0
        return live

    def head(self) -> Q | None:
        """The best live ticket, dropping dead occurrences from the front."""
        items = self.items
        if self.fifo:
            while items:
                ticket: Q = items[0]
                if ticket.entry is ticket and ticket.line is self:
                    return ticket
                items.popleft()
                self.dead -= 1
            return None
        while items:
            entry = items[0]
            ticket = entry[2]
            if ticket.entry is entry:
                return ticket
            heapq.heappop(items)
            self.dead -= 1
        self.items = deque()  # empty: back to the cheap mode
        self.fifo = True
        return None

    def first(self) -> Q:
        """The ticket at the front (the caller just saw :meth:`head` return it)."""
        item = self.items[0]
        ticket: Q = item if self.fifo else item[2]
        return ticket

    def pop(self) -> Q:
        """Remove and return the head (the caller just saw :meth:`head` return it)."""
        items = self.items
        if self.fifo:
            ticket: Q = items.popleft()
        else:
            ticket = heapq.heappop(items)[2]
        ticket.line = ticket.entry = None
        return ticket

    def remove(self, ticket: Q) -> None:
        """Take ``ticket`` out of the line (its occurrence dies in place)."""
        ticket.line = None
        ticket.entry = LEFT
        self.dead += 1
        if self.dead > COMPACT_MIN and 2 * self.dead > len(self.items):
            live = self.live
            if self.fifo:
                self.items = deque(t for t in self.items if live(t))  # keeps the order
            else:
                kept = [e for e in self.items if live(e)]
                heapq.heapify(kept)
                self.items = kept
            self.dead = 0

    def entries(self) -> list[tuple[int, int, Q]]:
        """The live occurrences as ``(order, seq, ticket)``, in storage order (a FIFO's is
        sorted, a heap's is not). O(n); a pure read, for snapshots and checks."""
        if self.fifo:
            return [(t.order, t.seq, t) for t in self.items if t.entry is t and t.line is self]
        return [e for e in self.items if e[2].entry is e]

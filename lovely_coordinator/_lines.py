"""The scheduler's data: tickets, the lines they wait in, and each tuple's bookkeeping.

Plain synchronous structures with no decisions in them (those are ``_scheduler.py``'s).

* A :class:`Ticket` is one place in line and, once granted, the slot a permit holds or
  the call a model request makes.
* A :class:`Line` is a heap of the queued tickets of one tuple and one kind, keyed by
  ``(acceptance order, arrival)``, with lazy deletion: a ticket that leaves the line
  only forgets its entry (``ticket.entry = None``); the entry dies in place and is dropped
  when it reaches the top. Liveness is the identity of the entry, so a ticket that leaves
  a line and comes back never revives its old entry. Dead entries are counted, and a
  line that is mostly dead is rebuilt, so memory follows the live waiters and removal is
  O(1) amortised.
* A :class:`TupleState` holds a tuple's three lines — permits, requests waiting for a
  slot of their own, requests covered by a permit — its counts, gate, cap and budget.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Final, Protocol, final

from ._types import ModelTuple

if TYPE_CHECKING:
    from ._bucket import Bucket

__all__ = [
    "COVERED",
    "DONE",
    "GRANTED",
    "INACTIVE",
    "LENT",
    "PERMITS",
    "QUEUED",
    "REQUESTS",
    "Line",
    "Ticket",
    "TupleState",
    "Wakeable",
]

# Ticket states. INACTIVE and QUEUED are "queued" (counted in queued); GRANTED holds a
# slot (or, for a covered request, is in flight on its cover's slot); LENT is a permit
# that gave its slot back while its holder waits; DONE is terminal.
INACTIVE: Final = 0
QUEUED: Final = 1
GRANTED: Final = 2
LENT: Final = 3
DONE: Final = 4

STATE_NAMES: Final = ("inactive", "queued", "granted", "lent", "done")

# Line kinds.
PERMITS: Final = 0  # permits and reservations: a slot, the gate, the tuple cap
REQUESTS: Final = 1  # model requests wanting a slot of their own: the same, plus the budget
COVERED: Final = 2  # model requests on a permit's slot: the gate, the budget, a foreign cap

# A line is rebuilt once it holds more than this many dead entries and they are the
# majority; below that, dead entries are cheaper to pop as they surface.
COMPACT_MIN: Final = 64


class Wakeable(Protocol):
    """What the scheduler needs of a parked task (``_waiter.Parker`` fits)."""

    def grant(self, value: bool) -> None: ...

    def fail(self, error: BaseException) -> None: ...


@final
class Ticket:
    """A place in line; once granted, a slot (a permit) or a call in flight (a request).

    Attributes:
        order, seq: the current place in line, ``(acceptance order, arrival)``; seq is
            unique per scheduler.
        origin: the acceptance order the ticket was first granted with.
        state: INACTIVE, QUEUED, GRANTED, LENT or DONE.
        tuple_state: the tuple's bookkeeping (refreshed on every reacquire).
        reject: fail when the tuple's gate closes while queued.
        request: a model request (else a permit or reservation).
        line: the line holding the ticket's live entry, while queued in one.
        entry: that live entry (the very tuple in the line's heap).
        bypass: the place in line is a lending permit's reacquire (ignores gates, caps).
        parker: the task waiting for this ticket, if one is parked.
        error: why the ticket failed, when nobody was parked to receive it.
        lends: a permit's lends in progress; the last one to end reacquires.
        tokens: a request's token charge (its estimate, then what it settled).
        cover: a request's permit, whose slot it may use.
        covered: a request is (queued or in flight) on its cover's slot.
        covering: a permit's request on its slot (reserved or in flight), if any.
        candidates: a permit's heap of requests waiting for its slot to be free.
        deferred: a lent or released permit whose slot stays taken until the request in
            flight on it ends.
    """

    __slots__ = (
        "bypass",
        "candidates",
        "cover",
        "covered",
        "covering",
        "deferred",
        "entry",
        "error",
        "lends",
        "line",
        "order",
        "origin",
        "parker",
        "reject",
        "request",
        "seq",
        "state",
        "tokens",
        "tuple_state",
    )

    def __init__(
        self, order: int, seq: int, tuple_state: TupleState, reject: bool, request: bool = False
    ) -> None:
        self.order = order
        self.origin = order
        self.seq = seq
        self.state = INACTIVE
        self.tuple_state = tuple_state
        self.reject = reject
        self.request = request
        self.line: Line | None = None
        self.entry: Entry | None = None
        self.bypass = False
        self.parker: Wakeable | None = None
        self.error: BaseException | None = None
        self.lends = 0
        self.tokens = 0
        self.cover: Ticket | None = None
        self.covered = False
        self.covering: Ticket | None = None
        self.candidates: list[Entry] | None = None
        self.deferred = False

    def __repr__(self) -> str:
        kind = "request" if self.request else "permit"
        state = STATE_NAMES[self.state]
        return f"<Ticket {kind} {self.tuple_state.tuple} order={self.order} seq={self.seq} {state}>"

    @property
    def key(self) -> tuple[int, int]:
        return (self.order, self.seq)


# (order, seq, ticket) in a line or the bypass heap; (order, seq, line) in the ready heap.
# seq is unique, so comparison never reaches the third item.
Entry = tuple[int, int, Ticket]
ReadyEntry = tuple[int, int, "Line"]


@final
class Line:
    """The queued tickets of one tuple and one kind, best ``(order, seq)`` first.

    Invariants:
        * Every ticket whose ``line`` is this line has exactly one live entry here, its
          ``entry``; an entry is live exactly when it is its ticket's ``entry``.
        * ``dead`` counts the entries that are not live.
        * ``entry`` is this line's entry in the scheduler's ready heap, or None.
    """

    __slots__ = ("dead", "entry", "heap", "kind", "state")

    def __init__(self, state: TupleState, kind: int) -> None:
        self.state = state
        self.kind = kind
        self.heap: list[Entry] = []
        self.dead = 0
        self.entry: ReadyEntry | None = None

    def __repr__(self) -> str:
        kind = ("permits", "requests", "covered")[self.kind]
        return f"<Line {self.state.tuple} {kind} {len(self.heap) - self.dead} live>"

    @staticmethod
    def live(entry: Entry) -> bool:
        return entry[2].entry is entry

    def push(self, ticket: Ticket) -> None:
        ticket.line = self
        entry = ticket.entry = (ticket.order, ticket.seq, ticket)
        heapq.heappush(self.heap, entry)

    def head(self) -> Ticket | None:
        """The best live ticket, dropping dead entries from the top."""
        heap = self.heap
        while heap:
            entry = heap[0]
            ticket = entry[2]
            if ticket.entry is entry:
                return ticket
            heapq.heappop(heap)
            self.dead -= 1
        return None

    def pop(self) -> Ticket:
        """Remove and return the head (the caller just saw :meth:`head` return it)."""
        ticket = heapq.heappop(self.heap)[2]
        ticket.line = ticket.entry = None
        return ticket

    def remove(self, ticket: Ticket) -> None:
        """Take ``ticket`` out of the line (its entry dies in place)."""
        ticket.line = ticket.entry = None
        self.dead += 1
        if self.dead > COMPACT_MIN and 2 * self.dead > len(self.heap):
            self.heap = [e for e in self.heap if self.live(e)]
            heapq.heapify(self.heap)
            self.dead = 0

    def tickets(self) -> list[Ticket]:
        """The live tickets, best first (O(n log n); for snapshots and checks)."""
        return [e[2] for e in sorted(self.heap, key=_entry_key) if self.live(e)]


def _entry_key(entry: Entry) -> tuple[int, int]:
    return (entry[0], entry[1])


@final
class TupleState:
    """The bookkeeping of one model tuple.

    Invariants (checked by ``Scheduler.check_invariants``):
        * ``active`` counts the slots on this tuple: its GRANTED permits and GRANTED
          requests on a slot of their own, plus lent or released permits whose slot is
          deferred; ``borrowed`` counts the GRANTED requests on this tuple that are
          covered by a permit of another tuple (they count against this tuple's cap).
        * ``queued`` counts its INACTIVE and QUEUED tickets (reacquires included).
        * ``foreground`` holds exactly its queued tickets with ``reject`` set.
        * ``block``, when set, is the earliest request that the budget holds back (the
          *front*); no request of the tuple with a later key may draw until
          ``block_until``, when the budget holds the front.
    """

    __slots__ = (
        "active",
        "block",
        "block_until",
        "borrowed",
        "covered",
        "explicit",
        "foreground",
        "limit",
        "open",
        "permits",
        "queued",
        "reopens_at",
        "request_bucket",
        "requests",
        "token_bucket",
        "tuple",
    )

    def __init__(self, model_tuple: ModelTuple) -> None:
        self.tuple = model_tuple
        self.permits = Line(self, PERMITS)
        self.requests = Line(self, REQUESTS)
        self.covered = Line(self, COVERED)
        self.active = 0
        self.borrowed = 0
        self.queued = 0
        self.limit: int | None = None
        self.open = True
        self.reopens_at: float | None = None
        self.foreground: dict[Ticket, None] | None = None  # created on first use
        self.request_bucket: Bucket | None = None
        self.token_bucket: Bucket | None = None
        # Which dimensions set_budget set (bit 1: requests, bit 2: tokens); the others,
        # if any, were learned from the provider and may be relearned.
        self.explicit = 0
        self.block: Ticket | None = None
        self.block_until: float | None = None

    def __repr__(self) -> str:
        return f"<TupleState {self.tuple} active={self.active} queued={self.queued}>"

    @property
    def capped(self) -> bool:
        """At its cap: nothing more may be granted on it."""
        limit = self.limit
        return limit is not None and self.active + self.borrowed >= limit

    @property
    def admits(self) -> bool:
        """Open and below its cap: its eligible tickets may be granted now."""
        return self.open and (self.limit is None or self.active + self.borrowed < self.limit)

    @property
    def budgeted(self) -> bool:
        return self.request_bucket is not None or self.token_bucket is not None

    @property
    def idle(self) -> bool:
        """Nothing worth remembering: no work, open, uncapped, no budget."""
        return (
            not self.queued
            and not self.active
            and not self.borrowed
            and self.open
            and self.limit is None
            and self.request_bucket is None
            and self.token_bucket is None
        )

"""The scheduler's data: tickets, and each tuple's bookkeeping with its lines.

Plain synchronous structures with no decisions in them (those are ``scheduler.py``'s).
Tickets and tuple states refer to each other (a ticket knows its tuple, a tuple its
budget's front ticket and its foreground and inactive tickets), so they live in one
module. The line tickets wait in is ``lines.py``'s :class:`~.lines.Line`, which is
generic and names neither: a ticket knows its line and a tuple holds its lines, so were
Line to name them back, this module and that one would import each other (see there).
:data:`TicketLine` is that line as the scheduler uses it, of tickets, owned by a tuple.

* A :class:`Ticket` is one place in line and, once granted, the slot a permit holds or
  the call a model request makes. It is also the parker of the task waiting for it
  (``_base.waiter.Parker``), and the coordinator's context managers are tickets too: one
  object per call, which is most of what a parked waiter costs.
* A :class:`TupleState` holds a tuple's three lines (permits, requests waiting for a
  slot of their own, requests covered by a permit), its counts, gate, cap and budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Final, final

from .._base.types import ModelTuple
from .._base.waiter import PENDING, Parker, Wakeable
from .lines import COVERED, PERMITS, REQUESTS, Line

if TYPE_CHECKING:
    from .bucket import Bucket
    from .budgets import Budget

__all__ = [
    "DONE",
    "GRANTED",
    "INACTIVE",
    "LENT",
    "QUEUED",
    "STATE_NAMES",
    "Candidate",
    "Entry",
    "PermitTicket",
    "ReadyEntry",
    "RequestTicket",
    "Ticket",
    "TicketLine",
    "TupleState",
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


class Ticket(Parker[bool]):
    """A place in line; once granted, a slot (a permit) or a call in flight (a request).

    Two kinds, :class:`PermitTicket` and :class:`RequestTicket`; each stores only its own
    fields, and reads the other kind's as the class-level defaults below (parked waiters
    are the coordinator's memory: a slot less per waiter is worth a class).

    Attributes:
        order, seq: the current place in line, ``(acceptance order, arrival)``; seq is
            unique per scheduler.
        state: INACTIVE, QUEUED, GRANTED, LENT or DONE.
        tuple_state: the tuple's bookkeeping (refreshed on every reacquire).
        reject: fail when the tuple's gate closes while queued.
        request: a model request (else a permit or reservation).
        line: the line holding the ticket's live entry, while queued in one.
        entry: that live entry (the very tuple in the line's heap).
        bypass: the place in line is a lending permit's reacquire (ignores gates, caps).
        parker: the task waiting for this ticket, if one is parked.
        error: why the ticket failed, when nobody was parked to receive it.
        since: ``time.monotonic()`` when it started to wait, set only where it really
            queues (None for a ticket granted at once); for observation, never decisions.

    A permit's own: ``origin`` (the acceptance order it was first granted with),
    ``lends`` (lends in progress; the last one to end reacquires), ``covering`` (the
    request on its slot, reserved or in flight), ``candidates`` (a heap of requests
    waiting for its slot to be free), ``deferred`` (lent or released, its slot stays
    taken until the request in flight on it ends) and ``parked`` (held, but its slot is
    lent while the request it covers waits; rule L in ``scheduler.py``). A request's
    own: ``accepted`` (its acceptance order; ``order`` is its rank, see rule L),
    ``tokens`` (its charge: the estimate, then what it settled), ``cover`` (the permit
    whose slot it may use) and ``covered`` (it is, queued or in flight, on that slot).
    """

    __slots__ = (
        "bypass",
        "entry",
        "error",
        "line",
        "order",
        "parker",
        "reject",
        "seq",
        "since",
        "state",
        "tuple_state",
    )

    request: ClassVar[bool] = False
    # The other kind's fields, read-only here (each subclass has slots for its own).
    origin: int = 0
    lends: int = 0
    covering: RequestTicket | None = None
    candidates: list[Candidate] | None = None
    deferred: bool = False
    parked: bool = False
    accepted: int = 0
    tokens: int = 0
    cover: PermitTicket | None = None
    covered: bool = False

    order: int
    seq: int
    state: int
    tuple_state: TupleState
    reject: bool
    line: TicketLine | None
    entry: object  # its live occurrence in ``line`` (see lines.Line), LEFT, or None
    bypass: bool
    parker: Wakeable | None
    error: BaseException | None
    since: float | None

    def __init__(self, reject: bool) -> None:
        # Every field set here, not through super(): this runs for every acquire. The
        # place in line (order, seq, tuple_state) is the scheduler's to set.
        self._state = PENDING
        self._value = None
        self._error = None
        self._sleeper = None
        self._home = None
        self.order = self.seq = 0
        self.state = INACTIVE
        self.reject = reject
        self.line = None
        self.entry = None
        self.bypass = False
        self.parker = None
        self.error = None
        self.since = None

    def __repr__(self) -> str:
        kind = "request" if self.request else "permit"
        state = STATE_NAMES[self.state]
        where = getattr(self, "tuple_state", None)  # unset until it takes a place in line
        t = None if where is None else where.tuple
        return f"<Ticket {kind} {t} order={self.order} seq={self.seq} {state}>"

    @property
    def key(self) -> tuple[int, int]:
        return (self.order, self.seq)


class PermitTicket(Ticket):
    """A permit's or a reservation's ticket (see :class:`Ticket`).

    Not final: the coordinator's ``permit()`` context manager *is* its ticket (and its
    parker), one object per call.
    """

    __slots__ = ("candidates", "covering", "deferred", "lends", "origin", "parked")

    origin: int
    lends: int
    covering: RequestTicket | None
    candidates: list[Candidate] | None
    deferred: bool
    parked: bool

    def __init__(self, reject: bool) -> None:
        # Ticket.__init__'s fields, set here rather than through it: one call less on
        # every acquire (the hottest path there is). Keep the two lists in step.
        self._state = PENDING
        self._value = None
        self._error = None
        self._sleeper = None
        self._home = None
        self.order = self.seq = 0
        self.state = INACTIVE
        self.reject = reject
        self.line = None
        self.entry = None
        self.bypass = False
        self.parker = None
        self.error = None
        self.since = None
        self.origin = 0  # the scheduler's to set, with its place
        self.lends = 0
        self.covering = None
        self.candidates = None
        self.deferred = False
        self.parked = False


class RequestTicket(Ticket):
    """A model request's ticket (see :class:`Ticket`; its context manager is one too)."""

    __slots__ = ("accepted", "cover", "covered", "tokens")

    request: ClassVar[bool] = True
    accepted: int
    tokens: int
    cover: PermitTicket | None
    covered: bool

    def __init__(self, reject: bool, tokens: int) -> None:
        Ticket.__init__(self, reject)
        self.accepted = 0  # the scheduler's to set, with its place
        self.tokens = tokens
        self.cover = None
        self.covered = False


# The line tickets wait in, owned by a tuple's state (``Line`` is generic: see lines.py).
# For the type checker only: TupleState builds plain ``Line``s (a call through this alias
# would cost a call more and try to set ``__orig_class__`` on a slotted object).
TicketLine = Line["TupleState", Ticket]

# (order, seq, ticket) in a line's heap or the bypass heap: seq is unique to a ticket, so
# a tie is one ticket's dead and live occurrences, equal tuples that never compare tickets.
# (order, seq, line) in the ready heap: two lines may tie there (see Line.__lt__).
Entry = tuple[int, int, Ticket]
ReadyEntry = tuple[int, int, TicketLine]
Candidate = tuple[int, int, "RequestTicket"]  # in a permit's heap of candidates


@final
class TupleState:
    """The bookkeeping of one model tuple.

    Invariants (checked by ``Scheduler.check_invariants``):
        * ``active`` counts the slots on this tuple: its GRANTED permits that are not
          parked and GRANTED requests on a slot of their own, plus lent or released
          permits whose slot is deferred; ``calls`` counts its GRANTED requests, on
          slots of their own or on covers of any tuple (the calls in flight).
        * A cap bounds both: nothing but a reacquire is granted a slot on the tuple
          while ``active >= limit`` (a reacquire or a parked permit taking its slot
          back may exceed it), and no request of the
          tuple is granted while ``calls >= limit`` (nothing exceeds that).
        * ``queued`` counts its INACTIVE and QUEUED tickets (reacquires included).
        * ``foreground`` holds exactly its queued tickets with ``reject`` set.
        * ``inactive`` holds exactly its INACTIVE tickets (reservations not yet activated,
          which are in no line), oldest first; ``lent`` counts its LENT and parked
          permits and queued reacquires (so the tuple is never idle while a permit of
          it is lent).
        * ``block``, when set, is the earliest request that the budget holds back (the
          *front*); no request of the tuple with a later key may draw until
          ``block_until``, when the budget holds the front.
    """

    __slots__ = (
        "active",
        "block",
        "block_until",
        "budget",
        "calls",
        "covered",
        "foreground",
        "inactive",
        "lent",
        "limit",
        "open",
        "permits",
        "queued",
        "reopens_at",
        "requests",
        "tuple",
    )

    def __init__(self, model_tuple: ModelTuple) -> None:
        self.tuple = model_tuple
        self.permits: TicketLine = Line(self, PERMITS)
        self.requests: TicketLine = Line(self, REQUESTS)
        self.covered: TicketLine = Line(self, COVERED)
        self.active = 0
        self.calls = 0
        self.queued = 0
        self.limit: int | None = None
        self.open = True
        self.reopens_at: float | None = None
        self.foreground: dict[Ticket, None] | None = None  # created on first use
        self.inactive: dict[Ticket, None] | None = None  # created on first use
        self.lent = 0
        self.budget: Budget | None = None  # its request and token buckets, if any
        self.block: Ticket | None = None
        self.block_until: float | None = None

    def __repr__(self) -> str:
        return f"<TupleState {self.tuple} active={self.active} queued={self.queued}>"

    @property
    def capped(self) -> bool:
        """Its slots are at its cap: no permit or own-slot request may be granted."""
        limit = self.limit
        return limit is not None and self.active >= limit

    @property
    def calls_full(self) -> bool:
        """Its calls in flight are at its cap: no request of it may be granted."""
        limit = self.limit
        return limit is not None and self.calls >= limit

    @property
    def admits(self) -> bool:
        """Open and its slots below its cap: its eligible permits may be granted now."""
        return self.line_admits(self.permits)

    @property
    def admits_calls(self) -> bool:
        """Open, and its slots and calls below its cap: an own-slot request may run."""
        return self.line_admits(self.requests)

    def line_admits(self, line: TicketLine) -> bool:
        """Whether the head of ``line`` (one of this tuple's) passes the gate and the cap:
        a permit needs a slot below the cap, a request on a slot of its own a slot and a
        call, a covered request a call (the one place these rules are written)."""
        if not self.open:
            return False
        limit = self.limit
        if limit is None:
            return True
        kind = line.kind
        if kind == PERMITS:
            return self.active < limit
        if kind == REQUESTS:
            return self.active < limit and self.calls < limit
        return self.calls < limit

    @property
    def request_bucket(self) -> Bucket | None:
        """Its budget's bucket of requests per minute, if any (for reads)."""
        return None if self.budget is None else self.budget.requests

    @property
    def token_bucket(self) -> Bucket | None:
        """Its budget's bucket of tokens per minute, if any (for reads)."""
        return None if self.budget is None else self.budget.tokens

    @property
    def idle(self) -> bool:
        """Nothing worth remembering: no work, open, uncapped, no budget."""
        return (
            not self.queued
            and not self.active
            and not self.calls
            and not self.lent
            and self.open
            and self.limit is None
            and self.budget is None
        )

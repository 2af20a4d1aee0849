"""The scheduler's tickets: one place in line, then the slot or the call it was granted.

Plain synchronous records with no decisions in them (those are ``scheduler.py``'s). A
:class:`Ticket` is one place in line and, once granted, the slot a permit holds or the
call a model request makes. It is also the parker of the task waiting for it
(``_base.waiter.Parker``), and the coordinator's context managers are tickets too: one
object per call, which is most of what a parked waiter costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Final, Protocol

from .._base.waiter import PENDING as _PENDING
from .._base.waiter import Parker

if TYPE_CHECKING:
    from .lines import Line, TupleState

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
    "RequestTicket",
    "Ticket",
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


class Wakeable(Protocol):
    """What the scheduler needs of a parked task (``_waiter.Parker`` fits)."""

    def grant(self, value: bool) -> None: ...

    def fail(self, error: BaseException) -> None: ...


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
    line: Line | None
    entry: object  # its live occurrence in ``line`` (see Line), LEFT, or None
    bypass: bool
    parker: Wakeable | None
    error: BaseException | None
    since: float | None

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
        # Every field set here, not through super(): this runs for every acquire. The
        # place in line (order, seq, tuple_state, origin) is the scheduler's to set.
        self._state = _PENDING
        self._value = None
        self._error = None
        self._sleeper = None
        self._home = None
        self.order = self.seq = self.origin = 0
        self.state = INACTIVE
        self.reject = reject
        self.line = None
        self.entry = None
        self.bypass = False
        self.parker = None
        self.error = None
        self.since = None
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
        self._state = _PENDING
        self._value = None
        self._error = None
        self._sleeper = None
        self._home = None
        self.order = self.seq = self.accepted = 0
        self.state = INACTIVE
        self.reject = reject
        self.line = None
        self.entry = None
        self.bypass = False
        self.parker = None
        self.error = None
        self.since = None
        self.tokens = tokens
        self.cover = None
        self.covered = False


# (order, seq, ticket) in a line's heap or the bypass heap; seq is unique, so comparison
# never reaches the third item.
Entry = tuple[int, int, "Ticket"]
Candidate = tuple[int, int, "RequestTicket"]  # in a permit's heap of candidates

"""Who waits, since when and why: an on-demand snapshot of the scheduler's waiters.

A pure read (like ``_scheduler_checks.peek``): it never pops a dead entry, re-keys a heap
or refills a bucket, so taking it cannot change what it describes. It is O(n) in the
waiters (each line is scanned once for its live entries) and bounded in what it returns:
the first ``per_tuple`` waiters of each tuple in ``(acceptance order, arrival)``, the
ones served next; a tuple's whole count is its ``queued`` in ``statistics()``.

Why a waiter waits (its *reason*), in the order the scheduler checks:

* ``inactive``: a reservation that was not activated yet;
* ``gate``: its tuple's gate is closed;
* ``tuple_limit``: its tuple is at its cap (for a request on a permit of another tuple,
  the request's own tuple);
* ``budget``: a model request its tuple's budget holds back (it, or a request ahead of it
  in its tuple, waits for the buckets to refill);
* ``capacity``: it may run, but every slot is taken (it waits its turn); a lending
  permit's reacquire, which ignores gates and caps, always waits for this.

Waited seconds come from ``Ticket.since`` (``time.monotonic()`` when it queued).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Final, Literal

from .._base.types import ModelTuple
from .tickets import INACTIVE, Entry, Ticket, TicketLine, TupleState

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["PER_TUPLE", "Reason", "WaiterStatistics", "waiters"]

PER_TUPLE: Final = 100

Reason = Literal["gate", "tuple_limit", "budget", "capacity", "inactive"]
Kind = Literal["permit", "reservation", "request", "reacquire"]


@dataclass(frozen=True, slots=True)
class WaiterStatistics:
    """One waiter.

    Attributes:
        tuple: the model tuple it waits for.
        acceptance_order: its place in line.
        waited: seconds since it queued.
        reason: why it waits (see the module docstring).
        kind: ``permit``, ``reservation``, ``request`` (a model request) or ``reacquire``
            (a lending permit taking a slot back).
    """

    tuple: ModelTuple
    acceptance_order: int
    waited: float
    reason: Reason
    kind: Kind


def _first_live(line: TicketLine, count: int) -> list[Entry]:
    """The ``count`` best live entries of ``line``, best first."""
    live = line.entries()
    if line.fifo:  # sorted already: the front is the best
        return live[:count]
    return heapq.nsmallest(count, live, key=_key)


def _key(entry: Entry) -> tuple[int, int]:
    return (entry[0], entry[1])


def _gate_open(state: TupleState, now: float) -> bool:
    # A timed closure whose instant has passed counts as open (statistics() agrees).
    return state.open or (state.reopens_at is not None and state.reopens_at <= now)


def _budget_holds_back(state: TupleState, ticket: Ticket, now: float) -> bool:
    block = state.block
    if block is not None and (block is ticket or ticket.key > block.key):
        return True
    budget = state.budget
    return budget is not None and not budget.holds(ticket.tokens, now)


def reason(state: TupleState, ticket: Ticket, now: float) -> Reason:
    """Why queued ``ticket`` of ``state`` waits at ``now`` (the scheduler's clock)."""
    if ticket.state == INACTIVE:
        return "inactive"
    if ticket.bypass:
        return "capacity"
    if not _gate_open(state, now):
        return "gate"
    if ticket.request and state.calls_full:
        return "tuple_limit"
    if not ticket.covered and state.capped:  # (a covered one takes its cover's slot back)
        return "tuple_limit"
    if ticket.request and _budget_holds_back(state, ticket, now):
        return "budget"
    return "capacity"


def _kind(ticket: Ticket) -> Kind:
    if ticket.request:
        return "request"
    if ticket.bypass:
        return "reacquire"
    # An activated reservation waits exactly like an acquire: both are permits then.
    return "reservation" if ticket.state == INACTIVE else "permit"


def waiters(
    engine: Engine, now: float, monotonic_now: float, per_tuple: int = PER_TUPLE
) -> list[WaiterStatistics]:
    """The first ``per_tuple`` waiters of every tuple, sorted by tuple, then by order.

    ``now`` is the scheduler's clock (for gates and budgets), ``monotonic_now`` the
    ``time.monotonic()`` of the same moment (for waited seconds). Call under the lock.
    """
    reacquiring: dict[TupleState, list[Entry]] = {}
    for entry in engine.reacquires():
        reacquiring.setdefault(entry[2].tuple_state, []).append(entry)
    result: list[WaiterStatistics] = []
    for state in sorted(engine.tuple_states(), key=_by_tuple):
        if not state.queued:
            continue
        found: list[Iterable[Entry]] = [
            _first_live(state.permits, per_tuple),
            _first_live(state.requests, per_tuple),
            _first_live(state.covered, per_tuple),
            heapq.nsmallest(per_tuple, reacquiring.get(state, ()), key=_key),
        ]
        if state.inactive:
            found.append(
                heapq.nsmallest(per_tuple, ((t.order, t.seq, t) for t in state.inactive), key=_key)
            )
        for _order, _seq, ticket in islice(heapq.merge(*found, key=_key), per_tuple):
            since = ticket.since
            result.append(
                WaiterStatistics(
                    state.tuple,
                    ticket.accepted if ticket.request else ticket.order,
                    0.0 if since is None else max(0.0, monotonic_now - since),
                    reason(state, ticket, now),
                    _kind(ticket),
                )
            )
    return result


def _by_tuple(state: TupleState) -> ModelTuple:
    return state.tuple

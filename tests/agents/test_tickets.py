"""_agents/tickets: tickets and a tuple's bookkeeping, as plain structures (the scheduler's
rules over them are checked in test_scheduler.py, against a model)."""

from __future__ import annotations

import heapq

from lovely_coordinator import ModelTuple
from lovely_coordinator._agents.lines import COVERED, PERMITS, REQUESTS
from lovely_coordinator._agents.tickets import (
    INACTIVE,
    PermitTicket,
    RequestTicket,
    Ticket,
    TupleState,
)

A = ModelTuple("p", "a")


def test_a_tuple_holds_its_three_lines_one_of_each_kind() -> None:
    state = TupleState(A)
    lines = (state.permits, state.requests, state.covered)
    assert [line.kind for line in lines] == [PERMITS, REQUESTS, COVERED]
    assert all(line.state is state and line.head() is None for line in lines)
    # A ticket moved from the requests line to the covered line can leave two ready
    # entries with the same key: they compare by line kind (see lines.Line.__lt__).
    ready = [(7, 3, state.covered), (7, 3, state.requests), (7, 3, state.permits)]
    heapq.heapify(ready)
    assert [heapq.heappop(ready)[2] for _ in range(3)] == list(lines)
    assert state.idle


def test_each_line_admits_by_its_own_rule() -> None:
    state = TupleState(A)
    state.limit = 2
    state.active, state.calls = 2, 1  # no slot left, a call left
    assert (state.capped, state.calls_full) == (True, False)
    assert [state.line_admits(line) for line in (state.permits, state.requests)] == [
        False,
        False,
    ]
    assert state.line_admits(state.covered)  # a covered request needs only a call
    state.active, state.calls = 1, 2  # a slot left, no call left
    assert state.admits
    assert not state.admits_calls
    assert not state.line_admits(state.covered)
    state.calls = 1
    state.open = False  # a closed gate admits nothing
    assert not any(state.line_admits(line) for line in (state.permits, state.covered))
    assert not state.idle


def test_a_permit_ticket_starts_as_a_ticket_does() -> None:
    # PermitTicket sets Ticket's fields itself (one call less per acquire): the two
    # lists must stay in step.
    plain, permit = Ticket(True), PermitTicket(True)
    for name in Ticket.__slots__:
        if hasattr(plain, name):
            assert getattr(permit, name) == getattr(plain, name), name
    assert [hasattr(plain, n) for n in Ticket.__slots__] == [
        hasattr(permit, n) for n in Ticket.__slots__
    ]
    assert (permit.origin, permit.lends, permit.covering, permit.candidates) == (0, 0, None, None)
    assert not permit.request
    assert permit.state == INACTIVE
    assert repr(permit) == "<Ticket permit None order=0 seq=0 inactive>"


def test_a_request_ticket_reads_a_permits_fields_as_defaults() -> None:
    request = RequestTicket(False, tokens=12)
    assert request.request
    assert request.tokens == 12
    assert request.cover is None
    assert (request.lends, request.covering, request.candidates) == (0, None, None)
    request.tuple_state = TupleState(A)
    assert repr(request) == f"<Ticket request {A} order=0 seq=0 inactive>"

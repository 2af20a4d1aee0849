"""The scheduler's invariants, checked from the outside (for tests).

:func:`check_invariants` asserts every invariant that the scheduler's own state can show.
It is a pure read: it never drops a dead entry or re-keys a heap (a checker that tidied
the state it checks could hide exactly the bug it is there to find), so every "head" here
is computed by scanning, not by ``Line.head()``. O(n).

Granted tickets are not stored by the scheduler (their holders keep them), so counts of
granted and lent tickets are checked by the tests' models, which know every ticket; the
checks here are that the per-tuple counts add up to the totals, and that every queued
ticket it holds knows since when it waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lines import PERMITS
from .tickets import DONE, GRANTED, INACTIVE, QUEUED, Ticket, TicketLine, TupleState
from .tuple_table import IDLE_KEPT
from .wakeups import BUDGET, GATE

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["check_invariants", "peek", "peek_wakeup"]


def peek(line: TicketLine) -> Ticket | None:
    """The best live ticket of ``line``, without touching it."""
    live = line.entries()
    return min(live, key=lambda e: (e[0], e[1]))[2] if live else None


def peek_wakeup(engine: Engine) -> float | None:
    """The earliest live wake-up, without dropping the dead ones (``next_wakeup`` does)."""
    return engine.wakeups.peek()


def _held_back(state: TupleState, ticket: Ticket) -> bool:
    """Whether the budget's block holds ``ticket`` back (it is the front or behind it)."""
    block = state.block
    return block is not None and (block is ticket or ticket.key > block.key)


def _check_line(line: TicketLine, state: TupleState) -> None:
    live = line.entries()
    assert len(line.items) - len(live) == line.dead, f"dead count of {line}"
    for entry in live:
        assert entry[2].line is line, f"{entry[2]} is live in {line} but not its line"
        assert entry[2].state == QUEUED, f"{entry[2]} is live in {line} but not queued"
    assert len({id(e[2]) for e in live}) == len(live), f"a ticket twice in {line}"
    for entry in live:
        ticket = entry[2]
        assert ticket.tuple_state is state
        assert not ticket.bypass
        assert ticket.request == (line.kind != 0), f"{ticket} in {line}"
        assert ticket.covered == (line.kind == 2), f"{ticket} in {line}"
    if line.fifo:
        for item in line.items:
            assert not isinstance(item, tuple), f"an entry in FIFO {line}"
        for i in range(1, len(live)):
            assert live[i - 1][:2] < live[i][:2], f"FIFO order of {line}"
        assert all(e[:2] <= line.last for e in live), f"FIFO last key of {line}"
    else:
        items = list(line.items)
        for i in range(1, len(items)):
            assert items[(i - 1) // 2][:2] <= items[i][:2], f"heap order of {line}"


def _has_wakeup(engine: Engine, instant: float, kind: int, state: TupleState) -> bool:
    return engine.wakeups.has(instant, kind, state)


def check_invariants(engine: Engine) -> None:
    """Assert every invariant the scheduler's state shows (see ``Scheduler``)."""
    assert engine._counter >= 0
    ready_entries = {id(e) for e in engine._ready}
    covered = 0  # waiting covered requests, each with its own parked cover
    table = engine.tuples
    for model_tuple, state in table.states.items():
        assert state.tuple == model_tuple
        assert not state.idle or model_tuple in table.idle, f"idle tuple kept: {model_tuple}"
        assert state.active >= 0
        assert state.calls >= 0
        assert state.queued >= 0
        for line in (state.permits, state.requests, state.covered):
            _check_line(line, state)
        for ticket in state.foreground or ():
            assert ticket.reject, f"foreground {ticket}"
            assert ticket.state in (0, QUEUED), f"foreground {ticket}"
        for ticket in state.inactive or ():
            assert ticket.state == INACTIVE, f"inactive {ticket}"
            assert ticket.tuple_state is state, f"inactive {ticket} of another tuple"
            assert ticket.since is not None, f"inactive {ticket} without its enqueue time"
        assert state.lent >= 0
        for line in (state.permits, state.requests, state.covered):
            for item in line.entries():
                assert item[2].since is not None, f"{item[2]} queued without its time"
        if not state.open and state.reopens_at is not None:
            assert _has_wakeup(engine, state.reopens_at, GATE, state), f"no reopen: {state}"
        block = state.block
        if block is not None:
            assert block.state == QUEUED, f"block {block}"
            assert block.request, f"block {block}"
            assert block.tuple_state is state, f"block {block}"
            assert state.block_until is not None
            assert _has_wakeup(engine, state.block_until, BUDGET, state), f"no wake: {state}"
        # Each runnable line (whose head is not held back) is represented in _ready.
        for line in (state.permits, state.requests, state.covered):
            head = peek(line)
            if head is None or not state.line_admits(line):
                continue
            if line.kind != PERMITS and _held_back(state, head):
                continue
            entry = line.entry
            assert entry is not None, f"{line} runnable but not ready"
            assert entry[:2] <= (head.order, head.seq), f"{line} ready with a later key"
            assert id(entry) in ready_entries, f"{line} entry not in the ready heap"
        # Rule L: a waiting covered request's cover is held and parked, and it ranks
        # at the better of its own order and its cover's.
        for waiting in state.covered.entries():
            ticket = waiting[2]
            covered += 1
            cover = ticket.cover
            assert cover is not None, f"{ticket}: no cover"
            assert cover.state == GRANTED, f"{ticket}: cover not held"
            assert cover.parked, f"{ticket}: cover not parked"
            assert cover.covering is ticket, f"{ticket}: cover covers another"
            assert ticket.order == min(ticket.accepted, cover.order), f"{ticket}: rank"
        # A held permit that covers nothing has no waiting candidate.
        for waiting in state.requests.entries():
            ticket = waiting[2]
            cover = ticket.cover
            assert ticket.order == ticket.accepted, f"{ticket}: ranked off its cover"
            if cover is None:
                continue
            if cover.state == GRANTED and cover.covering is None:
                raise AssertionError(f"{ticket} waits although its cover {cover} is free")
            if cover.state != DONE:
                candidates = cover.candidates or []
                assert any(c[2] is ticket for c in candidates), f"{ticket}: not a candidate"
    assert len(table.idle) <= IDLE_KEPT
    bypass_live = [e for e in engine._bypass if e[2].state == QUEUED and e[2].seq == e[1]]
    assert len(engine._bypass) - len(bypass_live) == engine._bypass_dead
    assert all(e[2].bypass for e in bypass_live)
    assert engine.active == sum(s.active for s in table.states.values())
    assert engine.queued == sum(s.queued for s in table.states.values())
    assert engine.lent >= len(bypass_live) + covered, "parked covers count as lent"
    assert engine.lent == sum(s.lent for s in table.states.values()), "lent per tuple"
    for reacquire in bypass_live:
        ticket = reacquire[2]
        assert ticket.since is not None, f"{ticket} reacquires without its time"
        assert ticket.tuple_state.lent > 0, f"{ticket} reacquires on a tuple with none lent"
    if engine.active < engine.limit:
        assert not bypass_live, "a reacquire could run but waits"
        for state in table.states.values():
            if state.admits:
                assert peek(state.permits) is None, f"{state.tuple} permit could run but waits"
            if not state.admits_calls:
                continue
            head = peek(state.requests)
            assert head is None or _held_back(state, head), (
                f"{state.tuple} request could run but waits"
            )
        for state in table.states.values():
            if not state.line_admits(state.covered):
                continue
            head = peek(state.covered)
            assert head is None or _held_back(state, head), (
                f"{state.tuple} covered request could run but waits"
            )

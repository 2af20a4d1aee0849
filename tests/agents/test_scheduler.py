"""The pure scheduler: unit tests, plus a state machine checked against a brute-force model.

Everything here is synchronous: the scheduler never awaits, and its clock is a number the
test moves, so every rule — order, gates, caps, lending, model requests and the permits
that cover them, budgets, max_queued — can be checked step by step. The state machine runs
the real scheduler beside ``scheduler_model.Model`` and requires the same outcome after
every step, with ``check_invariants()`` (a pure read) and the two promises of CONTRACT §5
as invariants: requests in flight never outnumber slots, and a held permit that covers
nothing never leaves a request waiting for it (so a task holding the only permit that
fans out requests never deadlocks).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import cast

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from lovely_coordinator import CoordinatorBusyError, ModelTuple, TupleSuspendedError
from lovely_coordinator._agents import scheduler_checks as _checks
from lovely_coordinator._agents import tuple_table as _table
from lovely_coordinator._agents.bucket import Bucket
from lovely_coordinator._agents.scheduler import SUSPENDED_MESSAGE, Scheduler
from lovely_coordinator._agents.scheduler_checks import peek_wakeup
from lovely_coordinator._agents.statistics import tuple_snapshot
from lovely_coordinator._agents.tickets import (
    DONE,
    GRANTED,
    INACTIVE,
    LENT,
    QUEUED,
    PermitTicket,
    RequestTicket,
    Ticket,
)

A = ModelTuple("p", "a")
B = ModelTuple("p", "b")
C = ModelTuple("q", "c")


class FakeParker:
    """Records what the scheduler did to a parked waiter; each call may happen once."""

    def __init__(self) -> None:
        self.granted: list[bool] = []
        self.failed: list[BaseException] = []

    def grant(self, value: bool) -> None:
        assert not self.granted
        assert not self.failed
        self.granted.append(value)

    def fail(self, error: BaseException) -> None:
        assert not self.granted
        assert not self.failed
        self.failed.append(error)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(limit: int = 1, **kwargs: object) -> tuple[Scheduler, Clock]:
    clock = Clock()
    return Scheduler(limit, clock=clock, **kwargs), clock  # type: ignore[arg-type]


def enqueue(
    s: Scheduler,
    t: ModelTuple = A,
    order: int | None = None,
    *,
    active: bool = True,
    reject: bool = False,
) -> PermitTicket:
    ticket = s.enqueue(t, order, active, reject)
    s.check_invariants()
    return ticket


def request(
    s: Scheduler,
    t: ModelTuple = A,
    tokens: int = 0,
    cover: PermitTicket | None = None,
    order: int | None = None,
) -> RequestTicket:
    ticket = s.enqueue_request(t, order, False, tokens, cover)
    s.check_invariants()
    return ticket


def states(*tickets: Ticket) -> list[int]:
    return [t.state for t in tickets]


def parker_of(ticket: Ticket) -> object:
    return ticket.parker  # read through a call: the type checker must not narrow it


def covered(ticket: Ticket) -> bool:
    return ticket.covered


# -- permits --------------------------------------------------------------------------------------


def test_grants_up_to_the_limit_then_queues() -> None:
    s, _ = make(2)
    a, b, c = (enqueue(s) for _ in range(3))
    assert states(a, b, c) == [GRANTED, GRANTED, QUEUED]
    assert (s.active, s.queued) == (2, 1)
    s.release(a)
    assert states(a, c) == [DONE, GRANTED]  # handed over inside release()
    assert (s.active, s.queued) == (2, 0)
    s.check_invariants()


def test_acceptance_order_then_arrival() -> None:
    s, _ = make(1)
    first = enqueue(s)
    b5 = enqueue(s, order=5)
    c3 = enqueue(s, order=3)
    d3 = enqueue(s, order=3)
    auto = enqueue(s)
    assert auto.order == 6
    granted = []
    current = first
    for _ in range(4):
        s.release(current)
        current = next(t for t in (b5, c3, d3, auto) if t.state == GRANTED)
        granted.append(current)
    assert granted == [c3, d3, b5, auto]
    s.check_invariants()


def test_parked_waiter_is_granted_and_failed_through_its_parker() -> None:
    s, _ = make(1)
    holder = enqueue(s)
    waiter = enqueue(s)
    parker = FakeParker()
    waiter.parker = parker
    s.release(holder)
    assert parker.granted == [True]
    assert parker_of(waiter) is None
    foreground = enqueue(s, reject=True)
    foreground.parker = other = FakeParker()
    s.close(A, None)
    assert [str(e) for e in other.failed] == [SUSPENDED_MESSAGE]
    assert foreground.state == DONE
    s.check_invariants()


def test_closed_tuple_is_skipped_and_keeps_its_place() -> None:
    s, _ = make(1)
    holder = enqueue(s, A)
    s.close(A, None)
    gated = enqueue(s, A)
    other = enqueue(s, B)
    later = enqueue(s, A)
    s.release(holder)
    assert states(gated, other, later) == [QUEUED, GRANTED, QUEUED]
    s.open(A)
    s.release(other)
    assert states(gated, later) == [GRANTED, QUEUED]
    s.check_invariants()


def test_reject_fails_at_once_or_when_the_gate_closes() -> None:
    s, _ = make(1)
    holder = enqueue(s, A)
    waiting = enqueue(s, A, reject=True)
    s.close(A, None)
    assert waiting.state == DONE
    assert isinstance(waiting.error, TupleSuspendedError)
    counter = s._counter
    with pytest.raises(TupleSuspendedError):
        s.enqueue(A, None, True, True)
    assert s._counter == counter  # refused before drawing an order
    s.release(holder)
    s.check_invariants()


def test_tuple_cap_skips_without_blocking_others() -> None:
    s, _ = make(3)
    s.set_tuple_limit(A, 1)
    a1 = enqueue(s, A)
    a2 = enqueue(s, A)
    b1 = enqueue(s, B)
    assert states(a1, a2, b1) == [GRANTED, QUEUED, GRANTED]
    s.release(a1)
    assert a2.state == GRANTED
    s.check_invariants()


def test_set_limit_grows_in_order_and_never_revokes() -> None:
    s, _ = make(1)
    tickets = [enqueue(s) for _ in range(4)]
    s.set_limit(3)
    assert states(*tickets) == [GRANTED, GRANTED, GRANTED, QUEUED]
    s.set_limit(1)
    assert s.active == 3  # nothing revoked
    s.check_invariants()


def test_inactive_reservation_is_skipped_until_activated() -> None:
    s, _ = make(1)
    reservation = enqueue(s, order=1, active=False)
    later = enqueue(s)
    assert states(reservation, later) == [INACTIVE, GRANTED]
    s.release(later)
    assert reservation.state == INACTIVE
    s.activate(reservation)
    assert reservation.state == GRANTED
    s.check_invariants()


def test_close_never_shortens_a_closure() -> None:
    s, clock = make(1)
    s.close(A, 10.0)
    s.close(A, 5.0)  # earlier: ignored
    assert s.tuple_state(A).reopens_at == 10.0  # type: ignore[union-attr]
    s.close(A, 20.0)  # later: replaces it
    assert s.next_wakeup() == 20.0
    clock.now = 10.0
    assert not s.advance()  # the dead wake-up at 10 does nothing
    assert not s.is_open(A, None)
    clock.now = 20.0
    assert s.advance()
    assert s.is_open(A, None)
    s.close(A, None)
    s.close(A, 30.0)  # until further notice stays until further notice
    assert s.tuple_state(A).reopens_at is None  # type: ignore[union-attr]
    assert s.next_wakeup() is None
    s.check_invariants()


def test_is_open_is_a_pure_read_of_a_due_closure() -> None:
    s, _clock = make(1)
    s.close(A, 5.0)
    version = s.version
    assert not s.is_open(A, 4.0)
    assert s.is_open(A, 5.0)  # due: open, although nothing ran yet
    assert s.version == version
    assert not s.tuple_state(A).open  # type: ignore[union-attr]


def test_shift_time_restates_every_instant() -> None:
    s, clock = make(2)
    s.close(A, 5.0)
    s.set_budget(B, 60.0, None)
    for _ in range(60):
        s.release(request(s, B))  # spend the whole bucket
    waiting = request(s, B)
    assert s.next_wakeup() == pytest.approx(1.0)
    s.shift_time(100.0)
    clock.now = 100.0
    assert s.tuple_state(A).reopens_at == 105.0  # type: ignore[union-attr]
    assert s.next_wakeup() == pytest.approx(101.0)
    clock.now = 101.0
    assert s.advance()
    assert waiting.state == GRANTED
    s.check_invariants()


def test_idle_tuples_are_forgotten() -> None:
    s, _ = make(1)
    for i in range(200):
        t = ModelTuple("p", f"m{i}")
        s.release(enqueue(s, t))
    assert len(s.tuples.states) <= 64
    s.check_invariants()


def test_cancelled_waiters_do_not_accumulate() -> None:
    s, _ = make(1)
    holder = enqueue(s)
    for _ in range(1000):
        s.discard(enqueue(s))
    line = s.tuples.states[A].permits
    assert len(line.items) <= 2 * 64 + 2
    s.release(holder)
    s.check_invariants()


def test_ready_heap_is_compacted_under_close_open_churn() -> None:
    # Regression (mutation testing): the compaction of the ready heap never ran in a test.
    s, _ = make(1)
    holder = enqueue(s, A)
    waiters = [enqueue(s, ModelTuple("p", f"m{i}")) for i in range(10)]
    for _ in range(200):
        for w in waiters:
            s.close(w.tuple_state.tuple, None)
            s.open(w.tuple_state.tuple)
    assert len(s._ready) <= 4 * len(s.tuples.states) + 64
    s.release(holder)
    assert waiters[0].state == GRANTED
    s.check_invariants()


def test_a_discarded_ticket_at_a_capped_tuple_is_never_granted() -> None:
    # Regression (mutation testing): the checker used to drop dead entries itself.
    s, _ = make(2)
    s.set_tuple_limit(A, 1)
    holder = enqueue(s, A)
    gone = enqueue(s, A)
    after = enqueue(s, A)
    s.discard(gone)
    s.check_invariants()
    assert len(s.tuples.states[A].permits.items) == 2  # the dead entry is still there: untouched
    s.release(holder)
    assert states(gone, after) == [DONE, GRANTED]
    s.check_invariants()


def test_a_reacquire_and_a_queued_ticket_with_the_same_order_tie_by_arrival() -> None:
    # Regression (mutation testing): never tied in a test.
    s, _ = make(1, fresh_reacquire=False)
    permit = enqueue(s, A, order=5)
    s.lend_begin(permit)
    queued = enqueue(s, B, order=5)  # same order, arrives before the reacquire
    assert queued.state == GRANTED  # the lent slot was free
    other = enqueue(s, B, order=5)
    parker = FakeParker()
    assert s.lend_end(permit, parker)  # reacquire with order 5, arriving last
    s.release(queued)
    assert states(other, permit) == [GRANTED, QUEUED]  # equal order: earlier arrival wins
    s.release(other)
    assert permit.state == GRANTED
    assert parker.granted == [True]
    s.check_invariants()


def test_cancelled_reacquires_do_not_accumulate() -> None:
    s, _ = make(1)
    blocker = enqueue(s, B)
    permits = []
    for _ in range(100):
        permit = s.enqueue(A, None, False, False)
        s.activate(permit)
        permits.append(permit)
    s.release(blocker)  # the first permit gets the slot, the others wait
    held = next(p for p in permits if p.state == GRANTED)
    s.lend_begin(held)
    s.release(next(p for p in permits if p.state == GRANTED))
    lenders = [p for p in permits if p.state == GRANTED] + [held]
    for ticket in lenders:
        if ticket.state == GRANTED:
            s.lend_begin(ticket)
    blocker = enqueue(s, B)
    for ticket in lenders:
        s.lend_end(ticket, FakeParker())
    for ticket in [t for t in lenders if t.state == QUEUED]:
        s.discard(ticket)  # cancelled while reacquiring
    assert len(s._bypass) <= 2 * 64 + 2
    s.check_invariants()


# -- lending --------------------------------------------------------------------------------------


def test_lend_and_reacquire_bypass_gates_and_caps() -> None:
    s, _ = make(1)
    s.set_tuple_limit(A, 1)
    permit = enqueue(s, A)
    s.lend_begin(permit)
    assert (permit.state, s.active, s.lent) == (LENT, 0, 1)
    other = enqueue(s, A)
    assert other.state == GRANTED
    s.close(A, None)
    parker = FakeParker()
    assert s.lend_end(permit, parker)
    assert permit.state == QUEUED
    s.release(other)
    assert permit.state == GRANTED  # closed and capped, but a reacquire bypasses both
    assert parker.granted == [True]
    assert s.lent == 0
    s.check_invariants()


def test_overlapping_lends_reacquire_once_and_a_new_lend_withdraws_a_waiting_one() -> None:
    s, _ = make(1)
    permit = enqueue(s)
    s.lend_begin(permit)
    s.lend_begin(permit)
    blocker = enqueue(s)
    assert not s.lend_end(permit, FakeParker())  # not the last: no reacquire
    first = FakeParker()
    assert s.lend_end(permit, first)
    assert permit.state == QUEUED
    withdrawn = s.lend_begin(permit)  # a new lend: the waiting reacquire is pointless
    assert withdrawn is first
    assert permit.state == LENT
    assert s.lent == 1
    second = FakeParker()
    assert s.lend_end(permit, second)
    s.release(blocker)
    assert second.granted == [True]
    s.check_invariants()


def test_release_of_a_lent_ticket_ends_the_lend() -> None:
    s, _ = make(1)
    permit = enqueue(s)
    s.lend_begin(permit)
    s.release(permit)
    assert (permit.state, s.lent) == (DONE, 0)
    assert not s.lend_end(permit, FakeParker())
    s.check_invariants()


# -- model requests and the permits that cover them -----------------------------------------------


def test_a_request_is_covered_by_a_free_permit_and_waits_for_it_otherwise() -> None:
    s, _ = make(1)
    permit = enqueue(s)
    first = request(s, cover=permit)
    assert first.state == GRANTED
    assert first.covered
    assert s.active == 1
    fanned = [request(s, cover=permit) for _ in range(3)]
    assert states(*fanned) == [QUEUED] * 3  # the permit is busy, no other slot
    s.release(first)
    assert states(*fanned) == [GRANTED, QUEUED, QUEUED]  # the permit goes on, in order
    s.release(fanned[0])
    s.release(fanned[1])
    s.release(fanned[2])
    assert permit.covering is None
    s.release(permit)
    assert (s.active, s.queued) == (0, 0)
    s.check_invariants()


def test_fan_out_uses_free_slots_and_the_permit() -> None:
    s, _ = make(3)
    permit = enqueue(s)
    calls = [request(s, cover=permit) for _ in range(5)]
    in_flight = [c for c in calls if c.state == GRANTED]
    assert len(in_flight) == 3  # the permit's slot and the two free ones
    assert s.active == 3
    s.check_invariants()


def test_lending_a_permit_with_a_request_in_flight_keeps_its_slot() -> None:
    s, _ = make(1)
    permit = enqueue(s)
    call = request(s, cover=permit)
    s.lend_begin(permit)
    assert (permit.state, permit.deferred, s.active) == (LENT, True, 1)
    other = enqueue(s)
    assert other.state == QUEUED  # the slot is still in use by the call
    s.release(call)
    assert other.state == GRANTED  # now it is free
    s.check_invariants()


def test_a_reserved_cover_goes_back_when_the_permit_is_lent() -> None:
    s, _ = make(1)
    permit = enqueue(s)
    s.close(B, None)
    call = request(s, B, cover=permit)
    assert call.covered
    assert call.state == QUEUED
    s.lend_begin(permit)
    assert not covered(call)  # back to waiting for a slot of its own
    s.open(B)
    assert call.state == GRANTED
    assert not covered(call)
    s.check_invariants()


def test_a_permit_released_with_a_call_in_flight_frees_its_slot_after_the_call() -> None:
    s, _ = make(1)
    permit = enqueue(s)
    call = request(s, cover=permit)
    s.release(permit)
    waiter = enqueue(s)
    assert waiter.state == QUEUED
    s.release(call)
    assert waiter.state == GRANTED
    s.check_invariants()


def test_a_foreign_covered_request_counts_against_its_own_tuples_cap() -> None:
    s, _ = make(4)
    s.set_tuple_limit(B, 1)
    permit = enqueue(s, A)
    call = request(s, B, cover=permit)
    assert call.state == GRANTED
    own = request(s, B)
    assert own.state == QUEUED  # B is at its cap through the covered call
    s.release(call)
    assert own.state == GRANTED
    s.check_invariants()


# -- budgets --------------------------------------------------------------------------------------


def test_a_budget_paces_requests_with_exact_wake_ups() -> None:
    s, clock = make(100)
    s.set_budget(A, 60.0, None)  # one request per second, 60 at once
    calls = [request(s) for _ in range(61)]
    assert sum(c.state == GRANTED for c in calls) == 60
    assert s.next_wakeup() == pytest.approx(1.0)
    for c in calls[:60]:
        s.release(c)
    clock.now = s.next_wakeup()  # type: ignore[assignment]
    assert s.advance()
    assert calls[60].state == GRANTED
    s.check_invariants()


def test_within_a_tuple_a_small_request_never_overtakes_a_large_one() -> None:
    s, clock = make(10)
    s.set_budget(A, None, 600.0)  # 10 tokens per second
    first = request(s, tokens=500)
    large = request(s, tokens=400)  # needs 300 more: 30 s
    small = request(s, tokens=1)
    assert states(first, large, small) == [GRANTED, QUEUED, QUEUED]
    assert s.tuples.states[A].block is large
    clock.now = 29.0
    s.advance()
    assert small.state == QUEUED  # the budget holds it, but it waits its turn
    clock.now = 30.0
    assert s.advance()
    assert states(large, small) == [GRANTED, QUEUED]
    s.check_invariants()


def test_an_earlier_order_may_go_ahead_of_the_front_which_then_waits_longer() -> None:
    s, clock = make(10)
    s.set_budget(A, None, 60.0)  # one token per second
    first = request(s, tokens=60)
    front = request(s, tokens=30, order=20)  # 30 s
    assert s.next_wakeup() == pytest.approx(30.0)
    early = request(s, tokens=10, order=5)  # ahead of the front: it may try (and waits)
    assert early.state == QUEUED
    assert s.tuples.states[A].block is early
    clock.now = 10.0
    assert s.advance()
    assert states(early, front) == [GRANTED, QUEUED]  # the front waits 10 s longer
    assert s.tuples.states[A].block is front
    assert s.next_wakeup() == pytest.approx(40.0)
    s.release(first)
    s.check_invariants()


def test_a_request_larger_than_the_bucket_waits_for_it_full_then_goes_below_zero() -> None:
    s, clock = make(10)
    s.set_budget(A, None, 60.0)
    first = request(s, tokens=30)
    huge = request(s, tokens=100)
    assert huge.state == QUEUED
    clock.now = 30.0  # full again
    assert s.advance()
    assert huge.state == GRANTED
    bucket = s.tuples.states[A].token_bucket
    assert bucket is not None
    assert bucket.available(clock.now) == pytest.approx(-40.0)
    zero = request(s, tokens=0)
    assert zero.state == QUEUED  # below zero, even tokens=0 waits
    s.release(first)
    s.check_invariants()


@pytest.mark.parametrize("covered_first", [True, False])
def test_covered_and_own_slot_requests_of_a_tuple_draw_in_one_order(covered_first: bool) -> None:
    # Regression: when the budget moved, the covered line was served to its end before
    # (or after) the requests wanting a slot of their own, whatever their keys. A
    # covered request ranks at its cover's order when that is better (rule L).
    s, _clock = make(5)
    s.set_budget(A, None, 100.0)
    cover, other = enqueue(s, B), enqueue(s, B)  # orders 1 and 2
    spender = request(s, tokens=100)
    if covered_first:
        early = request(s, tokens=10, cover=cover)  # rank 1
        large = request(s, tokens=85)  # order 5, a slot of its own is free
        late = request(s, tokens=10, cover=other)  # rank 2: ahead of the large one
        held_back = large
    else:
        early = request(s, tokens=10)  # order 4
        large = request(s, tokens=85, cover=cover)  # rank 1
        late = request(s, tokens=10)  # order 6
        held_back = late
    assert (early.accepted, large.accepted, late.accepted) == (4, 5, 6)
    s.settle(spender, 0)  # 100 back
    assert [t.state == GRANTED for t in (early, large, late)] == [
        t is not held_back for t in (early, large, late)
    ]
    assert s.tuples.states[A].block is held_back
    s.check_invariants()


def test_closing_a_tuple_disarms_its_budget_wake_up() -> None:
    # Regression: the budget's wake-up stayed armed while the gate was closed, and fired
    # granting nothing.
    s, clock = make(2)
    s.set_budget(A, 1.0, None)
    first = request(s)
    front = request(s)
    assert s.next_wakeup() == pytest.approx(60.0)
    s.close(A, None)
    assert peek_wakeup(s) is None  # nothing of A may draw while it is closed
    clock.now = 30.0
    s.open(A)
    assert s.next_wakeup() == pytest.approx(60.0)  # the front blocks again, same instant
    clock.now = 60.0
    assert s.advance()
    assert front.state == GRANTED
    s.release(front)
    s.close(A, 100.0)  # a timed closure: its reopen is the only wake-up
    late = request(s)
    assert peek_wakeup(s) == 100.0
    clock.now = 100.0
    assert s.advance()
    assert late.state == QUEUED  # open again, and blocked until its own instant
    assert s.next_wakeup() == pytest.approx(120.0)
    s.release(first)
    s.check_invariants()


def test_settle_refunds_and_charges_at_once() -> None:
    s, _clock = make(10)
    s.set_budget(A, None, 100.0)
    call = request(s, tokens=80)
    waiting = request(s, tokens=50)
    assert waiting.state == QUEUED
    s.settle(call, 20)  # the real usage: 60 back
    assert waiting.state == GRANTED
    s.settle(waiting, 100)  # charged more than estimated
    bucket = s.tuples.states[A].token_bucket
    assert bucket is not None
    assert bucket.available(0.0) == pytest.approx(-20.0)
    s.check_invariants()


def test_permits_never_wait_for_a_budget() -> None:
    s, _ = make(10)
    s.set_budget(A, 1.0, None)
    call = request(s)
    blocked = request(s)
    permit = enqueue(s, A)
    assert states(call, blocked, permit) == [GRANTED, QUEUED, GRANTED]
    s.check_invariants()


def test_learn_budget_only_lowers_and_leaves_explicit_budgets_alone() -> None:
    s, _clock = make(10)
    s.learn_budget(A, 600.0, None, 10.0, None)
    bucket = s.tuples.states[A].request_bucket
    assert bucket is not None
    assert (bucket.capacity, bucket.available(0.0)) == (600.0, 10.0)
    s.learn_budget(A, None, None, 500.0, None)  # never raises what is available
    assert bucket.available(0.0) == 10.0
    s.learn_budget(A, 20.0, None, None, None)  # a learned cut keeps what is available
    assert (bucket.capacity, bucket.available(0.0)) == (20.0, 10.0)
    s.learn_budget(A, 5.0, None, None, None)  # ... at most the new capacity: no debt
    assert bucket.available(0.0) == 5.0
    s.set_budget(A, 100.0, None)
    s.learn_budget(A, 600.0, None, None, None)  # explicit: the rate stands
    assert s.tuples.states[A].request_bucket.capacity == 100.0  # type: ignore[union-attr]
    s.check_invariants()


def test_max_queued_refuses_only_what_would_wait() -> None:
    s, _ = make(1, max_queued=1)
    holder = enqueue(s)
    enqueue(s)
    counter = s._counter
    with pytest.raises(CoordinatorBusyError):
        enqueue(s)
    with pytest.raises(CoordinatorBusyError):
        s.enqueue_request(A, None, False, 0, None)
    assert s._counter == counter  # no order drawn
    covered = request(s, cover=holder)  # covered by a free permit: runs now, not refused
    assert covered.state == GRANTED
    s.check_invariants()


def test_bucket_arithmetic() -> None:
    b = Bucket(60.0, 0.0)
    assert b.holds(60, 0.0)
    b.draw(60, 0.0)
    assert b.ready_at(1, 0.0) == pytest.approx(1.0)
    assert b.holds(1, b.ready_at(1, 0.0))
    b.adjust(-100, 0.5)  # a refund never lifts it above capacity
    assert b.available(0.5) == 60.0
    b.resize(30.0, 0.5)  # spent stays spent: 0 spent, so full at the new capacity
    assert b.available(0.5) == 30.0
    b.draw(40, 0.5)
    b.resize(60.0, 0.5)  # 40 spent of 30: -10 → 20 of 60
    assert b.available(0.5) == pytest.approx(20.0)
    b.lower_to(5.0, 0.5)
    assert b.available(0.5) == 5.0
    b.lower_to(50.0, 0.5)
    assert b.available(0.5) == 5.0


def test_issue_17_case_1_as_the_model_found_it() -> None:
    # The liveness invariant's counterexample on the code before the fix (AgentsMachine,
    # shrunk): caps of 1, agents holding permits on A and C; a request of A covered by
    # C's permit, then one covered by A's own permit. Neither ever ran.
    s, _ = make(3, tuple_limits={A: 1, C: 1})
    on_a, on_c = enqueue(s, A), enqueue(s, C)
    first = request(s, A, cover=on_c, order=1)
    second = request(s, A, cover=on_a)
    assert states(first, second) == [GRANTED, QUEUED]  # A's calls are at its cap
    check_liveness(s, [on_a, on_c, first, second])
    s.release(first)
    assert second.state == GRANTED
    s.check_invariants()


# -- the model: the rules, brute force ------------------------------------------------------------
# Every rule written the slow, obvious way: lists of tickets scanned in full on every step, no
# heaps, no lazy deletion, no fast paths. The budget arithmetic is the real Bucket (tested
# above): what is modelled here is who may draw, when.


@dataclass(eq=False)
class Ref:
    """The model's view of one ticket."""

    ticket: Ticket
    t: ModelTuple
    order: int
    seq: int
    state: int
    reject: bool
    request: bool = False
    origin: int = 0
    bypass: bool = False
    lends: int = 0
    tokens: int = 0
    cover: Ref | None = None
    covered: bool = False
    covering: Ref | None = None
    deferred: bool = False
    candidate: bool = False  # waits as a candidate of its cover
    accepted: int = 0  # a request's acceptance order (``order`` is its rank: rule L)
    parked: bool = False  # a held permit whose slot is lent while its request waits

    @property
    def key(self) -> tuple[int, int]:
        return (self.order, self.seq)


@dataclass
class Budget:
    requests: Bucket | None = None
    tokens: Bucket | None = None
    explicit: int = 0


@dataclass
class Model:
    """The scheduler's rules, brute force (see the module docstring)."""

    limit: int
    fresh: bool = True
    max_queued: int | None = None
    now: float = 0.0
    counter: int = 0
    seq: int = 0
    refs: list[Ref] = field(default_factory=list)
    closed: dict[ModelTuple, float | None] = field(default_factory=dict)
    caps: dict[ModelTuple, int] = field(default_factory=dict)
    budgets: dict[ModelTuple, Budget] = field(default_factory=dict)
    blocks: dict[ModelTuple, tuple[Ref, float]] = field(default_factory=dict)

    # -- derived ----------------------------------------------------------------------------------

    def slots_on(self, t: ModelTuple) -> int:
        return sum(
            1
            for r in self.refs
            if r.t == t
            and (
                (r.state == GRANTED and not r.covered and not r.parked)
                or (r.deferred and not r.request)
            )
        )

    def calls_on(self, t: ModelTuple) -> int:
        return sum(1 for r in self.refs if r.t == t and r.request and r.state == GRANTED)

    @property
    def active(self) -> int:
        return sum(self.slots_on(t) for t in {r.t for r in self.refs})

    @property
    def queued(self) -> int:
        return sum(1 for r in self.refs if r.state in (INACTIVE, QUEUED))

    @property
    def lent(self) -> int:
        return sum(
            1 for r in self.refs if r.state == LENT or (r.state == QUEUED and r.bypass) or r.parked
        )

    def is_open(self, t: ModelTuple) -> bool:
        return t not in self.closed

    def capped(self, t: ModelTuple) -> bool:
        cap = self.caps.get(t)
        return cap is not None and self.slots_on(t) >= cap

    def calls_full(self, t: ModelTuple) -> bool:
        cap = self.caps.get(t)
        return cap is not None and self.calls_on(t) >= cap

    def admits(self, t: ModelTuple) -> bool:
        return self.is_open(t) and not self.capped(t)

    def held_back(self, r: Ref) -> bool:
        block = self.blocks.get(r.t)
        return block is not None and (block[0] is r or r.key > block[0].key)

    def budgeted(self, t: ModelTuple) -> bool:
        b = self.budgets.get(t)
        return b is not None and (b.requests is not None or b.tokens is not None)

    def ready_at(self, r: Ref) -> float:
        b = self.budgets.get(r.t)
        ready = self.now
        if b is None:
            return ready
        if b.requests is not None and not b.requests.holds(1, self.now):
            ready = b.requests.ready_at(1, self.now)
        if b.tokens is not None and not b.tokens.holds(r.tokens, self.now):
            ready = max(ready, b.tokens.ready_at(r.tokens, self.now))
        return ready

    # -- the rules --------------------------------------------------------------------------------

    def may_draw(self, r: Ref) -> bool:
        """The budget check of a request that could otherwise run (blocks it if not)."""
        if not self.budgeted(r.t):
            return True
        block = self.blocks.get(r.t)
        if block is not None and block[0] is not r and r.key > block[0].key:
            return False
        ready = self.ready_at(r)
        if ready == self.now:
            return True
        self.blocks[r.t] = (r, ready)
        return False

    def draw(self, r: Ref) -> None:
        b = self.budgets.get(r.t)
        if b is None:
            return
        if b.requests is not None:
            b.requests.draw(1, self.now)
        if b.tokens is not None:
            b.tokens.draw(r.tokens, self.now)
        block = self.blocks.get(r.t)
        if block is not None and block[0] is r:
            del self.blocks[r.t]
        elif block is not None:
            self.blocks[r.t] = (block[0], self.ready_at(block[0]))

    def candidates_of(self, p: Ref) -> list[Ref]:
        return [
            r
            for r in self.refs
            if r.candidate and r.cover is p and r.state == QUEUED and not r.covered
        ]

    def hand_covers(self) -> None:
        for p in self.refs:
            if p.request or p.state != GRANTED or p.covering is not None:
                continue
            candidates = self.candidates_of(p)
            if candidates:
                self.reserve(p, min(candidates, key=_key))

    def reserve(self, p: Ref, r: Ref) -> None:
        """Rule L: ``r`` is covered by ``p``, ranks at the better of the two orders, and
        ``p`` lends its slot until ``r`` runs (granting it at once when it may run is the
        scheduler's shortcut to the same outcome)."""
        r.candidate = False
        r.covered = True
        p.covering = r
        r.order = min(r.accepted, p.order)
        p.parked = True

    def take_back(self, p: Ref) -> None:
        """A parked permit whose request left unrun takes its slot back (or covers its
        next candidate): at once if a slot is free, else as a reacquire."""
        candidates = self.candidates_of(p)
        if candidates:
            self.reserve(p, min(candidates, key=_key))
            return
        free = self.active < self.limit
        p.parked = False
        if not free:
            self.seq += 1
            p.state, p.bypass, p.seq = QUEUED, True, self.seq

    def settle(self) -> None:
        """Grant everything that may run, in key order, to a fixed point."""
        while True:
            self.hand_covers()
            candidates = []
            for r in self.refs:
                if r.state != QUEUED:
                    continue
                if r.covered:
                    ok = self.active < self.limit and self.is_open(r.t)
                    ok = ok and not self.calls_full(r.t) and not self.held_back(r)
                elif r.bypass:
                    ok = self.active < self.limit
                else:
                    ok = self.active < self.limit and self.admits(r.t)
                    ok = ok and not (r.request and (self.held_back(r) or self.calls_full(r.t)))
                if ok:
                    candidates.append(r)
            if not candidates:
                return
            best = min(candidates, key=_key)
            if best.request and not self.may_draw(best):
                continue  # it is the block now: the next round skips it
            best.state = GRANTED
            if best.bypass:
                best.bypass = False
            elif best.request:
                self.draw(best)
            if best.covered:
                _cover(best).parked = False  # it takes its slot back
            best.candidate = False

    def wake_due(self) -> bool:
        due = False
        for t, at in list(self.closed.items()):
            if at is not None and at <= self.now + 1e-6:
                del self.closed[t]
                due = True
        for t, (_front, until) in list(self.blocks.items()):
            if until <= self.now + 1e-6:
                del self.blocks[t]
                due = True
        return due

    def next_wakeup(self) -> float | None:
        instants = [at for at in self.closed.values() if at is not None]
        instants += [until for _front, until in self.blocks.values()]
        return min(instants, default=None)

    # -- steps ------------------------------------------------------------------------------------

    def next_order(self, explicit: int | None) -> int:
        if explicit is None:
            self.counter += 1
            return self.counter
        self.counter = max(self.counter, explicit)
        return explicit

    def new_ref(self, ticket: Ticket, t: ModelTuple, order: int, reject: bool) -> Ref:
        self.seq += 1
        ref = Ref(ticket, t, order, self.seq, INACTIVE, reject, origin=order, accepted=order)
        self.refs.append(ref)
        return ref

    def end_request(self, r: Ref) -> None:
        r.state = DONE
        if r.covered:
            p = _cover(r)
            p.covering = None
            if p.deferred:
                p.deferred = False

    def give_up_cover(self, p: Ref) -> bool:
        """A held permit stops covering; True if a request is in flight on it."""
        r = p.covering
        if r is None:
            return False
        if r.state == GRANTED:
            return True
        r.covered = False
        r.order = r.accepted
        p.covering = None
        p.parked = False
        if p.state != DONE:
            r.candidate = True
        else:
            r.cover = None
        return False

    def discard(self, r: Ref) -> None:
        covered = r.covered and r.cover is not None
        r.covered = False
        r.candidate = False
        r.bypass = False
        r.state = DONE
        if covered:
            _cover(r).covering = None
            self.take_back(_cover(r))
        block = self.blocks.get(r.t)
        if block is not None and block[0] is r:
            del self.blocks[r.t]


def _cover(r: Ref) -> Ref:
    assert r.cover is not None
    return r.cover


def _key(r: Ref) -> tuple[int, int]:
    return r.key


# -- the state machine ----------------------------------------------------------------------------

TUPLES = (A, B, C)


class SchedulerMachine(RuleBasedStateMachine):
    s: Scheduler
    m: Model
    clock: Clock
    # Start with caps of 1 and agents already holding permits (see AgentsMachine).
    AGENTS = False
    # Simulate liveness after every LIVENESS-th step (it copies the whole state); the
    # one-step check (progress) runs after every step.
    LIVENESS = 8

    @initialize(
        limit=st.integers(1, 3),
        fresh=st.booleans(),
        max_queued=st.none() | st.integers(0, 5),
        kept=st.sampled_from([0, 1, _table.IDLE_KEPT]),
        agents=st.lists(st.sampled_from(TUPLES), min_size=2, max_size=4),
    )
    def start(
        self, limit: int, fresh: bool, max_queued: int | None, kept: int, agents: list[ModelTuple]
    ) -> None:
        # ``kept``: how many idle tuples stay cached; 0 forgets each at once, so tickets
        # outlive their tuple's bookkeeping (a lend that ends, a settle after the exit).
        self.kept = _table.IDLE_KEPT
        _set_idle_kept(kept)
        self.clock = Clock()
        self.s = Scheduler(limit, fresh_reacquire=fresh, max_queued=max_queued, clock=self.clock)
        self.m = Model(limit, fresh=fresh, max_queued=max_queued)
        self.parkers: dict[int, FakeParker] = {}
        if self.AGENTS:
            self.m.limit = limit + len(agents)
            self.s.set_limit(self.m.limit)
            for t in TUPLES:
                self.set_tuple_limit(t, 1)
            for t in agents:
                self.enqueue(t, None, True, False)

    def teardown(self) -> None:
        kept = getattr(self, "kept", None)
        if kept is not None:
            _set_idle_kept(kept)

    # -- helpers ----------------------------------------------------------------------------------

    def _pick(self, index: int, wanted: tuple[int, ...], request: bool | None = None) -> Ref | None:
        refs = [
            r
            for r in self.m.refs
            if r.state in wanted and (request is None or r.request == request)
        ]
        return refs[index % len(refs)] if refs else None

    def _park(self, ref: Ref) -> None:
        if ref.ticket.state in (INACTIVE, QUEUED) and ref.ticket.parker is None:
            parker = FakeParker()
            self.parkers[id(ref)] = parker
            ref.ticket.parker = parker

    def _would_run_permit(self, t: ModelTuple) -> bool:
        return self.m.active < self.m.limit and self.m.admits(t)

    # -- taking places ----------------------------------------------------------------------------

    @rule(
        t=st.sampled_from(TUPLES),
        explicit=st.none() | st.integers(1, 30),
        active=st.booleans(),
        reject=st.booleans(),
    )
    def enqueue(self, t: ModelTuple, explicit: int | None, active: bool, reject: bool) -> None:
        m = self.m
        if reject and not m.is_open(t):
            with pytest.raises(TupleSuspendedError):
                self.s.enqueue(t, explicit, active, reject)
            return
        runs = active and self._would_run_permit(t)
        if m.max_queued is not None and m.queued >= m.max_queued and not runs:
            with pytest.raises(CoordinatorBusyError):
                self.s.enqueue(t, explicit, active, reject)
            return
        order = m.next_order(explicit)
        at_once = self.s.runs_at_once(t)  # the shell's hint: when it says so, it is so
        ticket = self.s.enqueue(t, explicit, active, reject)
        if at_once and active:
            assert ticket.state == GRANTED
        ref = m.new_ref(ticket, t, order, reject)
        if active:
            ref.state = QUEUED
            m.settle()
        self._park(ref)

    @rule(
        t=st.sampled_from(TUPLES),
        explicit=st.none() | st.integers(1, 30),
        reject=st.booleans(),
        tokens=st.integers(0, 40),
        cover=st.none() | st.integers(0, 1000),
    )
    def enqueue_request(
        self, t: ModelTuple, explicit: int | None, reject: bool, tokens: int, cover: int | None
    ) -> None:
        m = self.m
        if reject and not m.is_open(t):
            with pytest.raises(TupleSuspendedError):
                self.s.enqueue_request(t, explicit, reject, tokens, None)
            return
        cover_ref = None
        if cover is not None:
            cover_ref = self._pick(cover, (GRANTED, LENT, QUEUED, DONE), request=False)
            if cover_ref is not None and cover_ref.state == QUEUED and not cover_ref.bypass:
                cover_ref = None  # a permit still waiting for its slot is nobody's cover
        live_cover = cover_ref if cover_ref is not None and cover_ref.state != DONE else None
        covered = (
            live_cover is not None and live_cover.state == GRANTED and (live_cover.covering is None)
        )
        if (
            m.max_queued is not None
            and m.queued >= m.max_queued
            and not covered  # a request its permit covers is never refused
            and not self._request_would_run(t, explicit, tokens)
        ):
            with pytest.raises(CoordinatorBusyError):
                self.s.enqueue_request(
                    t, explicit, reject, tokens, None if cover_ref is None else permit(cover_ref)
                )
            return
        order = m.next_order(explicit)
        ticket = self.s.enqueue_request(
            t, explicit, reject, tokens, None if cover_ref is None else permit(cover_ref)
        )
        ref = m.new_ref(ticket, t, order, reject)
        ref.request = True
        ref.tokens = tokens
        ref.state = QUEUED
        if live_cover is not None:
            ref.cover = live_cover
            if covered:
                m.reserve(live_cover, ref)
            else:
                ref.candidate = True
        m.settle()
        self._park(ref)

    def _request_would_run(self, t: ModelTuple, explicit: int | None, tokens: int) -> bool:
        m = self.m
        if not (m.active < m.limit and m.admits(t) and not m.calls_full(t)):
            return False
        if not m.budgeted(t):
            return True
        key = (explicit if explicit is not None else m.counter + 1, m.seq + 1)
        block = m.blocks.get(t)
        if block is not None and key > block[0].key:
            return False
        probe = Ref(None, t, key[0], key[1], QUEUED, False, request=True, tokens=tokens)  # type: ignore[arg-type]
        return m.ready_at(probe) == m.now

    @rule(index=st.integers(0, 1000))
    def activate(self, index: int) -> None:
        r = self._pick(index, (INACTIVE,))
        if r is None:
            return
        r.state = QUEUED
        self.m.settle()
        self.s.activate(r.ticket)

    @rule(index=st.integers(0, 1000), fail=st.booleans())
    def cancel_queued(self, index: int, fail: bool) -> None:
        r = self._pick(index, (INACTIVE, QUEUED))
        if r is None:
            return
        self.m.discard(r)
        self.m.settle()
        error = RuntimeError("cancelled")
        if fail:
            self.s.fail(r.ticket, error)
            parker = self.parkers.get(id(r))
            if parker is not None and not parker.granted:
                assert parker.failed == [error]
        else:
            r.ticket.parker = None
            self.s.discard(r.ticket)

    # -- leaving and lending ----------------------------------------------------------------------

    @rule(index=st.integers(0, 1000))
    def release(self, index: int) -> None:
        m = self.m
        r = self._pick(index, (GRANTED, LENT))
        if r is None:
            return
        if r.request:
            m.end_request(r)
        else:
            was = r.state
            r.state = DONE
            if was == GRANTED and m.give_up_cover(r):
                r.deferred = True
            for other in m.refs:
                if other.candidate and other.cover is r:
                    other.candidate = False
        m.settle()
        self.s.release(r.ticket)

    @rule(index=st.integers(0, 1000))
    def lend_begin(self, index: int) -> None:
        m = self.m
        r = self._pick(index, (GRANTED, LENT, QUEUED), request=False)
        if r is None or (r.state == QUEUED and not r.bypass):
            return
        if r.state == GRANTED:
            r.state = LENT
            if m.give_up_cover(r):
                r.deferred = True
        elif r.state == QUEUED:
            r.state, r.bypass = LENT, False
        r.lends += 1
        m.settle()
        withdrawn = self.s.lend_begin(permit(r))
        if withdrawn is not None:
            withdrawn.grant(False)

    @rule(index=st.integers(0, 1000))
    def lend_end(self, index: int) -> None:
        m = self.m
        candidates = [r for r in m.refs if not r.request and r.lends > 0]
        if not candidates:
            return
        r = candidates[index % len(candidates)]
        r.lends -= 1
        expect = False
        if not r.lends and r.state == LENT:
            if r.deferred:
                r.deferred = False
                r.state = GRANTED
            else:
                expect = True
                order = m.next_order(None) if m.fresh else r.origin
                m.seq += 1
                r.order, r.seq, r.state, r.bypass, r.reject = order, m.seq, QUEUED, True, False
        m.settle()
        parker = FakeParker()
        assert self.s.lend_end(permit(r), parker) == expect
        if expect:
            self.parkers[id(r)] = parker
            if r.state == GRANTED:
                assert parker.granted == [True]

    # -- settings ---------------------------------------------------------------------------------

    @rule(limit=st.integers(1, 4))
    def set_limit(self, limit: int) -> None:
        self.m.limit = limit
        self.m.settle()
        self.s.set_limit(limit)

    @rule(t=st.sampled_from(TUPLES), limit=st.none() | st.integers(1, 3))
    def set_tuple_limit(self, t: ModelTuple, limit: int | None) -> None:
        if limit is None:
            self.m.caps.pop(t, None)
        else:
            self.m.caps[t] = limit
        self.m.settle()
        self.s.set_tuple_limit(t, limit)

    @rule(t=st.sampled_from(TUPLES), after=st.none() | st.floats(0, 20))
    def close(self, t: ModelTuple, after: float | None) -> None:
        m = self.m
        at = None if after is None else m.now + after
        if t not in m.closed:
            m.closed[t] = at
        elif at is None:
            m.closed[t] = None
        elif m.closed[t] is not None and at > m.closed[t]:  # type: ignore[operator]
            m.closed[t] = at
        failed = [
            r
            for r in m.refs
            if r.t == t and r.reject and r.state in (INACTIVE, QUEUED) and not r.bypass
        ]
        for r in sorted(failed, key=lambda r: r.key):
            m.discard(r)
        m.blocks.pop(t, None)  # nothing of t draws while it is closed
        m.settle()
        self.s.close(t, at)
        for r in failed:
            assert isinstance(r.ticket.error or self.parkers[id(r)].failed[0], TupleSuspendedError)

    @rule(t=st.sampled_from(TUPLES))
    def open(self, t: ModelTuple) -> None:
        self.m.closed.pop(t, None)
        self.m.settle()
        self.s.open(t)

    def _budget_moved(self, t: ModelTuple) -> None:
        self.m.blocks.pop(t, None)
        self.m.settle()

    @rule(
        t=st.sampled_from(TUPLES),
        requests=st.none() | st.floats(1, 120),
        tokens=st.none() | st.floats(10, 600),
    )
    def set_budget(self, t: ModelTuple, requests: float | None, tokens: float | None) -> None:
        m = self.m
        budget = m.budgets.setdefault(t, Budget())
        budget.requests = _resized(budget.requests, requests, m.now)
        budget.tokens = _resized(budget.tokens, tokens, m.now)
        budget.explicit = (1 if requests is not None else 0) | (2 if tokens is not None else 0)
        self._budget_moved(t)
        self.s.set_budget(t, requests, tokens)

    @rule(
        t=st.sampled_from(TUPLES),
        requests=st.none() | st.floats(1, 120),
        tokens=st.none() | st.floats(10, 600),
        left_requests=st.none() | st.floats(0, 100),
        left_tokens=st.none() | st.floats(0, 500),
    )
    def learn_budget(
        self,
        t: ModelTuple,
        requests: float | None,
        tokens: float | None,
        left_requests: float | None,
        left_tokens: float | None,
    ) -> None:
        m = self.m
        budget = m.budgets.setdefault(t, Budget())
        if requests is not None and not budget.explicit & 1:
            budget.requests = _rerated(budget.requests, requests, m.now)
        if tokens is not None and not budget.explicit & 2:
            budget.tokens = _rerated(budget.tokens, tokens, m.now)
        if left_requests is not None and budget.requests is not None:
            budget.requests.lower_to(left_requests, m.now)
        if left_tokens is not None and budget.tokens is not None:
            budget.tokens.lower_to(left_tokens, m.now)
        self._budget_moved(t)
        self.s.learn_budget(t, requests, tokens, left_requests, left_tokens)

    @rule(index=st.integers(0, 1000), tokens=st.integers(0, 60))
    def settle(self, index: int, tokens: int) -> None:
        m = self.m
        r = self._pick(index, (GRANTED, DONE), request=True)
        if r is None:
            return
        change = tokens - r.tokens
        r.tokens = tokens
        budget = m.budgets.get(r.t)
        if change and budget is not None and budget.tokens is not None:
            budget.tokens.adjust(change, m.now)
            self._budget_moved(r.t)
        self.s.settle(cast(RequestTicket, r.ticket), tokens)

    @rule(index=st.integers(0, 1000))
    def refund(self, index: int) -> None:
        # A granted request cancelled before it resumed: what it drew goes back, then its
        # slot (the shell's order: refund, then release).
        m = self.m
        r = self._pick(index, (GRANTED,), request=True)
        if r is None:
            return
        budget = m.budgets.get(r.t)
        if m.budgeted(r.t):
            assert budget is not None
            if budget.requests is not None:
                budget.requests.adjust(-1, m.now)
            if budget.tokens is not None and r.tokens:
                budget.tokens.adjust(-r.tokens, m.now)
            self._budget_moved(r.t)
        self.s.refund(cast(RequestTicket, r.ticket))
        m.end_request(r)
        m.settle()
        self.s.release(r.ticket)

    @rule(explicit=st.none() | st.integers(1, 40))
    def next_order(self, explicit: int | None) -> None:
        # next_acceptance_order(), or an explicit order seen by a call that was refused.
        if explicit is None:
            assert self.s.next_order() == self.m.next_order(None)

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 3.0, 10.0]))
    def tick(self, dt: float) -> None:
        # Time passes before the timer fires (a busy loop): what is due waits for advance(),
        # but a request whose budget now holds it may be granted by any other event.
        self.m.now += dt
        self.clock.now = self.m.now

    @rule(delta=st.sampled_from([-1000.0, 12.5, 1e6]))
    def shift_time(self, delta: float) -> None:
        # The coordinator moved to another event loop, whose clock reads ``delta`` ahead.
        m = self.m
        m.now += delta
        self.clock.now = m.now
        m.closed = {t: None if at is None else at + delta for t, at in m.closed.items()}
        m.blocks = {t: (front, until + delta) for t, (front, until) in m.blocks.items()}
        for budget in m.budgets.values():
            for bucket in (budget.requests, budget.tokens):
                if bucket is not None:
                    bucket.shift(delta)
        self.s.shift_time(delta)

    @rule(dt=st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0, 10.0]), to_wakeup=st.booleans())
    def advance(self, dt: float, to_wakeup: bool) -> None:
        m = self.m
        # The two compute an instant at possibly different moments, so they may differ in
        # the last bits; going to the later of the two makes both due.
        wakeups = [w for w in (m.next_wakeup(), peek_wakeup(self.s)) if w is not None]
        wakeup = max(wakeups, default=None)
        m.now = wakeup if to_wakeup and wakeup is not None and wakeup > m.now else m.now + dt
        self.clock.now = m.now
        due = m.wake_due()
        if due:
            m.settle()
        assert self.s.advance() == due

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def reads_change_nothing(self) -> None:
        s, m = self.s, self.m
        before = _fingerprint(s)
        s.check_invariants()
        peek_wakeup(s)
        for t in TUPLES:
            state = s.tuple_state(t)
            stats = None if state is None else tuple_snapshot(state, m.now, 0.0)
            budget = m.budgets.get(t)
            for seen, model in (
                (
                    None if stats is None else stats.requests_available,
                    None if budget is None else budget.requests,
                ),
                (
                    None if stats is None else stats.tokens_available,
                    None if budget is None else budget.tokens,
                ),
            ):
                assert seen == (None if model is None else model.available(m.now)), t
        assert _fingerprint(s) == before

    @invariant()
    def matches_the_model(self) -> None:
        s, m = self.s, self.m
        s.check_invariants()
        for r in m.refs:
            ticket = r.ticket
            assert ticket.state == r.state, (r, ticket)
            assert ticket.covered == r.covered, (r, ticket)
            assert ticket.bypass == r.bypass, (r, ticket)
            assert ticket.parked == r.parked, (r, ticket)
            if r.state == QUEUED:
                assert (ticket.order, ticket.seq) == r.key, (r, ticket)
            parker = self.parkers.get(id(r))
            if parker is not None and r.state == GRANTED and not r.bypass:
                assert parker.granted in ([True], [False]), (r, parker)
        assert (s.active, s.queued, s.lent) == (m.active, m.queued, m.lent)
        assert _close(peek_wakeup(s), m.next_wakeup())  # a pure read, unlike next_wakeup()
        for t in TUPLES:
            state = s.tuple_state(t)
            if state is None:
                assert m.slots_on(t) == 0
                assert not any(r.t == t and r.state in (INACTIVE, QUEUED) for r in m.refs)
                assert m.is_open(t)
                assert t not in m.caps
                continue
            assert state.active == m.slots_on(t)
            assert state.calls == m.calls_on(t)
            assert state.open == m.is_open(t)
            assert state.reopens_at == m.closed.get(t)
            assert state.limit == m.caps.get(t)
            block = m.blocks.get(t)
            assert (state.block is None) == (block is None), (t, state.block, block)
            if block is not None:
                assert state.block is block[0].ticket
                assert _close(state.block_until, block[1])
            budget = m.budgets.get(t)
            for real, model in (
                (state.request_bucket, None if budget is None else budget.requests),
                (state.token_bucket, None if budget is None else budget.tokens),
            ):
                assert (real is None) == (model is None)
                if real is not None and model is not None:
                    assert real.available(m.now) == model.available(m.now)

    @invariant()
    def requests_in_flight_never_outnumber_slots(self) -> None:
        in_flight = [r for r in self.m.refs if r.request and r.state == GRANTED]
        own = [r for r in in_flight if not r.covered]
        covers = [r.cover for r in in_flight if r.covered]
        assert len(covers) == len({id(c) for c in covers})  # one request per permit
        for cover in covers:
            assert cover is not None
            assert cover.state == GRANTED or cover.deferred  # its slot is taken
        assert len(own) + len(covers) <= self.s.active

    @invariant()
    def a_free_permit_leaves_no_request_waiting_for_it(self) -> None:
        for p in self.m.refs:
            if p.request or p.state != GRANTED or p.covering is not None:
                continue
            assert not any(
                r.candidate and r.cover is p and r.state == QUEUED for r in self.m.refs
            ), p

    @invariant()
    def calls_never_exceed_a_cap(self) -> None:
        # §5/§9: no request is granted on a tuple whose calls in flight are at its cap,
        # whatever the reacquires (which may take a tuple's slots past it) and budgets did.
        # A cap lowered below the calls in flight revokes nothing: then they only drop.
        calls = {t: self.m.calls_on(t) for t in TUPLES}
        before = getattr(self, "calls_before", {})
        for t, now in calls.items():
            cap = self.m.caps.get(t)
            if cap is not None and now > cap:
                assert now <= before.get(t, 0), (t, now, cap)
        self.calls_before = calls

    @invariant()
    def no_cycle_of_waiters(self) -> None:
        # Issue 17's liveness invariant: where no timer is pending and no gate is closed,
        # either nothing waits or something can move (a granted body that can end, a lend
        # that can end, a reservation to activate): no cycle of waiters holding what the
        # others need.
        s, tickets = self.s, [r.ticket for r in self.m.refs]
        if peek_wakeup(s) is not None or any(not st.open for st in s.tuples.states.values()):
            return
        waiting = [t for t in tickets if t.state == QUEUED]
        movable = any(
            t.state in (INACTIVE, LENT) or (t.state == GRANTED and not _holder_waits(t, tickets))
            for t in tickets
        )
        assert not waiting or movable, f"deadlock: {waiting} wait for each other"

    @invariant()
    def every_waiter_is_eventually_granted(self) -> None:
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps % self.LIVENESS == 0:
            check_liveness(self.s, [r.ticket for r in self.m.refs])


def check_liveness(scheduler: Scheduler, tickets: list[Ticket]) -> None:
    """§9's liveness, on a copy: if every closed gate opens, every budget refills, every
    lend ends and every body that is granted ends, then every waiter is granted.

    A granted permit's body ends unless its holder waits for a request the permit would
    cover (it is that request's cover or the cover it is a candidate of). Inactive
    reservations are activated (their holders run them); time jumps to the next wake-up
    only when nothing else can move.
    """
    if not any(t.state in (INACTIVE, QUEUED) for t in tickets):
        return
    s, tickets = copy.deepcopy((scheduler, tickets))
    clock = s._clock
    assert isinstance(clock, Clock)
    for _ in range(10 * len(tickets) + 50):
        for state in list(s.tuples.states.values()):
            if not state.open and state.reopens_at is None:
                s.open(state.tuple)  # a gate without a timer is opened by someone
        waiting = [t for t in tickets if t.state in (INACTIVE, QUEUED)]
        if not waiting:
            return
        moved = False
        for ticket in tickets:
            if ticket.state == INACTIVE:
                s.activate(ticket)
                moved = True
            elif ticket.state == GRANTED and not _holder_waits(ticket, tickets):
                s.release(ticket)
                moved = True
            elif ticket.state == LENT:
                while ticket.lends:
                    s.lend_end(cast(PermitTicket, ticket), FakeParker())
                moved = True
        if not moved:
            instant = s.next_wakeup()
            assert instant is not None, f"deadlock: {waiting} wait for each other"
            clock.now = max(clock.now, instant)
            assert s.advance()
    raise AssertionError(f"no end: {[t for t in tickets if t.state in (INACTIVE, QUEUED)]}")


def _holder_waits(ticket: Ticket, tickets: list[Ticket]) -> bool:
    """Whether a granted permit's holder waits for a request it would cover."""
    return not ticket.request and any(
        t.request and t.state == QUEUED and t.cover is ticket for t in tickets
    )


def _set_idle_kept(kept: int) -> None:
    # The tuple table and the checker read the module constant at call time.
    for module in (_table, _checks):
        module.__dict__["IDLE_KEPT"] = kept


def _fingerprint(s: Scheduler) -> object:
    """What a read must leave as it is: counts, heaps, lines, blocks, buckets."""
    lines = [
        (len(line.items), line.dead, line.entry)
        for state in s.tuples.states.values()
        for line in (state.permits, state.requests, state.covered)
    ]
    buckets = [
        (b.level, b.stamp, b.capacity)
        for state in s.tuples.states.values()
        for b in (state.request_bucket, state.token_bucket)
        if b is not None
    ]
    blocks = [(state.block, state.block_until) for state in s.tuples.states.values()]
    return (
        s.version,
        s._counter,
        s._seq,
        list(s._ready),
        list(s._bypass),
        list(s.wakeups),
        list(s.tuples.states),
        list(s.tuples.idle),
        lines,
        buckets,
        blocks,
    )


def permit(ref: Ref) -> PermitTicket:
    assert isinstance(ref.ticket, PermitTicket)
    return ref.ticket


def _close(a: float | None, b: float | None) -> bool:
    # An instant computed at a different moment may differ in its last bits.
    return a == b or (a is not None and b is not None and abs(a - b) <= 1e-9 * max(1, abs(a)))


def _rerated(bucket: Bucket | None, per_minute: float, now: float) -> Bucket:
    # A learned rate keeps what is available (the model's own arithmetic, on purpose
    # written apart from Bucket.rerate).
    if bucket is None:
        return Bucket(per_minute, now)
    available = bucket.available(now)
    bucket.stamp = now
    bucket.level = min(per_minute, available)
    bucket.capacity = per_minute
    bucket.rate = per_minute / 60
    return bucket


def _resized(bucket: Bucket | None, per_minute: float | None, now: float) -> Bucket | None:
    if per_minute is None:
        return None
    if bucket is None:
        return Bucket(per_minute, now)
    bucket.resize(per_minute, now)
    return bucket


SchedulerMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("SCHEDULER_EXAMPLES", "400")),
    stateful_step_count=60,
    deadline=None,
)
# Seconds on an idle machine, minutes on a shared one: the generous timeout is for that.
test_scheduler_matches_the_model = pytest.mark.timeout(900)(
    pytest.mark.slow(SchedulerMachine.TestCase)
)


class AgentsMachine(SchedulerMachine):
    """The shape of issue 17's deadlock: caps of 1, agents each holding a permit on one
    tuple and requesting others (and their own), among every other step."""

    AGENTS = True
    LIVENESS = 1


AgentsMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("SCHEDULER_EXAMPLES", "400")) // 4,
    stateful_step_count=60,
    deadline=None,
)
test_agents_sharing_capped_tuples_never_deadlock = pytest.mark.timeout(900)(
    pytest.mark.slow(AgentsMachine.TestCase)
)

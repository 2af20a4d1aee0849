"""_agents/waiting: who waits, since when and why — and taking the snapshot changes nothing."""

from __future__ import annotations

from typing import Any

from lovely_coordinator import ModelTuple
from lovely_coordinator._agents.scheduler import Scheduler
from lovely_coordinator._agents.tickets import GRANTED, QUEUED
from lovely_coordinator._agents.waiting import PER_TUPLE, WaiterStatistics, waiters

A = ModelTuple("p", "a")
B = ModelTuple("p", "b")
C = ModelTuple("q", "c")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Parker:
    def grant(self, value: bool) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass


def fingerprint(s: Scheduler) -> Any:
    """Everything a snapshot could disturb, as plain data (lines, heaps, buckets, counts)."""
    tuples = {}
    for t, state in s.tuples.states.items():
        lines = [
            (list(line.items), line.dead, line.fifo, line.entry)
            for line in (state.permits, state.requests, state.covered)
        ]
        buckets = [
            None if b is None else (b.level, b.stamp, b.capacity)
            for b in (state.request_bucket, state.token_bucket)
        ]
        tuples[t] = (
            lines,
            buckets,
            dict(state.inactive or {}),
            (state.active, state.queued, state.lent, state.calls, state.open),
            (state.block, state.block_until, state.reopens_at, state.limit),
        )
    return (
        tuples,
        list(s._ready),
        list(s._bypass),
        list(s.wakeups),
        dict(s.tuples.idle),
        (s.active, s.queued, s.lent, s.version, s._counter, s._seq, s._bypass_dead),
    )


def snapshot(s: Scheduler, clock: Clock, monotonic_now: float = 1e9) -> list[WaiterStatistics]:
    before = fingerprint(s)
    found = waiters(s, clock.now, monotonic_now)
    assert fingerprint(s) == before  # a pure read
    s.check_invariants()
    return found


def reasons(found: list[WaiterStatistics]) -> list[tuple[ModelTuple, int, str, str]]:
    return [(w.tuple, w.acceptance_order, w.reason, w.kind) for w in found]


def test_every_reason_and_kind() -> None:
    clock = Clock()
    s = Scheduler(2, {C: 1}, clock=clock)
    held = s.enqueue(C, None, True, False)  # 1: C is at its cap now
    assert held.state == GRANTED
    capped = s.enqueue(C, None, True, False)  # 2
    s.close(B, None)
    gated = s.enqueue(B, None, True, False)  # 3
    s.set_budget(A, 1, None)
    first = s.enqueue_request(A, None, False, 0, None)  # 4: draws the one request
    assert first.state == GRANTED  # both slots are taken now
    budgeted = s.enqueue_request(A, None, False, 0, None)  # 5
    s.enqueue(A, None, False, False)  # 6: an inactive reservation
    waiting = s.enqueue(A, None, True, False)  # 7: no slot
    assert {capped.state, gated.state, budgeted.state, waiting.state} == {QUEUED}
    assert reasons(snapshot(s, clock)) == [
        (A, 5, "budget", "request"),
        (A, 6, "inactive", "reservation"),
        (A, 7, "capacity", "permit"),
        (B, 3, "gate", "permit"),
        (C, 2, "tuple_limit", "permit"),
    ]
    # A timed closure whose instant passed reads open (as statistics() has it).
    s.open(B)
    s.close(B, clock.now + 5)
    clock.now += 6
    assert ("gate" in [w.reason for w in snapshot(s, clock) if w.tuple == B]) is False


def test_a_reacquire_waits_for_capacity() -> None:
    s = Scheduler(1)
    lender = s.enqueue(A, None, True, False)
    s.lend_begin(lender)
    other = s.enqueue(B, None, True, False)
    assert other.state == GRANTED
    assert s.lend_end(lender, Parker())
    assert reasons(snapshot(s, Clock())) == [(A, 3, "capacity", "reacquire")]


def test_a_covered_request_waits_for_its_own_tuples_cap() -> None:
    s = Scheduler(2, {B: 1})
    cover = s.enqueue(A, None, True, False)
    on_b = s.enqueue_request(B, None, False, 0, None)  # B's calls at its cap
    assert on_b.state == GRANTED
    covered = s.enqueue_request(B, None, False, 0, cover)
    assert covered.covered
    assert covered.state == QUEUED
    assert reasons(snapshot(s, Clock())) == [(B, 3, "tuple_limit", "request")]


def test_waited_seconds_come_from_each_tickets_enqueue_time() -> None:
    s = Scheduler(1)
    s.enqueue(A, None, True, False)
    early = s.enqueue(A, None, True, False)
    late = s.enqueue(A, None, True, False)
    assert early.since is not None
    assert late.since is not None
    now = late.since + 2.0
    found = snapshot(s, Clock(), now)
    assert [w.waited for w in found] == [now - early.since, 2.0]


def test_the_first_per_tuple_waiters_in_order_and_dead_entries_are_skipped() -> None:
    s = Scheduler(1)
    s.enqueue(A, None, True, False)
    queued = [s.enqueue(A, None, True, False) for _ in range(PER_TUPLE + 50)]
    for ticket in queued[:10]:
        s.discard(ticket)  # dead entries at the front, left in place
    found = snapshot(s, Clock())
    assert [w.acceptance_order for w in found] == [t.order for t in queued[10 : 10 + PER_TUPLE]]
    # Out of order (explicit orders): the line is a heap now; the smallest orders first.
    s.enqueue(A, 1, True, False)
    s.enqueue(A, 2, False, False)  # an inactive reservation with an early order
    found = snapshot(s, Clock())
    assert [w.acceptance_order for w in found[:3]] == [1, 2, queued[10].order]
    assert len(found) == PER_TUPLE
    assert len(snapshot_bounded(s, 5)) == 5


def snapshot_bounded(s: Scheduler, per_tuple: int) -> list[WaiterStatistics]:
    before = fingerprint(s)
    found = waiters(s, 0.0, 1e9, per_tuple)
    assert fingerprint(s) == before
    return found


def test_nobody_waits() -> None:
    s = Scheduler(2)
    s.enqueue(A, None, True, False)
    s.close(B, None)
    s.set_tuple_limit(C, 1)
    assert snapshot(s, Clock()) == []


def test_budget_reasons_without_a_block_and_on_a_cover() -> None:
    clock = Clock()
    s = Scheduler(1, clock=clock)
    s.set_budget(A, None, 100)
    first = s.enqueue_request(A, None, False, 100, None)  # takes the slot and every token
    assert first.state == GRANTED
    # It waits for the slot, so the budget never blocked it; yet it could not draw now.
    short = s.enqueue_request(A, None, False, 50, None)
    assert s.tuples.states[A].block is None
    assert reasons(snapshot(s, clock)) == [(A, 2, "budget", "request")]
    s.discard(short)
    s.set_budget(B, 1, None)
    s.release(first)
    cover = s.enqueue(B, None, True, False)
    drawn = s.enqueue_request(B, None, False, 0, cover)  # on its permit: the one request
    assert drawn.state == GRANTED
    s.release(drawn)
    covered = s.enqueue_request(B, None, False, 0, cover)
    assert covered.covered
    assert reasons(snapshot(s, clock)) == [(B, covered.accepted, "budget", "request")]

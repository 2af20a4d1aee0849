"""The pure scheduler: unit tests, plus a state machine checked against a brute-force model.

Everything here is synchronous: the scheduler never awaits, so its fairness rules can be
checked step by step. ``check_invariants()`` runs after every step of the state machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from lovely_coordinator import ModelTuple, TupleSuspendedError
from lovely_coordinator._scheduler import (
    DONE,
    GRANTED,
    INACTIVE,
    LENT,
    QUEUED,
    SUSPENDED_MESSAGE,
    Scheduler,
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


def enqueue(s: Scheduler, t: ModelTuple = A, order: int | None = None, **kw: bool) -> Ticket:
    kw.setdefault("active", True)
    kw.setdefault("reject", False)
    ticket = s.enqueue(t, s.next_order() if order is None else order, **kw)
    s.check_invariants()
    return ticket


def states(*tickets: Ticket) -> list[int]:
    return [t.state for t in tickets]


# -- unit tests -----------------------------------------------------------------------------------


def test_grants_up_to_the_limit_then_queues() -> None:
    s = Scheduler(2)
    a, b, c = (enqueue(s) for _ in range(3))
    assert states(a, b, c) == [GRANTED, GRANTED, QUEUED]
    assert (s.active, s.queued) == (2, 1)
    s.release(a)
    assert states(a, c) == [DONE, GRANTED]  # handed over inside release()
    assert (s.active, s.queued) == (2, 0)
    s.check_invariants()


def test_acceptance_order_then_arrival() -> None:
    s = Scheduler(1)
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
    s = Scheduler(1)
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
    s = Scheduler(1)
    holder = enqueue(s, A)
    s.close(A, None)
    gated = enqueue(s, A)
    other = enqueue(s, B)
    later = enqueue(s, A)
    s.release(holder)
    assert states(gated, other, later) == [QUEUED, GRANTED, QUEUED]
    s.open(A)
    assert gated.state == QUEUED  # no capacity yet
    s.release(other)
    assert states(gated, later) == [GRANTED, QUEUED]  # gated kept its place ahead of later
    s.check_invariants()


def test_reject_fails_at_once_or_when_the_gate_closes() -> None:
    s = Scheduler(1)
    holder = enqueue(s)
    fg = enqueue(s, reject=True)
    inactive_fg = enqueue(s, active=False, reject=True)
    bg = enqueue(s)
    s.close(A, None)
    assert states(fg, inactive_fg, bg) == [DONE, DONE, QUEUED]
    assert isinstance(fg.error, TupleSuspendedError)
    assert holder.state == GRANTED  # running work is untouched
    with pytest.raises(TupleSuspendedError):
        s.enqueue(A, s.next_order(), active=True, reject=True)
    with pytest.raises(TupleSuspendedError):
        s.enqueue(A, None, True, True)  # refused before an order is drawn
    assert s.next_order() == 6
    assert s.queued == 1
    s.check_invariants()


def test_tuple_cap_skips_without_blocking_others() -> None:
    s = Scheduler(3, {A: 1})
    a1 = enqueue(s, A)
    a2 = enqueue(s, A)
    b1 = enqueue(s, B)
    assert states(a1, a2, b1) == [GRANTED, QUEUED, GRANTED]
    s.set_tuple_limit(A, 2)
    assert a2.state == GRANTED
    s.set_tuple_limit(A, 1)  # lowering revokes nothing
    assert s.active == 3
    a3 = enqueue(s, A)
    s.release(a1)
    assert a3.state == QUEUED  # still 1 active on A: at its cap
    s.release(a2)
    assert a3.state == GRANTED
    s.check_invariants()


def test_set_limit_grows_in_order_and_never_revokes() -> None:
    s = Scheduler(1)
    tickets = [enqueue(s) for _ in range(4)]
    s.set_limit(3)
    assert states(*tickets) == [GRANTED, GRANTED, GRANTED, QUEUED]
    s.set_limit(1)
    assert s.active == 3
    s.release(tickets[0])
    s.release(tickets[1])
    assert tickets[3].state == QUEUED
    s.release(tickets[2])
    assert tickets[3].state == GRANTED
    s.check_invariants()


def test_inactive_reservation_is_skipped_until_activated() -> None:
    s = Scheduler(1)
    holder = enqueue(s)
    reservation = enqueue(s, active=False)
    later = enqueue(s)
    s.release(holder)
    assert states(reservation, later) == [INACTIVE, GRANTED]
    s.activate(reservation)
    assert reservation.state == QUEUED
    s.release(later)
    assert reservation.state == GRANTED
    s.activate(reservation)  # no-op once not inactive
    assert s.queued == 0
    s.check_invariants()


def test_lend_and_reacquire_bypass_gates_and_caps() -> None:
    s = Scheduler(1, {A: 1})
    permit = enqueue(s)
    s.lend(permit)
    assert (permit.state, s.active, s.lent) == (LENT, 0, 1)
    other = enqueue(s)
    assert other.state == GRANTED
    s.close(A, None)
    s.reacquire(permit, s.next_order())
    assert (permit.state, s.queued, s.lent) == (QUEUED, 1, 1)
    s.release(other)
    assert (permit.state, s.active, s.lent) == (GRANTED, 1, 0)
    s.check_invariants()


def test_reacquire_competes_by_order_with_other_waiters() -> None:
    s = Scheduler(1)
    permit = enqueue(s)  # order 1
    s.lend(permit)
    blocker = enqueue(s)  # order 2, takes the slot
    waiter = enqueue(s)  # order 3
    s.reacquire(permit, permit.order)  # "original": order 1 goes first
    s.release(blocker)
    assert states(permit, waiter) == [GRANTED, QUEUED]
    s.lend(permit)
    assert waiter.state == GRANTED
    s.reacquire(permit, s.next_order())  # "fresh": behind the waiter
    s.release(waiter)
    assert permit.state == GRANTED
    s.check_invariants()


def test_withdraw_and_failed_reacquire_end_the_lend() -> None:
    s = Scheduler(1)
    permit = enqueue(s)
    s.lend(permit)
    blocker = enqueue(s)
    s.reacquire(permit, s.next_order())
    s.withdraw(permit)
    assert (permit.state, s.queued, s.lent) == (LENT, 0, 1)
    s.reacquire(permit, s.next_order())
    s.fail(permit, RuntimeError("released"))
    assert (permit.state, s.queued, s.lent) == (DONE, 0, 0)
    assert isinstance(permit.error, RuntimeError)
    s.release(blocker)
    s.check_invariants()
    assert list(s.tuple_states()) == []


def test_release_of_a_lent_ticket_ends_the_lend() -> None:
    s = Scheduler(1)
    permit = enqueue(s)
    s.lend(permit)
    s.release(permit)
    assert (permit.state, s.lent, s.active) == (DONE, 0, 0)
    s.check_invariants()


def test_close_never_shortens_a_closure() -> None:
    s = Scheduler(1)
    s.close(A, 10.0)
    assert reopens_at(s, A) == 10.0
    s.close(A, 5.0)
    assert reopens_at(s, A) == 10.0
    s.close(A, 20.0)
    assert reopens_at(s, A) == 20.0
    s.close(A, None)
    assert reopens_at(s, A) is None
    assert not s.is_open(A)
    s.close(A, 30.0)  # would shorten an indefinite closure
    assert reopens_at(s, A) is None
    s.open(A)
    assert s.tuple_state(A) is None  # idle again
    s.open(A)  # fine on an open tuple
    assert s.is_open(A)


def test_retime_restates_a_timed_closure_either_way() -> None:
    s = Scheduler(1)
    waiter = enqueue(s, A)  # granted
    queued = enqueue(s, A)
    s.close(A, 100.0)
    s.retime(A, 3.0)  # the same instant on another loop's clock may be a smaller number
    assert reopens_at(s, A) == 3.0
    s.retime(A, 7.0)
    assert reopens_at(s, A) == 7.0
    s.release(waiter)
    assert queued.state == QUEUED  # still closed: nothing granted
    s.open(A)
    assert queued.state == GRANTED


def reopens_at(s: Scheduler, t: ModelTuple) -> float | None:
    state = s.tuple_state(t)
    assert state is not None
    return state.reopens_at


def parker_of(ticket: Ticket) -> object:
    return ticket.parker


def test_idle_tuples_are_forgotten() -> None:
    s = Scheduler(2)
    tickets = [enqueue(s, ModelTuple("p", f"m{i}")) for i in range(500)]
    for t in tickets:
        if t.state == GRANTED:
            s.release(t)
        else:
            s.discard(t)
        s.check_invariants()
    assert list(s.tuple_states()) == []
    assert len(s._tuples) <= 64  # a few recently idle ones are kept for reuse
    s.set_tuple_limit(A, 2)
    assert s.tuple_state(A) is not None
    s.set_tuple_limit(A, None)
    assert s.tuple_state(A) is None


def test_cancelled_waiters_do_not_accumulate() -> None:
    """Lazy deletion is bounded: a heap that is mostly dead is rebuilt."""
    s = Scheduler(1)
    holder = enqueue(s)
    for _ in range(10):
        waiters = [enqueue(s) for _ in range(500)]
        for w in waiters[1:]:
            s.discard(w)
        s.discard(waiters[0])
    state = s.tuple_state(A)
    assert state is not None
    assert len(state.heap) <= 200
    s.release(holder)
    s.check_invariants()


def test_ready_heap_stays_bounded_under_close_open_churn() -> None:
    s = Scheduler(1)
    holder = enqueue(s, A)
    for i in range(1000):
        t = ModelTuple("p", f"m{i % 7}")
        w = enqueue(s, t)
        s.close(t, None)
        s.open(t)
        enqueue(s, t, order=1)  # a better head: the tuple is re-keyed
        s.discard(w)
    assert len(s._ready) <= 2 * len(list(s.tuple_states())) + 64
    s.release(holder)
    s.check_invariants()


def test_many_tuples_half_closed_drain_in_order() -> None:
    s = Scheduler(1)
    holder = enqueue(s, A)
    tuples = [ModelTuple("p", f"m{i}") for i in range(20)]
    for t in tuples[::2]:
        s.close(t, None)
    tickets = [enqueue(s, tuples[i % 20]) for i in range(200)]
    s.release(holder)
    granted: list[Ticket] = []
    for _ in range(100):
        (current,) = [t for t in tickets if t.state == GRANTED]
        granted.append(current)
        s.release(current)
        s.check_invariants()
    open_tickets = [t for i, t in enumerate(tickets) if (i % 20) % 2 == 1]
    assert granted == open_tickets
    assert s.queued == 100


# -- the state machine ----------------------------------------------------------------------------

TUPLES = (A, B, C)


@dataclass
class RefTicket:
    ticket: Ticket
    tuple: ModelTuple
    order: int
    seq: int
    state: int
    reject: bool
    bypass: bool = False
    parker: FakeParker | None = None


@dataclass
class Reference:
    """The contract, brute force: scan every waiter for the best one that may run."""

    limit: int
    counter: int = 0
    seq: int = 0
    tickets: list[RefTicket] = field(default_factory=list)
    closed: set[ModelTuple] = field(default_factory=set)
    caps: dict[ModelTuple, int] = field(default_factory=dict)

    def active_on(self, t: ModelTuple) -> int:
        return sum(1 for r in self.tickets if r.tuple == t and r.state == GRANTED)

    def may_run(self, r: RefTicket) -> bool:
        if r.state != QUEUED:
            return False
        if r.bypass:
            return True
        cap = self.caps.get(r.tuple)
        return r.tuple not in self.closed and (cap is None or self.active_on(r.tuple) < cap)

    def settle(self) -> None:
        while sum(1 for r in self.tickets if r.state == GRANTED) < self.limit:
            runnable = [r for r in self.tickets if self.may_run(r)]
            if not runnable:
                return
            best = min(runnable, key=lambda r: (r.order, r.seq))
            best.state = GRANTED
            best.bypass = False


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = Scheduler(2)
        self.ref = Reference(2)

    def _pick(self, index: int, *wanted: int) -> RefTicket | None:
        candidates = [r for r in self.ref.tickets if r.state in wanted]
        return candidates[index % len(candidates)] if candidates else None

    @rule(
        t=st.sampled_from(TUPLES),
        explicit=st.none() | st.integers(1, 30),
        active=st.booleans(),
        reject=st.booleans(),
        parked=st.booleans(),
    )
    def enqueue(
        self, t: ModelTuple, explicit: int | None, active: bool, reject: bool, parked: bool
    ) -> None:
        if reject and t in self.ref.closed:
            with pytest.raises(TupleSuspendedError):
                self.s.enqueue(t, 1, active=active, reject=reject)
            return
        if explicit is None:
            self.ref.counter += 1
            order = self.ref.counter
            assert self.s.next_order() == order
        else:
            order = explicit
            self.ref.counter = max(self.ref.counter, explicit)
        self.ref.seq += 1
        ref = RefTicket(
            ticket=None,  # type: ignore[arg-type]
            tuple=t,
            order=order,
            seq=self.ref.seq,
            state=QUEUED if active else INACTIVE,
            reject=reject,
        )
        self.ref.tickets.append(ref)
        if active:
            self.ref.settle()
        ref.ticket = self.s.enqueue(t, order, active=active, reject=reject)
        if parked and ref.ticket.state in (INACTIVE, QUEUED):
            ref.parker = FakeParker()
            ref.ticket.parker = ref.parker

    @rule(index=st.integers(0, 1000))
    def activate(self, index: int) -> None:
        r = self._pick(index, INACTIVE)
        if r is None:
            return
        r.state = QUEUED
        self.ref.settle()
        self.s.activate(r.ticket)

    @rule(index=st.integers(0, 1000), with_parker=st.booleans())
    def cancel_queued(self, index: int, with_parker: bool) -> None:
        r = self._pick(index, INACTIVE, QUEUED)
        if r is None:
            return
        r.state = DONE
        r.bypass = False
        error = RuntimeError("cancelled")
        if with_parker:
            self.s.fail(r.ticket, error)
            if r.parker is not None:
                assert r.parker.failed == [error]
            else:
                assert r.ticket.error is error
        else:
            r.ticket.parker = None
            self.s.discard(r.ticket)

    @rule(index=st.integers(0, 1000))
    def release(self, index: int) -> None:
        r = self._pick(index, GRANTED, LENT)
        if r is None:
            return
        r.state = DONE
        self.ref.settle()
        self.s.release(r.ticket)

    @rule(index=st.integers(0, 1000))
    def lend(self, index: int) -> None:
        r = self._pick(index, GRANTED)
        if r is None:
            return
        r.state = LENT
        self.ref.settle()
        self.s.lend(r.ticket)

    @rule(index=st.integers(0, 1000), fresh=st.booleans())
    def reacquire(self, index: int, fresh: bool) -> None:
        r = self._pick(index, LENT)
        if r is None:
            return
        if fresh:
            self.ref.counter += 1
            order = self.ref.counter
            assert self.s.next_order() == order
        else:
            order = r.order
        self.ref.seq += 1
        r.order, r.seq, r.state, r.bypass = order, self.ref.seq, QUEUED, True
        r.parker = FakeParker()
        r.ticket.parker = r.parker
        parker = r.parker
        self.ref.settle()
        self.s.reacquire(r.ticket, order)
        if r.state == GRANTED:
            assert parker.granted == [True]

    @rule(index=st.integers(0, 1000))
    def withdraw(self, index: int) -> None:
        candidates = [r for r in self.ref.tickets if r.state == QUEUED and r.bypass]
        if not candidates:
            return
        r = candidates[index % len(candidates)]
        r.state, r.bypass, r.parker = LENT, False, None
        self.s.withdraw(r.ticket)

    @rule(limit=st.integers(1, 4))
    def set_limit(self, limit: int) -> None:
        self.ref.limit = limit
        self.ref.settle()
        self.s.set_limit(limit)

    @rule(t=st.sampled_from(TUPLES), limit=st.none() | st.integers(1, 3))
    def set_tuple_limit(self, t: ModelTuple, limit: int | None) -> None:
        if limit is None:
            self.ref.caps.pop(t, None)
        else:
            self.ref.caps[t] = limit
        self.ref.settle()
        self.s.set_tuple_limit(t, limit)

    @rule(t=st.sampled_from(TUPLES))
    def close(self, t: ModelTuple) -> None:
        self.ref.closed.add(t)
        for r in self.ref.tickets:
            if r.tuple == t and r.reject and r.state in (INACTIVE, QUEUED) and not r.bypass:
                r.state = DONE
        self.s.close(t, None)

    @rule(t=st.sampled_from(TUPLES))
    def open(self, t: ModelTuple) -> None:
        self.ref.closed.discard(t)
        self.ref.settle()
        self.s.open(t)

    @invariant()
    def matches_reference(self) -> None:
        s, ref = self.s, self.ref
        s.check_invariants()
        for r in ref.tickets:
            assert r.ticket.state == r.state, (r, r.ticket)
            if r.state == GRANTED and r.parker is not None:
                assert r.parker.granted == [True]
        assert s.active == sum(1 for r in ref.tickets if r.state == GRANTED)
        assert s.queued == sum(1 for r in ref.tickets if r.state in (INACTIVE, QUEUED))
        assert s.lent == sum(
            1 for r in ref.tickets if r.state == LENT or (r.state == QUEUED and r.bypass)
        )
        for t in TUPLES:
            state = s.tuple_state(t)
            active = ref.active_on(t)
            queued = sum(1 for r in ref.tickets if r.tuple == t and r.state in (INACTIVE, QUEUED))
            if state is None:
                assert (active, queued) == (0, 0)
                assert t not in ref.closed
                assert t not in ref.caps
            else:
                assert (state.active, state.queued) == (active, queued)
                assert state.open == (t not in ref.closed)
                assert state.limit == ref.caps.get(t)


SchedulerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
test_scheduler_matches_reference = SchedulerMachine.TestCase

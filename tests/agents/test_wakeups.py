"""The wake-up heap alone: order, lazy deletion, what is due, and shifting clocks."""

from __future__ import annotations

from lovely_coordinator import ModelTuple
from lovely_coordinator._agents.tickets import TupleState
from lovely_coordinator._agents.wakeups import BUDGET, GATE, Wakeups, wakeup_live

A = ModelTuple("p", "a")
B = ModelTuple("p", "b")


def closed(model_tuple: ModelTuple, until: float) -> TupleState:
    state = TupleState(model_tuple)
    state.open = False
    state.reopens_at = until
    return state


def test_the_earliest_live_wake_up_comes_first() -> None:
    wakeups = Wakeups()
    assert not wakeups
    assert wakeups.next() is None
    a, b = closed(A, 5.0), closed(B, 3.0)
    wakeups.add(5.0, GATE, a)
    wakeups.add(3.0, GATE, b)
    assert wakeups  # truthy while it holds entries: no call on the hot path
    assert wakeups.next() == 3.0
    assert wakeups.peek() == 3.0
    assert wakeups.has(5.0, GATE, a)
    assert not wakeups.has(5.0, BUDGET, a)


def test_a_dead_wake_up_is_dropped_when_it_surfaces() -> None:
    wakeups = Wakeups()
    a = closed(A, 1.0)
    wakeups.add(1.0, GATE, a)
    a.reopens_at = 2.0  # the closure was extended: its first wake-up is dead
    wakeups.add(2.0, GATE, a)
    assert not wakeup_live(wakeups[0])
    assert wakeups.peek() == 2.0
    assert len(wakeups) == 2  # a pure read drops nothing
    assert wakeups.next() == 2.0
    assert len(wakeups) == 1


def test_a_budget_wake_up_is_live_while_its_block_ends_then() -> None:
    wakeups = Wakeups()
    state = TupleState(A)
    state.block_until = 4.0
    wakeups.add(4.0, BUDGET, state)
    assert wakeups.next() == 4.0
    state.block_until = None
    assert wakeups.next() is None


def test_pop_due_yields_the_live_ones_in_order_judged_as_reached() -> None:
    wakeups = Wakeups()
    a, b = closed(A, 1.0), closed(B, 2.0)
    wakeups.add(2.0, GATE, b)
    wakeups.add(1.0, GATE, a)
    wakeups.add(1.0, GATE, a)  # a duplicate: dead once the first was applied
    later = closed(ModelTuple("p", "c"), 9.0)
    wakeups.add(9.0, GATE, later)
    seen = []
    for kind, state in wakeups.pop_due(2.0):
        assert kind == GATE
        state.open = True  # applied before the next is judged
        state.reopens_at = None
        seen.append(state.tuple)
    assert seen == [A, B]
    assert list(wakeups) == [(9.0, 4, GATE, later)]


def test_shift_moves_every_instant() -> None:
    wakeups = Wakeups()
    a = closed(A, 1.0)
    wakeups.add(1.0, GATE, a)
    a.reopens_at = 11.0  # the caller shifts the tuple's own instants
    wakeups.shift(10.0)
    assert wakeups.next() == 11.0

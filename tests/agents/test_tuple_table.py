"""_agents/tuple_table: each tuple's state, made on first use; the last few idle ones kept."""

from __future__ import annotations

from lovely_coordinator._agents.tickets import TupleState
from lovely_coordinator._agents.tuple_table import IDLE_KEPT, TupleTable
from lovely_coordinator._base.types import ModelTuple


def model(i: int) -> ModelTuple:
    return ModelTuple("p", f"m{i}")


def ready_entries(state: TupleState) -> list[object]:
    return [state.permits.entry, state.requests.entry]


def test_a_state_is_made_once_per_tuple() -> None:
    table = TupleTable()
    state = table.state(model(0))
    assert state.tuple == model(0)
    assert table.state(model(0)) is state
    assert table.state(ModelTuple("p", "m0")) is state  # equal tuples share it
    assert len(table) == 1
    assert list(table.busy()) == []  # made, but idle


def test_idle_states_are_kept_for_reuse_then_the_oldest_go() -> None:
    table = TupleTable()
    states = [table.state(model(i)) for i in range(IDLE_KEPT + 2)]
    for state in states:
        table.forget_if_idle(state)
    assert len(table.idle) == IDLE_KEPT
    assert model(0) not in table.states  # the two oldest went
    assert model(1) not in table.states
    assert all(model(i) in table.states for i in range(2, IDLE_KEPT + 2))
    table.forget_if_idle(states[5])  # kept already: nothing moves
    assert list(table.idle) == [model(i) for i in range(2, IDLE_KEPT + 2)]


def test_a_busy_state_is_never_dropped() -> None:
    table = TupleTable()
    busy = table.state(model(0))
    table.forget_if_idle(busy)  # idle now: cached
    busy.active = 1  # ...and used again while cached
    for i in range(1, IDLE_KEPT + 1):
        table.forget_if_idle(table.state(model(i)))
    assert model(0) not in table.idle  # its turn to go came: eviction re-checked it
    assert table.states[model(0)] is busy
    assert list(table.busy()) == [busy]
    table.forget_if_idle(busy)  # not idle: not cached
    assert model(0) not in table.idle


def test_a_dropped_state_leaves_no_ready_entry_behind() -> None:
    table = TupleTable()
    dropped = table.state(model(0))
    dropped.permits.entry = (1, 1, dropped.permits)  # as if it had a ready entry once
    for i in range(IDLE_KEPT + 1):
        table.forget_if_idle(table.state(model(i)))
    assert model(0) not in table.states
    assert ready_entries(dropped) == [None, None]

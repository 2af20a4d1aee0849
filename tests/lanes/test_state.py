"""The lanes' pure state machine, without an event loop."""

from __future__ import annotations

import dataclasses
import pickle
from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from lovely_coordinator import CoordinatorError, InvalidArgumentError
from lovely_coordinator._lanes.state import (
    ActivationRecord,
    LaneSnapshot,
    LanesState,
    LanesStatus,
)
from lovely_coordinator.lanes import LaneQueueFull, LanesClosed


def make(max_concurrent: int, max_queued: int | None = None) -> LanesState[ActivationRecord]:
    return LanesState(max_concurrent, max_queued, ActivationRecord)


def keys(state: LanesState[ActivationRecord]) -> list[tuple[str, str, bool]]:
    return [(s.key, s.state, s.pending) for s in state.status().lanes]


def test_wake_starts_while_a_slot_is_free_then_queues() -> None:
    state = make(2)
    result, record = state.wake("a")
    assert result == "started"
    assert record is not None
    assert record.key == "a"
    assert not record.pending
    assert state.wake("b")[0] == "started"
    assert state.wake("c") == ("queued", None)
    assert keys(state) == [("a", "running", False), ("b", "running", False), ("c", "queued", True)]
    state.check_invariants()


def test_wakes_coalesce_on_queued_and_running_lanes() -> None:
    state = make(1)
    state.wake("a")
    state.wake("b")
    for _ in range(3):
        assert state.wake("a") == ("coalesced", None)
        assert state.wake("b") == ("coalesced", None)
    assert state.status() == LanesStatus(
        running=1,
        queued=1,
        closed=False,
        lanes=(LaneSnapshot("a", "running", True), LaneSnapshot("b", "queued", True)),
    )


def test_coalesced_wake_ignores_a_full_queue() -> None:
    state = make(1, max_queued=1)
    state.wake("a")
    state.wake("b")
    assert state.wake("a") == ("coalesced", None)
    assert state.wake("b") == ("coalesced", None)
    state.check_invariants()


def test_queue_full_changes_nothing() -> None:
    state = make(1, max_queued=1)
    state.wake("a")
    state.wake("b")
    before = state.status()
    with pytest.raises(LaneQueueFull) as info:
        state.wake("c")
    assert info.value.key == "c"
    assert info.value.max_queued == 1
    assert isinstance(info.value, CoordinatorError)
    assert state.status() == before


def test_max_queued_zero_refuses_every_wait_but_still_coalesces() -> None:
    state = make(1, max_queued=0)
    state.wake("a")
    with pytest.raises(LaneQueueFull):
        state.wake("b")
    assert state.wake("a") == ("coalesced", None)
    record = state.running["a"]
    # The pending follow-up re-queues past the bound of 0 and is started in the same step.
    follow_up = state.finish(record)
    assert follow_up is not None
    assert follow_up.key == "a"
    assert follow_up is not record
    state.check_invariants()


def test_finish_hands_the_slot_to_the_longest_waiting_lane() -> None:
    state = make(1)
    first = state.wake("a")[1]
    assert first is not None
    state.wake("b")
    state.wake("c")
    started = state.finish(first)
    assert started is not None
    assert started.key == "b"
    assert keys(state) == [("b", "running", False), ("c", "queued", True)]


def test_rewoken_running_lane_requeues_behind_lanes_queued_meanwhile() -> None:
    state = make(1)
    first = state.wake("a")[1]
    assert first is not None
    state.wake("b")
    state.wake("a")  # while a runs: one follow-up owed, behind b
    started = state.finish(first)
    assert started is not None
    assert started.key == "b"
    assert keys(state) == [("b", "running", False), ("a", "queued", True)]
    state.check_invariants()


def test_finish_without_pending_makes_the_lane_idle() -> None:
    state = make(1)
    record = state.wake("a")[1]
    assert record is not None
    assert state.finish(record) is None
    assert state.status() == LanesStatus(0, 0, False, ())
    assert state.wake("a")[0] == "started"


def test_cancel_drops_a_queued_lane_and_a_pending_follow_up() -> None:
    state = make(1)
    record = state.wake("a")[1]
    state.wake("b")
    state.wake("a")
    assert state.cancel("b") is None
    assert state.cancel("a") is record
    assert keys(state) == [("a", "running", False)]
    assert state.cancel("idle") is None
    assert record is not None
    assert state.finish(record) is None
    assert state.status().lanes == ()


def test_close_refuses_wakes_drops_queue_and_pending_and_never_starts_again() -> None:
    state = make(1)
    record = state.wake("a")[1]
    state.wake("b")
    state.wake("a")
    assert state.close() == [record]
    assert keys(state) == [("a", "running", False)]
    with pytest.raises(LanesClosed) as info:
        state.wake("a")
    assert info.value.key == "a"
    assert record is not None
    assert state.close() == [record]  # idempotent: still reports what runs
    assert state.finish(record) is None
    assert state.close() == []
    assert state.status() == LanesStatus(0, 0, True, ())


def test_status_is_a_frozen_snapshot() -> None:
    state = make(1)
    state.wake("a")
    status = state.status()
    state.wake("b")
    assert status == LanesStatus(1, 0, False, (LaneSnapshot("a", "running", False),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.running = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.lanes[0].pending = True  # type: ignore[misc]


def test_non_string_key_is_a_type_error_and_changes_nothing() -> None:
    state = make(1)
    with pytest.raises(InvalidArgumentError, match=r"^Lane keys must be strings$") as info:
        state.wake(1)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError)
    assert state.status() == LanesStatus(0, 0, False, ())


def test_errors_pickle_with_their_fields() -> None:
    full = pickle.loads(pickle.dumps(LaneQueueFull("k", 3)))
    assert (full.key, full.max_queued, str(full)) == (
        "k",
        3,
        "Lane queue is full (3 waiting); cannot queue lane 'k'",
    )
    closed = pickle.loads(pickle.dumps(LanesClosed("k")))
    assert (closed.key, str(closed)) == ("k", "Lanes are closed; cannot wake lane 'k'")


KEYS = st.sampled_from([f"k{i}" for i in range(6)])


class LanesModel(RuleBasedStateMachine):
    """The state machine against a naive model: a list per state, no shortcuts."""

    def __init__(self) -> None:
        super().__init__()
        self.state: LanesState[ActivationRecord] | None = None
        self.running: list[str] = []
        self.pending: set[str] = set()
        self.queue: deque[str] = deque()
        self.closed = False
        self.max_concurrent = 1
        self.max_queued: int | None = None

    @precondition(lambda self: self.state is None)
    @rule(
        max_concurrent=st.integers(1, 4),
        max_queued=st.none() | st.integers(0, 4),
    )
    def create(self, max_concurrent: int, max_queued: int | None) -> None:
        self.state = make(max_concurrent, max_queued)
        self.max_concurrent, self.max_queued = max_concurrent, max_queued

    @precondition(lambda self: self.state is not None)
    @rule(key=KEYS)
    def wake(self, key: str) -> None:
        assert self.state is not None
        if self.closed:
            with pytest.raises(LanesClosed):
                self.state.wake(key)
            return
        if key in self.running or key in self.queue:
            expected = "coalesced"
            if key in self.running:
                self.pending.add(key)
        elif not self.queue and len(self.running) < self.max_concurrent:
            expected = "started"
            self.running.append(key)
        elif self.max_queued is None or len(self.queue) < self.max_queued:
            expected = "queued"
            self.queue.append(key)
        else:
            with pytest.raises(LaneQueueFull):
                self.state.wake(key)
            return
        result, record = self.state.wake(key)
        assert result == expected
        assert (record is not None) == (expected == "started")

    @precondition(lambda self: self.state is not None)
    @rule(key=KEYS)
    def cancel(self, key: str) -> None:
        assert self.state is not None
        record = self.state.cancel(key)
        if key in self.queue:
            self.queue.remove(key)
        self.pending.discard(key)
        assert (record is not None) == (key in self.running)

    @precondition(lambda self: self.state is not None and bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        assert self.state is not None
        key = data.draw(st.sampled_from(self.running))
        started = self.state.finish(self.state.running[key])
        self.running.remove(key)
        if key in self.pending:
            self.pending.discard(key)
            self.queue.append(key)
        expected = None
        if self.queue and not self.closed:
            expected = self.queue.popleft()
            self.running.append(expected)
        assert (started.key if started else None) == expected

    @precondition(lambda self: self.state is not None)
    @rule()
    def close(self) -> None:
        assert self.state is not None
        stopped = self.state.close()
        self.closed = True
        self.queue.clear()
        self.pending.clear()
        assert [r.key for r in stopped] == self.running

    @invariant()
    def agrees_with_model(self) -> None:
        if self.state is None:
            return
        self.state.check_invariants()
        assert keys(self.state) == [(k, "running", k in self.pending) for k in self.running] + [
            (k, "queued", True) for k in self.queue
        ]
        assert self.state.closed == self.closed


TestLanesModel = LanesModel.TestCase
TestLanesModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)

"""The synchronous core of the turn queues: admission, double texting, hand-off."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lovely_coordinator import InvalidArgumentError, InvalidArgumentTypeError
from lovely_coordinator._turns.state import (
    MULTITASK_MODES,
    Admission,
    Multitask,
    TurnStatistics,
    TurnTable,
    check_multitask,
)
from lovely_coordinator.turns import ConversationBusyError, DrainingError, QueueFullError


class Item:
    """An opaque queue item, compared by identity like the registry's jobs."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_first_item_starts_and_later_ones_queue_in_order() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=3)
    a, b, c = Item("a"), Item("b"), Item("c")
    assert table.admit("conv", a, "enqueue") == Admission(position=0)
    assert table.admit("conv", b, "enqueue").position == 1
    assert table.admit("conv", c, "enqueue").position == 2
    assert table.current("conv") is a
    assert table.pending("conv") == (b, c)
    assert table.waiting("conv") == 2
    assert table.advance("conv", a) is b
    assert table.advance("conv", b) is c
    assert table.advance("conv", c) is None
    assert len(table) == 0, "an idle conversation is forgotten in the step that ends it"
    assert table.current("conv") is None
    table.check_invariants()


def test_conversations_are_independent() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=0)
    assert table.admit("one", Item("a"), "enqueue").position == 0
    assert table.admit("two", Item("b"), "reject").position == 0
    assert table.busy() == ("one", "two")


def test_queue_full_changes_nothing() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=1)
    a, b = Item("a"), Item("b")
    table.admit("conv", a, "enqueue")
    table.admit("conv", b, "enqueue")
    with pytest.raises(
        QueueFullError, match=r"^too many turns are already queued for this conversation$"
    ):
        table.admit("conv", Item("c"), "enqueue")
    assert table.current("conv") is a
    assert table.pending("conv") == (b,)


def test_max_queued_zero_lets_nothing_wait() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=0)
    table.admit("conv", Item("a"), "enqueue")
    for mode in MULTITASK_MODES:
        expected = ConversationBusyError if mode == "reject" else QueueFullError
        with pytest.raises(expected):
            table.admit("conv", Item("b"), mode)
    assert table.waiting("conv") == 0


def test_reject_refuses_a_busy_conversation() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=5)
    a = Item("a")
    assert table.admit("conv", a, "reject").position == 0
    with pytest.raises(
        ConversationBusyError, match=r"^a turn is already running or queued for this conversation$"
    ):
        table.admit("conv", Item("b"), "reject")
    assert table.pending("conv") == ()


def test_interrupt_drops_the_queue_and_names_the_current_item() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=2)
    a, b, c, d = Item("a"), Item("b"), Item("c"), Item("d")
    table.admit("conv", a, "enqueue")
    table.admit("conv", b, "enqueue")
    table.admit("conv", c, "enqueue")
    # A full queue does not stop an interrupt: it empties the queue first.
    assert table.admit("conv", d, "interrupt") == Admission(1, interrupted=a, dropped=(b, c))
    assert table.current("conv") is a, "the interrupted item stays current until its turn ends"
    assert table.pending("conv") == (d,)
    assert table.advance("conv", a) is d


def test_replace_queued_keeps_the_running_item() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=3)
    a, b, c = Item("a"), Item("b"), Item("c")
    table.admit("conv", a, "enqueue")
    table.admit("conv", b, "enqueue")
    assert table.admit("conv", c, "replace_queued") == Admission(1, dropped=(b,))
    assert table.pending("conv") == (c,)


def test_interrupt_or_replace_on_an_idle_conversation_just_starts() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=0)
    assert table.admit("x", Item("a"), "interrupt") == Admission(0)
    assert table.admit("y", Item("b"), "replace_queued") == Admission(0)


def test_draining_admits_nothing() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=3)
    a = Item("a")
    table.admit("conv", a, "enqueue")
    table.drain()
    for mode in MULTITASK_MODES:
        with pytest.raises(DrainingError, match=r"^this server is shutting down; retry the turn$"):
            table.admit("conv", Item("b"), mode)
        with pytest.raises(DrainingError):
            table.admit("other", Item("c"), mode)
    assert table.busy() == ("conv",)
    assert table.pending("conv") == ()


def test_replace_queued_fills_a_full_queue_of_one_again() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=1)
    a, b, c = Item("a"), Item("b"), Item("c")
    table.admit("conv", a, "enqueue")
    table.admit("conv", b, "enqueue")
    # The queue is full, but the items replace_queued drops free their places first.
    assert table.admit("conv", c, "replace_queued") == Admission(1, dropped=(b,))
    assert table.pending("conv") == (c,)
    assert table.statistics() == TurnStatistics(1, 1, 1, False)
    with pytest.raises(QueueFullError):
        table.admit("conv", Item("d"), "enqueue")


def test_statistics_count_busy_conversations_and_pending_items() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=3)
    assert table.statistics() == TurnStatistics(0, 0, 0, False)
    a, b, c, d = Item("a"), Item("b"), Item("c"), Item("d")
    table.admit("one", a, "enqueue")
    table.admit("one", b, "enqueue")
    table.admit("one", c, "enqueue")
    table.admit("two", d, "enqueue")
    assert table.statistics() == TurnStatistics(2, 2, 2, False)
    assert table.advance("one", a) is b
    assert table.statistics() == TurnStatistics(2, 2, 1, False)
    table.drain()
    table.drain()  # idempotent
    assert table.forget("one") == (b, c)
    assert table.statistics() == TurnStatistics(1, 1, 0, True)


def test_forget_returns_current_then_pending() -> None:
    table: TurnTable[Item] = TurnTable(max_queued=3)
    a, b = Item("a"), Item("b")
    table.admit("conv", a, "enqueue")
    table.admit("conv", b, "enqueue")
    assert table.forget("conv") == (a, b)
    assert table.forget("conv") == ()
    assert len(table) == 0


@pytest.mark.parametrize("value", [-1, -(10**400), True, 1.0, "3", None])
def test_max_queued_must_be_a_nonnegative_int(value: object) -> None:
    expected = (
        InvalidArgumentTypeError
        if isinstance(value, bool | float | str | None)
        else (InvalidArgumentError)
    )
    with pytest.raises(expected, match=r"^max_queued must be a nonnegative integer$") as info:
        TurnTable(max_queued=value)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError) == (expected is InvalidArgumentTypeError)


@pytest.mark.parametrize("value", ["", "Enqueue", "rollback", None, b"enqueue"])
def test_multitask_must_be_a_known_mode(value: object) -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=r"^multitask must be one of 'enqueue', 'reject', 'interrupt', 'replace_queued'$",
    ):
        check_multitask(value)


def test_modes_are_the_literal() -> None:
    assert MULTITASK_MODES == ("enqueue", "reject", "interrupt", "replace_queued")
    assert all(check_multitask(mode) == mode for mode in MULTITASK_MODES)


CONVERSATIONS = ("a", "b", "c")


class TurnTableMachine(RuleBasedStateMachine):
    """The table against a plain model: a current item and a FIFO per busy conversation."""

    def __init__(self) -> None:
        super().__init__()
        self.max_queued = 2
        self.table: TurnTable[Item] = TurnTable(self.max_queued)
        self.model: dict[str, tuple[Item, deque[Item]]] = {}
        self.draining = False
        self.count = 0

    @rule(conversation=st.sampled_from(CONVERSATIONS), mode=st.sampled_from(MULTITASK_MODES))
    def admit(self, conversation: str, mode: Multitask) -> None:
        self.count += 1
        item = Item(f"i{self.count}")
        before = (self.table.current(conversation), self.table.pending(conversation))
        entry = self.model.get(conversation)
        try:
            admission = self.table.admit(conversation, item, mode)
        except DrainingError:
            assert self.draining
            assert (self.table.current(conversation), self.table.pending(conversation)) == before
            return
        except ConversationBusyError:
            assert mode == "reject"
            assert entry is not None
            assert (self.table.current(conversation), self.table.pending(conversation)) == before
            return
        except QueueFullError:
            assert entry is not None
            kept = 0 if mode in ("interrupt", "replace_queued") else len(entry[1])
            assert kept >= self.max_queued
            assert (self.table.current(conversation), self.table.pending(conversation)) == before
            return
        if entry is None:
            assert admission == Admission(0)
            self.model[conversation] = (item, deque())
            return
        assert mode != "reject"
        current, pending = entry
        if mode in ("interrupt", "replace_queued"):
            assert admission.dropped == tuple(pending)
            pending.clear()
        else:
            assert admission.dropped == ()
        assert admission.interrupted is (current if mode == "interrupt" else None)
        pending.append(item)
        assert admission.position == len(pending)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def finish_a_turn(self, data: st.DataObject) -> None:
        conversation = data.draw(st.sampled_from(sorted(self.model)))
        current, pending = self.model[conversation]
        following = self.table.advance(conversation, current)
        if pending:
            assert following is pending.popleft()
            self.model[conversation] = (following, pending)
        else:
            assert following is None
            del self.model[conversation]

    # Only after some admissions, so that runs drain a table with work in it; the rest of
    # the run checks that a draining table admits nothing while its turns still finish.
    @precondition(lambda self: not self.draining and self.count >= 10)
    @rule()
    def drain(self) -> None:
        self.table.drain()
        self.draining = True

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        conversation = data.draw(st.sampled_from(sorted(self.model)))
        current, pending = self.model.pop(conversation)
        assert self.table.forget(conversation) == (current, *pending)

    @invariant()
    def agrees_with_the_model(self) -> None:
        self.table.check_invariants()
        waiting = sum(len(pending) for _, pending in self.model.values())
        busy = len(self.model)
        assert self.table.statistics() == TurnStatistics(busy, busy, waiting, self.draining)
        assert self.table.draining == self.draining
        assert set(self.table.busy()) == set(self.model)
        for conversation in CONVERSATIONS:
            entry = self.model.get(conversation)
            if entry is None:
                assert self.table.current(conversation) is None
                assert self.table.waiting(conversation) == 0
            else:
                assert self.table.current(conversation) is entry[0]
                assert self.table.pending(conversation) == tuple(entry[1])


TestTurnTableMachine = TurnTableMachine.TestCase
TestTurnTableMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)

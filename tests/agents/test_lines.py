"""_agents/lines: the line container alone, on items of its own (a line knows nothing of
tickets; the scheduler's rules are checked in test_scheduler.py, against a model)."""

from __future__ import annotations

import heapq
from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lovely_coordinator import ModelTuple
from lovely_coordinator._agents.lines import COMPACT_MIN, COVERED, LEFT, PERMITS, REQUESTS, Line


class Holder:
    """A line's owner: only its ``tuple`` is read (for the repr)."""

    def __init__(self) -> None:
        self.tuple = ModelTuple("p", "a")


class Item:
    """The least a line can hold (lines.Queued): a key and where it is queued."""

    __slots__ = ("entry", "line", "order", "seq")

    def __init__(self, order: int, seq: int) -> None:
        self.order = order
        self.seq = seq
        self.line: Line[Holder, Item] | None = None
        self.entry: object = None

    def __repr__(self) -> str:
        return f"<Item {self.order} {self.seq}>"


def line_of(kind: int = PERMITS) -> Line[Holder, Item]:
    return Line(Holder(), kind)


def storage(line: Line[Holder, Item]) -> type:
    """What the line keeps its items in: a deque (FIFO) or a list (heap)."""
    return type(line.items)


def drain(line: Line[Holder, Item]) -> list[tuple[int, int]]:
    keys = []
    while (item := line.head()) is not None:
        assert line.first() is item
        assert line.pop() is item
        assert item.line is None
        assert item.entry is None
        keys.append((item.order, item.seq))
    return keys


def test_ready_entries_that_tie_compare_by_line_kind() -> None:
    # A request that moved from its tuple's requests line to the covered line leaves the
    # old line's ready entry behind with the same (order, seq) as the new one: the heap
    # must order them without comparing lines by anything that can fail. Hypothesis found
    # a TypeError here ('<' not supported between instances of 'Line' and 'Line').
    holder = Holder()
    permits, requests, covered = (Line[Holder, Item](holder, k) for k in (0, 1, 2))
    ready = [(7, 3, covered), (7, 3, requests), (7, 3, permits)]
    heapq.heapify(ready)
    assert [heapq.heappop(ready)[2].kind for _ in range(3)] == [PERMITS, REQUESTS, COVERED]
    assert not requests < requests  # a strict order


def test_items_in_key_order_are_held_bare_in_a_fifo() -> None:
    line = line_of()
    items = [Item(1, 1), Item(1, 2), Item(2, 3)]
    for item in items:
        line.push(item)
    assert line.fifo
    assert list(line.items) == items  # no entry object per waiter
    assert all(item.entry is item and item.line is line for item in items)
    assert line.last == (2, 3)
    assert line.entries() == [(1, 1, items[0]), (1, 2, items[1]), (2, 3, items[2])]
    assert repr(line) == f"<Line {Holder().tuple} permits 3 live>"
    assert drain(line) == [(1, 1), (1, 2), (2, 3)]
    assert line.fifo


def test_an_earlier_key_turns_the_line_into_a_heap_until_it_is_empty() -> None:
    line = line_of(REQUESTS)
    late, early = Item(5, 1), Item(2, 2)
    line.push(late)
    line.push(early)  # an explicit, earlier acceptance order
    assert (line.fifo, storage(line)) == (False, list)  # a heap
    assert early.entry == (2, 2, early)
    assert late.entry == (5, 1, late)
    assert sorted(line.entries()) == [(2, 2, early), (5, 1, late)]
    assert drain(line) == [(2, 2), (5, 1)]
    assert (line.fifo, storage(line)) == (True, deque)  # empty: back to the cheap mode


def test_a_removed_item_dies_in_place_and_is_skipped() -> None:
    line = line_of()
    a, b, c = Item(1, 1), Item(1, 2), Item(1, 3)
    for item in (a, b, c):
        line.push(item)
    line.remove(a)
    line.remove(c)
    assert a.line is None
    assert a.entry is LEFT
    assert len(line.items) == 3
    assert line.dead == 2
    assert line.entries() == [(1, 2, b)]
    assert line.head() is b  # the dead front is dropped on the way
    assert len(line.items) == 2
    assert line.dead == 1


def test_an_item_back_in_its_line_never_revives_its_dead_occurrence() -> None:
    line = line_of()
    a, b = Item(1, 1), Item(1, 2)
    line.push(a)
    line.push(b)
    line.remove(b)
    b.order = 3  # a new place in line, after a's
    line.push(b)  # its dead bare occurrence is still in the deque: a heap now
    assert not line.fifo
    assert line.dead == 0  # the dead occurrence was left behind in the rebuild
    assert drain(line) == [(1, 1), (3, 2)]


def test_a_mostly_dead_line_is_rebuilt() -> None:
    for out_of_order in (False, True):
        line = line_of()
        items = [Item(1, seq) for seq in range(1, 2 * COMPACT_MIN + 4)]
        if out_of_order:
            items.reverse()  # the second push turns it into a heap
        for item in items:
            line.push(item)
        assert line.fifo is not out_of_order
        for item in items[: COMPACT_MIN + 1]:
            line.remove(item)
        assert line.dead == COMPACT_MIN + 1  # many dead, but not the majority
        line.remove(items[COMPACT_MIN + 1])  # now the majority: rebuilt
        assert line.dead == 0
        assert len(line.items) == len(items) - COMPACT_MIN - 2
        assert line.fifo is not out_of_order
        kept = sorted((i.order, i.seq) for i in items[COMPACT_MIN + 2 :])
        assert drain(line) == kept


class LineMachine(RuleBasedStateMachine):
    """A line against a dict of what is queued: any pushes, removals and pops."""

    def __init__(self) -> None:
        super().__init__()
        self.line = line_of()
        self.seq = 0
        self.queued: dict[Item, tuple[int, int]] = {}
        self.out: list[Item] = []  # popped or removed, free to come back

    @rule(order=st.integers(0, 5))
    def push_new(self, order: int) -> None:
        self.seq += 1
        item = Item(order, self.seq)
        self.line.push(item)
        self.queued[item] = (order, item.seq)

    @precondition(lambda self: bool(self.out))
    @rule(data=st.data(), order=st.integers(0, 5))
    def push_again(self, data: st.DataObject, order: int) -> None:
        item = self.out.pop(data.draw(st.integers(0, len(self.out) - 1)))
        item.order = order
        self.line.push(item)
        self.queued[item] = (order, item.seq)

    @precondition(lambda self: bool(self.queued))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(sorted(self.queued, key=lambda i: i.seq)))
        self.line.remove(item)
        del self.queued[item]
        self.out.append(item)

    @rule()
    def pop(self) -> None:
        head = self.line.head()
        if not self.queued:
            assert head is None
            return
        best = min(self.queued, key=self.queued.__getitem__)
        assert head is best
        assert self.line.pop() is best
        del self.queued[best]
        self.out.append(best)

    @invariant()
    def holds_exactly_the_queued_items(self) -> None:
        line = self.line
        live = line.entries()
        assert {e[2]: (e[0], e[1]) for e in live} == self.queued
        assert len(live) == len(self.queued)  # one live occurrence each
        assert len(line.items) - len(live) == line.dead
        assert all(item.line is line for item in self.queued)
        assert all(item.line is None for item in self.out)
        if line.fifo:
            assert [e[:2] for e in live] == sorted(e[:2] for e in live)
            assert all(e[:2] <= line.last for e in live)
        else:
            items = line.items
            assert all(items[(i - 1) // 2][:2] <= items[i][:2] for i in range(1, len(items)))


LineMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
test_line_machine = LineMachine.TestCase

"""_agents/lines: the plain structures under the scheduler (its rules are checked in
test_scheduler.py, against a model)."""

from __future__ import annotations

import heapq

from lovely_coordinator import ModelTuple
from lovely_coordinator._agents.lines import COVERED, PERMITS, REQUESTS
from lovely_coordinator._agents.tickets import TupleState


def test_ready_entries_that_tie_compare_by_line_kind() -> None:
    # A request that moved from its tuple's requests line to the covered line leaves the
    # old line's ready entry behind with the same (order, seq) as the new one: the heap
    # must order them without comparing lines by anything that can fail. Hypothesis found
    # a TypeError here ('<' not supported between instances of 'Line' and 'Line').
    state = TupleState(ModelTuple("p", "a"))
    ready = [(7, 3, state.covered), (7, 3, state.requests), (7, 3, state.permits)]
    heapq.heapify(ready)
    assert [heapq.heappop(ready)[2].kind for _ in range(3)] == [PERMITS, REQUESTS, COVERED]
    assert not state.requests < state.requests  # a strict order

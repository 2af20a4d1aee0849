"""The scheduler's table of model tuples: each tuple's bookkeeping, for as long as it matters.

A tuple's :class:`~.tickets.TupleState` is made on first use and kept while it holds work
or settings. A tuple that goes idle is usually used again at once (acquire, release,
acquire…), so the last :data:`IDLE_KEPT` idle states stay for reuse; older ones are
dropped, so memory follows the tuples in use. Every operation is O(1) (``busy`` is a
pass over the table).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, final

from .._base.types import ModelTuple
from .tickets import TupleState

__all__ = ["IDLE_KEPT", "TupleTable"]

# How many idle tuples stay cached for reuse (see TupleTable.forget_if_idle).
IDLE_KEPT: Final = 64


@final
class TupleTable:
    """Every tuple the scheduler holds state for.

    ``states`` is public for the scheduler's hot reads (one dict lookup, no call).

    Invariants (``scheduler_checks`` verifies them):
        * ``states`` maps each tuple to its one state, whose ``tuple`` is the key.
        * Every idle state in ``states`` is also in ``idle``, which holds at most
          :data:`IDLE_KEPT` states, oldest first (some may be busy again: eviction
          re-checks).
    """

    __slots__ = ("idle", "states")

    def __init__(self) -> None:
        self.states: dict[ModelTuple, TupleState] = {}
        self.idle: dict[ModelTuple, TupleState] = {}  # recently idle, oldest first

    def __len__(self) -> int:
        return len(self.states)

    def state(self, model_tuple: ModelTuple) -> TupleState:
        """The tuple's state, made on first use."""
        state = self.states.get(model_tuple)
        if state is None:
            state = self.states[model_tuple] = TupleState(model_tuple)
        return state

    def busy(self) -> Iterator[TupleState]:
        """Every state that is not idle, in no particular order (a pure read)."""
        return (state for state in self.states.values() if not state.idle)

    def forget_if_idle(self, state: TupleState) -> None:
        """Let an idle tuple go, keeping the most recent few for reuse (a busy one stays)."""
        idle = self.idle
        if state.tuple in idle or not state.idle:
            return  # cached already (eviction re-checks), or not idle
        idle[state.tuple] = state
        if len(idle) > IDLE_KEPT:
            model_tuple = next(iter(idle))
            oldest = idle.pop(model_tuple)
            if oldest.idle and self.states.get(model_tuple) is oldest:
                del self.states[model_tuple]
                oldest.permits.entry = oldest.requests.entry = None  # stale if in _ready

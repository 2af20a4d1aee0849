"""The scheduler's wake-up heap: the instants at which time alone changes what may run.

Two things end by themselves: a timed gate closure (at ``TupleState.reopens_at``) and a
budget block (at ``TupleState.block_until``, when the budget holds the blocked front).
Both are entries of one heap, :class:`Wakeups`, ordered by instant; the shell keeps one
timer armed at :meth:`Wakeups.next` and the scheduler applies what is due
(:meth:`Wakeups.pop_due`) when it fires.

Deletion is lazy: an entry is never searched for. It is *live* while its tuple still
waits for exactly that instant (its gate is closed until then, or its block ends then),
and dead otherwise (the gate was opened, the closure extended, the block moved or
ended), and a dead entry is dropped when it reaches the top. So closing, moving and
ending cost O(log n) or nothing, and every live wake-up is an entry of the heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    from .tickets import TupleState

__all__ = ["BUDGET", "DUE_SLACK", "GATE", "Wakeup", "Wakeups", "wakeup_live"]

# Wake-up kinds: a timed gate reopen, the end of a budget block.
GATE: Final = 0
BUDGET: Final = 1

# A timer may fire a hair before its instant (asyncio runs handles due within the clock's
# resolution); what is due within this many seconds counts as due.
DUE_SLACK: Final = 1e-6

Wakeup = tuple[float, int, int, "TupleState"]  # (instant, seq, kind, tuple)


def wakeup_live(wakeup: Wakeup) -> bool:
    """Whether the tuple of ``wakeup`` still waits for exactly its instant."""
    at, _seq, kind, state = wakeup
    if kind == GATE:
        return not state.open and state.reopens_at == at
    return state.block_until == at


@final
class Wakeups(list[Wakeup]):
    """A heap of wake-ups with lazy deletion (see the module docstring).

    It *is* its heap list (so ``if wakeups:`` on the hot paths costs no call), ordered
    by ``(instant, seq)``; ``seq`` is unique and breaks ties of equal instants, so tuples
    are never compared. Its length and items are every entry, dead ones included.
    Mutate it only through its methods.
    """

    __slots__ = ("_seq",)

    def __init__(self) -> None:
        super().__init__()
        self._seq = 0

    def add(self, instant: float, kind: int, state: TupleState) -> None:
        """A wake-up of ``kind`` for ``state`` at ``instant`` (the caller has just made
        it live, by setting ``reopens_at`` or ``block_until`` to it)."""
        self._seq += 1
        heapq.heappush(self, (instant, self._seq, kind, state))

    def next(self) -> float | None:
        """The earliest live instant, or None (drops dead entries from the top)."""
        while self and not wakeup_live(self[0]):
            heapq.heappop(self)
        return self[0][0] if self else None

    def peek(self) -> float | None:
        """The earliest live instant, without dropping anything (a pure read)."""
        return min((w[0] for w in self if wakeup_live(w)), default=None)

    def has(self, instant: float, kind: int, state: TupleState) -> bool:
        """Whether an entry of exactly this wake-up exists (O(n); for checks)."""
        return any(w[0] == instant and w[2] == kind and w[3] is state for w in self)

    def pop_due(self, now: float) -> Iterator[tuple[int, TupleState]]:
        """Remove every entry at or before ``now``, yielding the live ones as ``(kind,
        tuple)`` in instant order. Liveness is judged as each one is reached, so the
        caller must apply each (open the gate, end the block) before taking the next:
        a duplicate of one it applied is dead by then."""
        while self and self[0][0] <= now:
            wakeup = heapq.heappop(self)
            if wakeup_live(wakeup):
                yield wakeup[2], wakeup[3]

    def shift(self, delta: float) -> None:
        """Restate every instant on a clock ``delta`` seconds ahead (the tuples' own
        instants are the caller's to shift, by the same delta)."""
        self[:] = [(at + delta, seq, kind, s) for at, seq, kind, s in self]
        heapq.heapify(self)

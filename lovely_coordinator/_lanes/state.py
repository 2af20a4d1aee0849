"""The lanes' scheduling decisions, as a pure synchronous state machine.

A *lane* is a key (a room, a mailbox, a resident agent). It is idle, queued (waiting for
a slot) or running (one activation recorded as started). An activation is recorded the
moment it is granted a slot, before its task runs, so the slot count is never behind.
``pending`` says that a wake arrived which no started activation has served yet; it is
always true for a queued lane, so only running lanes store it.

Idle lanes are not stored at all: ``running`` and ``_queue`` hold every non-idle lane, and
a lane's state is simply which of the two holds its key. Every method runs to completion
without a suspension point, which is what keeps the invariants true between calls: in
particular :meth:`LanesState.finish` re-queues a re-woken lane *and* hands the freed slot
on in the same step, so the queue can overflow ``max_queued`` by one only inside it.

Nothing here knows about tasks, cancel scopes or clocks; the async runner in
:mod:`._lanes` does the waiting and reads these decisions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar, final

from .._base.errors import InvalidArgumentTypeError, LaneQueueFull, LanesClosed

__all__ = [
    "ActivationRecord",
    "LaneSnapshot",
    "LanesState",
    "LanesStatus",
    "StopReason",
    "WakeResult",
]

WakeResult = Literal["started", "queued", "coalesced"]
StopReason = Literal["cancel", "close", "timeout"]


@final
@dataclass(frozen=True, slots=True)
class LaneSnapshot:
    """One non-idle lane: ``state`` is ``"running"`` or ``"queued"``; ``pending`` is true
    when a wake is owed beyond the running activation (always true while queued)."""

    key: str
    state: Literal["running", "queued"]
    pending: bool


@final
@dataclass(frozen=True, slots=True)
class LanesStatus:
    """A snapshot of the lanes: counts, whether closed, and every non-idle lane (running
    ones in start order, then queued ones in queue order)."""

    running: int
    queued: int
    closed: bool
    lanes: tuple[LaneSnapshot, ...]


class ActivationRecord:
    """An activation the state machine has granted a slot to and not yet seen finish.

    The runner subclasses it to attach its own per-activation handles; the state machine
    only reads and writes the three fields below.

    Attributes:
        key: the lane.
        pending: a wake arrived after this activation started (one follow-up is owed).
        stop: the first stop reason written (``None`` while nobody asked it to stop).
    """

    __slots__ = ("key", "pending", "stop")

    def __init__(self, key: str) -> None:
        self.key = key
        self.pending = False
        self.stop: StopReason | None = None


R = TypeVar("R", bound=ActivationRecord)

_COALESCED: Final[tuple[WakeResult, None]] = ("coalesced", None)
_QUEUED: Final[tuple[WakeResult, None]] = ("queued", None)


@final
class LanesState(Generic[R]):
    """Which lanes run, which wait, and who gets a freed slot.

    Invariants (between calls; :meth:`check_invariants` asserts them):
        * a key is in at most one of ``running`` and ``_queue``;
        * ``len(running) <= max_concurrent``;
        * ``len(_queue) <= max_queued`` (when bounded);
        * ``not _queue or len(running) == max_concurrent``: a slot never stays free while a
          lane waits;
        * once closed, ``_queue`` is empty and no running record is pending, so nothing
          can start again.

    Costs: ``wake`` and ``cancel`` are O(1) (dict lookups; the queue is an ``OrderedDict``,
    so leaving it from the middle is O(1) too), and so is the hand-off in ``finish``.
    """

    __slots__ = ("_closed", "_max_concurrent", "_max_queued", "_new_record", "_queue", "running")

    def __init__(
        self,
        max_concurrent: int,
        max_queued: int | None,
        new_record: Callable[[str], R],
    ) -> None:
        """Create an empty, open state.

        Args:
            max_concurrent: slots (an int ≥ 1; validated by the caller).
            max_queued: bound on waiting lanes (an int ≥ 0), or None for no bound.
            new_record: builds the record of an activation starting for a key.
        """
        self._max_concurrent = max_concurrent
        self._max_queued = max_queued
        self._new_record = new_record
        self._closed = False
        # Running activations, in start order (a plain dict: never popped from the front).
        self.running: dict[str, R] = {}
        # Waiting lanes in FIFO order; popitem(last=False) and del are both O(1).
        self._queue: OrderedDict[str, None] = OrderedDict()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def queued(self) -> int:
        return len(self._queue)

    def wake(self, key: str) -> tuple[WakeResult, R | None]:
        """Record a wake for ``key``; returns the outcome and, if one started, its record.

        The caller must spawn the returned record's activation.

        Raises:
            InvalidArgumentTypeError: ``key`` is not a ``str``.
            LanesClosed: after :meth:`close`.
            LaneQueueFull: the lane is idle, it cannot start, and ``max_queued`` lanes wait.
        """
        if not isinstance(key, str):
            raise InvalidArgumentTypeError("Lane keys must be strings")
        if self._closed:
            raise LanesClosed(key)
        record = self.running.get(key)
        if record is not None:
            record.pending = True
            return _COALESCED
        queue = self._queue
        if key in queue:
            return _COALESCED
        # A newcomer never passes a lane that already waits, even if a slot looks free
        # (one cannot, by the invariant; the check keeps FIFO explicit).
        if not queue and len(self.running) < self._max_concurrent:
            return "started", self._start(key)
        if self._max_queued is not None and len(queue) >= self._max_queued:
            raise LaneQueueFull(key, self._max_queued)
        queue[key] = None
        return _QUEUED

    def cancel(self, key: str) -> R | None:
        """Drop what ``key`` owes: leave the queue, or clear a running lane's ``pending``.

        Returns the running record, which the caller must stop, or None when nothing runs.

        Raises:
            InvalidArgumentTypeError: ``key`` is not a ``str``.
        """
        if not isinstance(key, str):
            raise InvalidArgumentTypeError("Lane keys must be strings")
        queue = self._queue
        if key in queue:
            del queue[key]
            return None
        record = self.running.get(key)
        if record is not None:
            record.pending = False
        return record

    def close(self) -> list[R]:
        """Refuse later wakes, drop every queued lane and pending wake (first call only).

        Returns every activation still recorded, which the caller must stop; calling it
        again returns what still runs.
        """
        if not self._closed:
            self._closed = True
            self._queue.clear()
            for record in self.running.values():
                record.pending = False
        return list(self.running.values())

    def finish(self, record: R) -> R | None:
        """The activation of ``record`` has fully ended (finalizers and ``on_exit``).

        In one step: free its slot, re-queue its lane at the tail if it was woken while it
        ran, and hand the slot to the head of the queue. Returns the record that started
        in its place, if any, which the caller must spawn.
        """
        key = record.key
        assert self.running.get(key) is record, "finish() of an activation not recorded"
        del self.running[key]
        queue = self._queue
        if record.pending and not self._closed:
            # Not bounded by max_queued: the slot freed above is handed on just below, so
            # the queue is back within its bound before anyone can look.
            queue[key] = None
        if queue and not self._closed:
            next_key, _ = queue.popitem(last=False)
            return self._start(next_key)
        return None

    def _start(self, key: str) -> R:
        record = self._new_record(key)
        self.running[key] = record
        return record

    def status(self) -> LanesStatus:
        """Counts and every non-idle lane: running ones in start order, then the queue."""
        lanes = [LaneSnapshot(k, "running", r.pending) for k, r in self.running.items()]
        lanes.extend(LaneSnapshot(k, "queued", True) for k in self._queue)
        return LanesStatus(len(self.running), len(self._queue), self._closed, tuple(lanes))

    def check_invariants(self) -> None:
        """Assert the invariants in the class docstring (for tests)."""
        running, queue = self.running, self._queue
        assert running.keys().isdisjoint(queue.keys()), "a key is both running and queued"
        assert all(k == r.key for k, r in running.items()), "a record under a foreign key"
        assert len(running) <= self._max_concurrent, "more activations than slots"
        assert self._max_queued is None or len(queue) <= self._max_queued, "queue overflow"
        assert not queue or len(running) == self._max_concurrent, "a free slot while lanes wait"
        if self._closed:
            assert not queue, "a queued lane survived close"
            assert not any(r.pending for r in running.values()), "a pending wake survived close"

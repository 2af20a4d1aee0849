"""Statistics snapshots of a coordinator: pure reads of the scheduler's state.

Building a snapshot never changes what it describes: no timer is armed or fired, no heap
entry dropped, no bucket refilled (an available amount is computed at ``now``). A timed
closure whose instant has passed reads as open even if its wake-up has not run yet.
"""

from __future__ import annotations

from .._base.types import CoordinatorStatistics, ModelTuple, TupleStatistics
from .scheduler import Scheduler
from .tickets import TupleState
from .timers import LoopClock

__all__ = ["snapshot", "tuple_snapshot"]


def tuple_snapshot(state: TupleState, now: float, shift: float) -> TupleStatistics | None:
    """One tuple's statistics at ``now`` (home clock), or None when it is idle by then."""
    reopens_at = state.reopens_at
    is_open = state.open or (reopens_at is not None and reopens_at <= now)
    requests, tokens = state.request_bucket, state.token_bucket
    if is_open:
        reopens_at = None
        if not (
            state.queued
            or state.active
            or state.lent
            or state.limit is not None
            or requests
            or tokens
        ):
            return None  # idle once its due reopen runs: not listed, as if it had
    return TupleStatistics(
        state.tuple,
        state.active,
        state.queued,
        state.limit,
        is_open,
        None if reopens_at is None else reopens_at + shift,
        None if requests is None else requests.available(now),
        None if tokens is None else tokens.available(now),
        None if reopens_at is None else reopens_at - now,
        state.lent,
    )


def snapshot(scheduler: Scheduler, clock: LoopClock, residents: int) -> CoordinatorStatistics:
    """The coordinator's statistics now (call under its lock)."""
    now = clock.now()
    shift = clock.here_minus_home()
    tuples = []
    for state in scheduler.tuple_states():
        entry = tuple_snapshot(state, now, shift)
        if entry is not None:
            tuples.append(entry)
    tuples.sort(key=_by_tuple)
    return CoordinatorStatistics(
        max_concurrency=scheduler.limit,
        active=scheduler.active,
        queued=scheduler.queued,
        lent=scheduler.lent,
        residents=residents,
        tuples=tuple(tuples),
    )


def _by_tuple(statistics: TupleStatistics) -> ModelTuple:
    return statistics.tuple

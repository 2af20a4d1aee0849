"""Waiting in tests until a coordinator reaches a state: from a task, on its statistics
updates (no polling, no sleep); from a thread, by polling within a bound."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from lovely_coordinator import AgentCoordinator, CoordinatorStatistics

__all__ = ["until_statistics", "wait_until"]


async def until_statistics(
    coordinator: AgentCoordinator, holds: Callable[[CoordinatorStatistics], bool]
) -> None:
    """Wait until ``coordinator``'s statistics satisfy ``holds``: checked now, then on each
    change (every one, never coalesced). Bound it with the test's ``fail_after``."""
    ready = anyio.Event()

    def check(snapshot: CoordinatorStatistics) -> None:
        if holds(snapshot):
            ready.set()

    unsubscribe = coordinator.subscribe(check)
    try:
        # Subscribed before this first look and before any await: no update can be missed.
        if not holds(coordinator.statistics()):
            await ready.wait()
    finally:
        unsubscribe()


def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    """Block until ``condition()`` holds, polling every millisecond, for tests whose calls
    block threads (no event loop to wait on).

    Raises:
        AssertionError: it did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError("condition never became true")
        time.sleep(0.001)

"""Benchmarks of the agent coordinator (``python -m lovely_coordinator bench core``).

Every target is a ratio or a bound measured in the same run, so machine speed cancels:

1. contended hand-off: N tasks in one anyio task group through a cap of 8, against
   ``asyncio.Semaphore`` and ``anyio.CapacityLimiter`` spawned the same way;
2. uncontended acquire + release in one task, against ``anyio.CapacityLimiter``;
3. scaling of the pure scheduling path: reservations on 1k tuples with half of them
   closed, drained one grant at a time (``cancel()`` of the granted reservation hands the
   slot on), 10k against 100k;
4. memory per queued waiter at 100k, with ``tracemalloc``: a reservation, and a parked
   ``acquire`` (its task's own cost subtracted by parking the same tasks on an event);
5. what a waiter costs the collector and the interpreter: GC-tracked objects per parked
   ``permit()`` waiter (its task's included) and Python calls per contended hand-off,
   against ``asyncio.Semaphore`` measured the same way.

The timings 1 and 2 are reported twice: as they are, and with the collector frozen
(``gc.freeze()`` after setup), which takes the collections that the waiters' objects
trigger out of the figure, so that what remains is the scheduling code itself.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import anyio.lowlevel

from lovely_coordinator._agents.coordinator import create_agent_coordinator
from lovely_coordinator._agents.permits import AgentReservation
from lovely_coordinator._base.types import ModelTuple

from . import Figure

__all__ = ["run"]

_T = ModelTuple("bench", "model")


def _race(
    bodies: list[Callable[[], Awaitable[None]]], repeats: int, *, frozen: bool = False
) -> list[float]:
    """The best time of each body on asyncio, run interleaved so drift hits all alike.

    ``frozen``: with ``gc.freeze()`` after the setup (every object alive before the run
    is left out of collections), so collections cost only what the run allocates.
    """
    best = [float("inf")] * len(bodies)
    for _ in range(repeats):
        for i, body in enumerate(bodies):
            gc.collect()

            async def main(body: Callable[[], Awaitable[None]] = body) -> float:
                start = time.perf_counter()
                await body()
                return time.perf_counter() - start

            if frozen:
                gc.freeze()
            try:
                # The minimum is the least noisy estimate of what the code itself costs.
                best[i] = min(best[i], anyio.run(main, backend="asyncio"))
            finally:
                if frozen:
                    gc.unfreeze()
    return best


def _contended(
    make: Callable[[], Callable[[], AbstractAsyncContextManager[object]]], tasks: int
) -> Callable[[], Awaitable[None]]:
    """``tasks`` workers in one task group, each entering ``enter()`` around a checkpoint."""

    async def body() -> None:
        enter = make()

        async def worker() -> None:
            async with enter():
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for _ in range(tasks):
                tg.start_soon(worker)

    return body


def _uncontended(
    make: Callable[[], Callable[[], AbstractAsyncContextManager[object]]], loops: int
) -> Callable[[], Awaitable[None]]:
    async def body() -> None:
        enter = make()
        for _ in range(loops):
            async with enter():
                pass

    return body


def _coordinator(limit: int) -> Callable[[], AbstractAsyncContextManager[object]]:
    coordinator = create_agent_coordinator(limit)
    return lambda: coordinator.permit(_T)


def _same(
    lock: AbstractAsyncContextManager[object],
) -> Callable[[], AbstractAsyncContextManager[object]]:
    return lambda: lock


def _contended_figures(quick: bool) -> list[Figure]:
    tasks = 2_000 if quick else 20_000
    repeats = 3 if quick else 7
    bodies = [
        _contended(lambda: _coordinator(8), tasks),
        _contended(lambda: _same(asyncio.Semaphore(8)), tasks),
        _contended(lambda: _same(anyio.CapacityLimiter(8)), tasks),
    ]
    ours, semaphore, limiter = _race(bodies, repeats)
    still, still_semaphore, still_limiter = _race(bodies, repeats, frozen=True)
    note = "the semaphore honours no anyio cancel scope, order, context or statistics"
    return [
        Figure(f"contended hand-off, {tasks} tasks, cap 8", ours / tasks * 1e6, "us/task"),
        Figure("  vs asyncio.Semaphore", ours / semaphore, "x", 1.15, note),
        Figure("  vs anyio.CapacityLimiter", ours / limiter, "x", 1.0),
        Figure("  gc frozen", still / tasks * 1e6, "us/task"),
        Figure("    vs asyncio.Semaphore", still / still_semaphore, "x", 1.05),
        Figure("    vs anyio.CapacityLimiter", still / still_limiter, "x", 1.0),
    ]


def _uncontended_figures(quick: bool) -> list[Figure]:
    loops = 5_000 if quick else 50_000
    repeats = 3 if quick else 7
    bodies = [
        _uncontended(lambda: _coordinator(8), loops),
        _uncontended(lambda: _same(anyio.CapacityLimiter(8)), loops),
    ]
    ours, limiter = _race(bodies, repeats)
    still, still_limiter = _race(bodies, repeats, frozen=True)
    return [
        Figure("uncontended acquire+release", ours / loops * 1e6, "us/op"),
        Figure("  vs anyio.CapacityLimiter", ours / limiter, "x", 0.95),
        Figure("  gc frozen", still / loops * 1e6, "us/op"),
        Figure("    vs anyio.CapacityLimiter", still / still_limiter, "x", 0.95),
    ]


def _drain_time(reservations: int, tuples: int = 1_000) -> float:
    """Seconds to drain ``reservations`` through a cap of 1, one grant at a time."""
    coordinator = create_agent_coordinator(1)
    models = [ModelTuple("bench", f"m{i}") for i in range(tuples)]
    for model in models[::2]:
        coordinator.close_tuple(model)
    made: list[AgentReservation] = [
        coordinator.reserve(models[i % tuples]) for i in range(reservations)
    ]
    blocker = coordinator.reserve(_T, acceptance_order=1)
    blocker.activate()
    for reservation in made:
        reservation.activate()  # all eligible; only the open half can be granted
    runnable = [r for i, r in enumerate(made) if i % 2 == 1]
    gc.collect()
    start = time.perf_counter()
    blocker.cancel()
    for reservation in runnable:
        reservation.cancel()  # granted and unrun: the slot goes straight to the next one
    elapsed = time.perf_counter() - start
    assert coordinator.active_count == 0
    assert coordinator.queued_count == reservations - len(runnable)
    return elapsed


def _scaling_figures(quick: bool) -> list[Figure]:
    small, large = (1_000, 10_000) if quick else (10_000, 100_000)
    repeats = 3 if quick else 5
    t_small = t_large = float("inf")
    for _ in range(repeats):  # interleaved, so drift hits both alike
        t_small = min(t_small, _drain_time(small))
        t_large = min(t_large, _drain_time(large))
    return [
        Figure(f"drain {small} reservations, 1k tuples", t_small / (small / 2) * 1e6, "us/grant"),
        Figure(f"drain {large} reservations, 1k tuples", t_large / (large / 2) * 1e6, "us/grant"),
        Figure(f"  time({large}) / time({small})", t_large / t_small, "x", 15.0),
    ]


def _reservation_bytes(waiters: int) -> float:
    coordinator = create_agent_coordinator(1)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [coordinator.reserve(_T) for _ in range(waiters)]
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert coordinator.queued_count == len(kept)
    # The list holding the reservations is the benchmark's, not the coordinator's.
    return (after - before - 8 * len(kept)) / waiters


async def _parked_memory(
    waiters: int, park: Callable[[], Coroutine[Any, Any, object]], unblock: Callable[[], object]
) -> int:
    """Bytes allocated while ``waiters`` tasks are blocked in ``park()``."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    async with anyio.create_task_group() as tg:
        for _ in range(waiters):
            tg.start_soon(park)
        await anyio.wait_all_tasks_blocked()
        used = tracemalloc.get_traced_memory()[0] - before
        unblock()
    tracemalloc.stop()
    return used


def _parked_bytes(waiters: int) -> float:
    """Memory of a parked acquire beyond its task's own (measured parked on an event)."""

    async def main() -> float:
        coordinator = create_agent_coordinator(1)
        blocker = await coordinator.acquire(_T)

        async def acquire() -> None:
            async with coordinator.permit(_T):
                pass

        ours = await _parked_memory(waiters, acquire, blocker.release)
        event = anyio.Event()
        baseline = await _parked_memory(waiters, event.wait, event.set)
        return (ours - baseline) / waiters

    return anyio.run(main, backend="asyncio")


def _memory_figures(quick: bool) -> list[Figure]:
    waiters = 10_000 if quick else 100_000
    return [
        Figure(
            f"bytes per queued reservation at {waiters}", _reservation_bytes(waiters), "B", 1024
        ),
        Figure(f"bytes per parked acquire at {waiters}", _parked_bytes(waiters), "B", 1024),
    ]


async def _tracked_while_parked(
    waiters: int, park: Callable[[], Coroutine[Any, Any, object]], unblock: Callable[[], object]
) -> float:
    """GC-tracked objects per task while ``waiters`` tasks are blocked in ``park()``."""
    gc.collect()
    before = len(gc.get_objects())
    async with anyio.create_task_group() as tg:
        for _ in range(waiters):
            tg.start_soon(park)
        await anyio.wait_all_tasks_blocked()
        gc.collect()
        tracked = len(gc.get_objects()) - before
        unblock()
    # An object the runtime made once along the way (a cache entry) is not the waiters'.
    return round(tracked / waiters, 2)


def _objects_per_waiter(waiters: int) -> tuple[float, float]:
    """GC-tracked objects per parked waiter, its task's included: ``permit()`` and
    ``asyncio.Semaphore``, each behind one holder."""

    async def main() -> tuple[float, float]:
        coordinator = create_agent_coordinator(1)
        blocker = await coordinator.acquire(_T)

        async def permit() -> None:
            async with coordinator.permit(_T):
                pass

        ours = await _tracked_while_parked(waiters, permit, blocker.release)
        semaphore = asyncio.Semaphore(1)
        await semaphore.acquire()

        async def acquire() -> None:
            async with semaphore:
                pass

        theirs = await _tracked_while_parked(waiters, acquire, semaphore.release)
        return ours, theirs

    return anyio.run(main, backend="asyncio")


def _calls_per_hand_off(
    make: Callable[[], Callable[[], AbstractAsyncContextManager[object]]], tasks: int
) -> float:
    """Python calls (profiler ``call`` events: functions, and resumed coroutines) per
    task of the contended benchmark, the event loop's and anyio's included."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    async def main() -> None:
        body = _contended(make, tasks)
        sys.setprofile(count)
        try:
            await body()
        finally:
            sys.setprofile(None)

    anyio.run(main, backend="asyncio")
    return calls / tasks


def _cost_figures(quick: bool) -> list[Figure]:
    waiters = 2_000 if quick else 20_000
    ours, semaphore = _objects_per_waiter(waiters)
    tasks = 2_000 if quick else 10_000
    calls = _calls_per_hand_off(lambda: _coordinator(8), tasks)
    semaphore_calls = _calls_per_hand_off(lambda: _same(asyncio.Semaphore(8)), tasks)
    return [
        Figure("GC-tracked objects per parked waiter", ours, "objects", semaphore),
        Figure("  asyncio.Semaphore's (the target)", semaphore, "objects"),
        Figure("Python calls per contended hand-off", calls, "calls"),
        Figure("  asyncio.Semaphore's", semaphore_calls, "calls"),
    ]


def run(quick: bool) -> list[Figure]:
    """All figures of the core section (``quick``: smaller sizes, for a smoke run)."""
    return [
        *_contended_figures(quick),
        *_uncontended_figures(quick),
        *_scaling_figures(quick),
        *_memory_figures(quick),
        *_cost_figures(quick),
    ]

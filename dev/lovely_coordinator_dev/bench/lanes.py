"""Benchmark section ``lanes``: what a wake costs, and a many-keys throughput run.

* ``coalesced wake``: waking a lane that already runs (the hot path of a busy room).
  Target: at most 3 µs.
* ``started wake``: waking an idle lane with a free slot; includes spawning its task (not
  running it), so it is also shown relative to spawning a bare task with anyio
  (target: at most 1.5x).
* ``queued wake``: waking an idle lane while every slot is taken.
* ``100k keys x 3 wakes``: three rounds over 100k keys with ``max_concurrent=64`` and a
  trivial activation, yielding to the loop every 256 wakes; measured until the lanes are
  idle again. Reported as wakes and activations per second, on asyncio and on trio,
  and relative to running the same number of activations as bare tasks behind a
  ``CapacityLimiter(64)`` (target: at most 3x).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from functools import partial

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from lovely_coordinator.lanes import create_lanes

from . import Figure

__all__ = ["run"]


async def _park(release: anyio.Event, key: str) -> None:
    await release.wait()


def _spawner(task_group: TaskGroup, release: anyio.Event) -> Callable[[str], None]:
    def spawn(key: str) -> None:
        task_group.start_soon(_park, release, key)

    return spawn


def _per_call_us(call: Callable[[str], object], keys: list[str]) -> float:
    # Like timeit, with the garbage collector off: a collection triggered by the objects
    # a spawn allocates would otherwise dominate, and vary wildly between runs.
    gc.disable()
    try:
        start = time.perf_counter()
        for key in keys:
            call(key)
        return (time.perf_counter() - start) / len(keys) * 1e6
    finally:
        gc.enable()


async def _wake_costs(quick: bool) -> list[Figure]:
    n = 20_000 if quick else 200_000
    release = anyio.Event()
    activate = partial(_park, release)

    # Coalesced: one running lane, woken over and over (best of five runs).
    async with create_lanes(1, activate=activate) as lanes:
        lanes.wake("room")
        await anyio.wait_all_tasks_blocked()
        same = ["room"] * n
        coalesced = min(_per_call_us(lanes.wake, same) for _ in range(5))
        release.set()

    # Started: every wake finds a free slot and spawns a task. For scale, spawning a bare
    # task the same way (anyio's start_soon); both best of three, interleaved.
    keys = [f"room:{i}" for i in range(n // 10)]
    started = spawn = float("inf")
    for _ in range(3):
        release = anyio.Event()
        async with create_lanes(len(keys), activate=partial(_park, release)) as lanes:
            started = min(started, _per_call_us(lanes.wake, keys))
            release.set()
        release = anyio.Event()
        async with anyio.create_task_group() as tg:
            spawn = min(spawn, _per_call_us(_spawner(tg, release), keys))
            release.set()

    # Queued: the only slot is taken, every wake joins the queue.
    release = anyio.Event()
    keys = [f"room:{i}" for i in range(n)]
    async with create_lanes(1, activate=partial(_park, release)) as lanes:
        lanes.wake("busy")
        queued = _per_call_us(lanes.wake, keys)
        release.set()

    return [
        Figure("coalesced wake", coalesced, "µs", target=3.0, note="asyncio, best of 5"),
        Figure("started wake", started, "µs", note="asyncio, includes spawning the task"),
        Figure("  bare task spawn, for scale", spawn, "µs", note="anyio start_soon"),
        Figure("  started wake / bare spawn", started / spawn, "x", target=1.5),
        Figure("queued wake", queued, "µs", note="asyncio"),
    ]


async def _trivial(key: str) -> None:
    await anyio.lowlevel.checkpoint()


async def _bare_tasks(n: int) -> float:
    """Seconds to run ``n`` trivial activations as bare tasks (64 at a time), for scale."""
    limiter = anyio.CapacityLimiter(64)

    async def one(key: str) -> None:
        async with limiter:
            await _trivial(key)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, "room")
            if i % 256 == 255:
                await anyio.lowlevel.checkpoint()
    return time.perf_counter() - start


async def _throughput(n_keys: int) -> tuple[float, int]:
    activations = 0

    def count(outcome: object) -> None:
        nonlocal activations
        activations += 1

    keys = [f"room:{i}" for i in range(n_keys)]
    async with create_lanes(64, activate=_trivial, on_exit=count) as lanes:
        state = lanes._state  # the bench may peek: status() would copy 100k entries
        start = time.perf_counter()
        for _ in range(3):
            for i, key in enumerate(keys):
                lanes.wake(key)
                if i % 256 == 255:
                    await anyio.lowlevel.checkpoint()
        # Polling is fine here: nothing signals "idle", and a bench adds no API for it.
        while state.running or state.queued:  # noqa: ASYNC110
            await anyio.sleep(0.001)
        elapsed = time.perf_counter() - start
    return elapsed, activations


def run(quick: bool) -> list[Figure]:
    figures = anyio.run(_wake_costs, quick, backend="asyncio")
    n_keys = 10_000 if quick else 100_000
    label = f"{n_keys // 1000}k keys x 3 wakes, cap 64"
    for backend in ("asyncio", "trio"):
        elapsed, activations = anyio.run(_throughput, n_keys, backend=backend)
        bare = anyio.run(_bare_tasks, activations, backend=backend)
        figures += [
            Figure(f"{label}: wakes", 3 * n_keys / elapsed, "/s", note=backend),
            Figure(
                f"{label}: activations",
                activations / elapsed,
                "/s",
                note=f"{backend}, {activations:,} activations in {elapsed:.2f} s",
            ),
            Figure(
                "  time / same activations as bare tasks",
                elapsed / bare,
                "x",
                target=3.0,
                note=f"{backend}, tasks behind a CapacityLimiter(64): {bare:.2f} s",
            ),
        ]
    return figures

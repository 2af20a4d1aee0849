"""Benchmarks of model requests and budgets (``python -m lovely_coordinator bench budgets``).

Every target is a ratio or a count measured in the same run:

1. ``request()`` against ``permit()``, both uncontended, in one task, on asyncio;
2. pacing: 64 tasks hammering one tuple budgeted at 600 requests per minute for 10 s of
   trio's virtual time (``MockClock``): the requests granted against the budget's
   allowance (the full bucket plus 10 s of refill), and the timer wake-ups that granted
   nothing (the budget's one timer must fire only when its head is affordable);
3. scaling: requests waiting on their budgets across 1k tuples, drained one grant at a
   time through a cap of 1 once the budgets refill, 10k against 100k (O(log n)).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import anyio

from lovely_coordinator._agents.coordinator import create_agent_coordinator
from lovely_coordinator._agents.scheduler import Scheduler
from lovely_coordinator._agents.tickets import GRANTED, RequestTicket
from lovely_coordinator._base.types import ModelTuple

from . import Figure
from .core import _race, _uncontended

__all__ = ["run"]

_T = ModelTuple("bench", "model")


def _uncontended_figures(quick: bool) -> list[Figure]:
    loops = 5_000 if quick else 50_000
    repeats = 3 if quick else 7

    def requests() -> Callable[[], AbstractAsyncContextManager[object]]:
        coordinator = create_agent_coordinator(8)
        return lambda: coordinator.request(_T, tokens=100)

    def permits() -> Callable[[], AbstractAsyncContextManager[object]]:
        coordinator = create_agent_coordinator(8)
        return lambda: coordinator.permit(_T)

    ours, base = _race([_uncontended(requests, loops), _uncontended(permits, loops)], repeats)
    return [
        Figure("request() uncontended", ours / loops * 1e6, "us/op"),
        Figure("  vs permit() uncontended", ours / base, "x", 1.3),
    ]


def _pacing(seconds: float, tasks: int, per_minute: float) -> tuple[int, float, int, int]:
    """(granted, allowance, timer wake-ups, wake-ups that granted nothing)."""
    import trio.testing

    granted = 0
    fires = 0
    idle_fires = 0

    async def main() -> None:
        nonlocal granted, fires, idle_fires
        coordinator = create_agent_coordinator(tasks)
        coordinator.set_budget(_T, requests_per_minute=per_minute)
        scheduler = coordinator._scheduler
        timer = coordinator._core._timer
        fire = timer._fire

        def counting_fire() -> None:
            nonlocal fires, idle_fires
            active = scheduler.active
            fire()
            fires += 1
            if scheduler.active <= active:  # grants happen inside the fire, releases later
                idle_fires += 1

        timer._fire = counting_fire
        deadline = anyio.current_time() + seconds

        async def hammer() -> None:
            nonlocal granted
            while True:
                async with coordinator.request(_T):
                    if anyio.current_time() > deadline:
                        return
                    granted += 1

        with anyio.move_on_after(seconds + 1):
            async with anyio.create_task_group() as tg:
                for _ in range(tasks):
                    tg.start_soon(hammer)

    clock = trio.testing.MockClock(autojump_threshold=0)
    anyio.run(main, backend="trio", backend_options={"clock": clock})
    allowance = per_minute + per_minute / 60 * seconds
    return granted, allowance, fires, idle_fires


def _pacing_figures(quick: bool) -> list[Figure]:
    granted, allowance, fires, idle = _pacing(10.0, 64, 600.0)
    return [
        Figure("64 tasks, 600 RPM, 10 s virtual: granted", granted, "", note=f"of {allowance:g}"),
        Figure(
            "  |granted - allowance| / allowance", abs(granted - allowance) / allowance, "", 0.01
        ),
        Figure("  timer wake-ups", fires, ""),
        Figure("  wake-ups that granted nothing", idle, "", 0),
    ]


def _drain_time(waiting: int, tuples: int = 1_000) -> float:
    """Seconds to drain ``waiting`` budget-blocked requests, one grant at a time."""
    now = [0.0]
    scheduler = Scheduler(1, clock=lambda: now[0])
    per_tuple = waiting // tuples
    models = [ModelTuple("bench", f"m{i}") for i in range(tuples)]
    for model in models:
        # A bucket that holds exactly this tuple's requests, spent: every one waits.
        scheduler.learn_budget(model, float(per_tuple), None, 0.0, None)
    blocker = scheduler.enqueue(_T, 1, True, False)
    made: list[RequestTicket] = [
        scheduler.enqueue_request(models[i % tuples], None, False, 0, None) for i in range(waiting)
    ]
    now[0] = 60.0  # every bucket is full again, and every block's wake-up due
    gc.collect()
    start = time.perf_counter()
    scheduler.advance()
    scheduler.release(blocker)
    for ticket in made:  # granted in order, each inside the release of the one before
        assert ticket.state == GRANTED
        scheduler.release(ticket)
    elapsed = time.perf_counter() - start
    assert scheduler.active == 0
    assert scheduler.queued == 0
    return elapsed


def _scaling_figures(quick: bool) -> list[Figure]:
    small, large = (1_000, 10_000) if quick else (10_000, 100_000)
    repeats = 3 if quick else 5
    t_small = t_large = float("inf")
    for _ in range(repeats):  # interleaved, so drift hits both alike
        t_small = min(t_small, _drain_time(small))
        t_large = min(t_large, _drain_time(large))
    return [
        Figure(f"drain {small} budgeted requests, 1k tuples", t_small / small * 1e6, "us/grant"),
        Figure(f"drain {large} budgeted requests, 1k tuples", t_large / large * 1e6, "us/grant"),
        Figure(f"  time({large}) / time({small})", t_large / t_small, "x", 15.0),
    ]


def run(quick: bool) -> list[Figure]:
    """All figures of the budgets section (``quick``: smaller sizes, for a smoke run)."""
    return [*_uncontended_figures(quick), *_pacing_figures(quick), *_scaling_figures(quick)]

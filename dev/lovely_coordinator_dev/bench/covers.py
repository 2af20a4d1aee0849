"""Agents fanning out under their permits (``python -m lovely_coordinator bench covers``).

The shape of issue 17's app: agents each hold a permit and fan out three concurrent calls,
one to each of three models, and one model is blocked for a while: its gate is closed for
30 s, or its budget is spent (2 requests per minute: one more every 30 s). Every call
takes 1 s. Limits 1, 2 and 4; 1 and 8 agents. Time is trio's ``MockClock`` (virtual, so
every figure is exact, whatever the machine).

Each scenario runs twice on the same coordinator code:

* **coordinator**: every call enters ``request()`` at once; the blocked one waits inside
  (CONTRACT §9: its agent's permit is lent meanwhile, rule L in ``scheduler.py``);
* **reference**: the blocked call waits *outside* the coordinator, its agent's permit lent
  (``coordinator.lending()``), until it can be admitted (the gate's reopen; the budget's
  refills, in a first-come line of its own), then enters ``request()``.

Printed per scenario: the makespan, the mean finish of the unblocked calls (coordinator
against reference: target ≤ 1), and the slot-seconds held idle while runnable work
waited (a slot is taken, no call is in flight on it, and a waiter could use it): target 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import anyio

from lovely_coordinator._agents.coordinator import AgentCoordinator, create_agent_coordinator
from lovely_coordinator._agents.waiting import waiters
from lovely_coordinator._base.types import ModelTuple

from . import Figure

__all__ = ["Outcome", "run", "scenario"]

AGENT: Final = ModelTuple("bench", "agent")
OPEN: Final = (ModelTuple("bench", "open-a"), ModelTuple("bench", "open-b"))
BLOCKED: Final = ModelTuple("bench", "blocked")
CALL: Final = 1.0  # seconds per call
HELD: Final = 30.0  # the gate's closure; the budget's refill interval
STEP: Final = 0.25  # every event falls on this grid; the state is sampled between


@dataclass
class Outcome:
    """What one run measured (seconds of virtual time)."""

    makespan: float = 0.0
    unblocked: list[float] = field(default_factory=list)  # finish times of the open calls
    idle: float = 0.0  # slot-seconds held idle while runnable work waited


def scenario(blocked_by: str, limit: int, agents: int, *, reference: bool) -> Outcome:
    """Run one scenario (``blocked_by``: ``"gate"`` or ``"budget"``) on trio's MockClock."""
    import trio.testing

    outcome = Outcome()

    async def main() -> None:
        coordinator = create_agent_coordinator(limit)
        start = anyio.current_time()
        if blocked_by == "gate":
            coordinator.close_tuple(BLOCKED, reopen_after=HELD)
        else:
            coordinator.set_budget(BLOCKED, requests_per_minute=60 / HELD)
            for _ in range(2):  # the bucket holds 2: spend them
                async with coordinator.request(BLOCKED):
                    pass
        in_flight = [0]
        outside = _Outside(blocked_by, start)

        async def call(t: ModelTuple) -> None:
            if reference and t == BLOCKED:
                async with coordinator.lending():
                    await outside.wait()
            async with coordinator.request(t):
                in_flight[0] += 1
                await anyio.sleep(CALL)
                in_flight[0] -= 1
            if t != BLOCKED:
                outcome.unblocked.append(anyio.current_time() - start)

        async def agent() -> None:
            async with coordinator.permit(AGENT), anyio.create_task_group() as tg:
                for t in (BLOCKED, *OPEN):  # the blocked call first: it takes the cover
                    tg.start_soon(call, t)

        done = anyio.Event()

        async def sample() -> None:
            await anyio.sleep(STEP / 2)  # mid-step: the state is constant there
            while not done.is_set():
                outcome.idle += _wasted(coordinator, in_flight[0]) * STEP
                await anyio.sleep(STEP)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            async with anyio.create_task_group() as work:
                for _ in range(agents):
                    work.start_soon(agent)
            outcome.makespan = anyio.current_time() - start
            done.set()

    clock = trio.testing.MockClock(autojump_threshold=0)
    anyio.run(main, backend="trio", backend_options={"clock": clock})
    return outcome


class _Outside:
    """The reference's wait outside the coordinator: until the gate reopens, or until
    the budget's next refill that nobody ahead in this line took."""

    def __init__(self, blocked_by: str, start: float) -> None:
        self._blocked_by = blocked_by
        self._start = start
        self._arrived = 0

    async def wait(self) -> None:
        if self._blocked_by == "gate":
            await anyio.sleep_until(self._start + HELD)
            return
        self._arrived += 1
        await anyio.sleep_until(self._start + HELD * self._arrived)


def _wasted(coordinator: AgentCoordinator, in_flight: int) -> int:
    """Slots taken with no call in flight on them, up to the waiters that could use one."""
    with coordinator._lock:
        scheduler = coordinator._scheduler
        found = waiters(scheduler, coordinator._clock.now(), 0.0, per_tuple=1_000)
        idle = scheduler.active - in_flight
    runnable = sum(1 for w in found if w.reason == "capacity")
    return max(0, min(idle, runnable))


def run(quick: bool) -> list[Figure]:
    """All figures of the covers section (``quick`` runs 8 agents at limit 2 only)."""
    figures: list[Figure] = []
    cases = [(2, 8)] if quick else [(limit, n) for n in (1, 8) for limit in (1, 2, 4)]
    for blocked_by in ("gate", "budget"):
        for limit, agents in cases:
            ours = scenario(blocked_by, limit, agents, reference=False)
            ref = scenario(blocked_by, limit, agents, reference=True)
            mean, ref_mean = _mean(ours.unblocked), _mean(ref.unblocked)
            name = f"{blocked_by}, limit {limit}, {agents} agent{'s' * (agents > 1)}"
            figures += [
                Figure(name + ": makespan", ours.makespan, "s", note=f"ref {ref.makespan:g}"),
                Figure(
                    "  unblocked calls' mean finish / ref",
                    mean / ref_mean,
                    "x",
                    1.0,
                    note=f"{mean:.3g} s against {ref_mean:.3g} s",
                ),
                Figure("  idle slot-seconds", ours.idle, "slot-s", 0.0, note=f"ref {ref.idle:g}"),
            ]
    return figures


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)

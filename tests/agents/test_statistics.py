"""_agents/statistics: per-tuple lent permits, and a tuple whose only work is lent is listed."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from lovely_coordinator import AgentPermit, ModelTuple, TupleStatistics, create_agent_coordinator

A = ModelTuple("p", "a")
B = ModelTuple("p", "b")


@pytest.mark.anyio
async def test_lent_permits_are_counted_on_their_tuple() -> None:
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(1)
        child_started = anyio.Event()
        child_done = anyio.Event()

        async def child() -> None:
            async with coordinator.permit(B):
                child_started.set()
                await child_done.wait()

        async def parent() -> None:
            async with coordinator.permit(A):
                await coordinator.with_lent_permit(lambda: run_child())

        async def run_child() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)

        async with anyio.create_task_group() as tg:
            tg.start_soon(parent)
            await child_started.wait()
            statistics = coordinator.statistics()
            assert statistics.lent == 1
            assert statistics.tuples == (
                TupleStatistics(A, 0, 0, None, True, None, lent=1),  # listed: its work is lent
                TupleStatistics(B, 1, 0, None, True, None),
            )
            child_done.set()
            await wait_all_tasks_blocked()
        assert coordinator.statistics().tuples == ()
        coordinator._scheduler.check_invariants()


@pytest.mark.anyio
async def test_a_reacquiring_permit_counts_as_lent_until_it_is_held_again() -> None:
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(1)
        parent = await coordinator.acquire(A)
        other: list[AgentPermit] = []

        async def wait() -> None:
            other.append(await coordinator.acquire(B))  # takes the lent slot and keeps it

        async with anyio.create_task_group() as tg:
            tg.start_soon(parent.lend, wait)
            await wait_all_tasks_blocked()  # the lend ended: it waits to reacquire
            by_tuple = {t.tuple: t for t in coordinator.statistics().tuples}
            assert (by_tuple[A].lent, by_tuple[A].queued) == (1, 1)
            other[0].release()
        by_tuple = {t.tuple: t for t in coordinator.statistics().tuples}
        assert (by_tuple[A].lent, by_tuple[A].active) == (0, 1)
        parent.release()
        assert coordinator.statistics().tuples == ()

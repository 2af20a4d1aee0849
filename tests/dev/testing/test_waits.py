"""lovely_coordinator_dev.testing.waits: the waits the extensions' tests share."""

from __future__ import annotations

import threading

import anyio
import pytest
from lovely_coordinator_dev.testing.waits import until_statistics, wait_until

from lovely_coordinator import ModelTuple, create_agent_coordinator

pytestmark = pytest.mark.anyio

A = ModelTuple("openai", "gpt-4o")


async def test_until_statistics_returns_at_once_when_it_holds() -> None:
    coordinator = create_agent_coordinator(1)
    with anyio.fail_after(3):
        await until_statistics(coordinator, lambda s: s.queued == 0)


async def test_until_statistics_waits_for_the_change() -> None:
    coordinator = create_agent_coordinator(1)
    granted = anyio.Event()
    with anyio.fail_after(3):
        holder = await coordinator.acquire(A)

        async def queue() -> None:
            async with coordinator.permit(A):
                granted.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(queue)  # queues once it runs, after the wait below has begun
            await until_statistics(coordinator, lambda s: s.queued == 1)
            assert coordinator.statistics().queued == 1
            assert not granted.is_set()
            holder.release()
    assert granted.is_set()


def test_wait_until_returns_once_the_condition_holds() -> None:
    done = threading.Event()
    threading.Timer(0.01, done.set).start()
    wait_until(done.is_set, timeout=10)


def test_wait_until_fails_past_its_timeout() -> None:
    with pytest.raises(AssertionError, match=r"^condition never became true$"):
        wait_until(lambda: False, timeout=0.01)

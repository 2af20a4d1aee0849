"""``request_sync()`` and a RedisFleet: a blocking request for a tuple the fleet governs is
admitted by the fleet (on the fleet's own event loop), while tuples it does not govern are
admitted locally as always."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator import ModelTuple, create_agent_coordinator
from lovely_coordinator.redis import RedisFleet

from ..redis.helpers import anyio_backend

__all__ = ["anyio_backend"]  # fixture

pytestmark = pytest.mark.anyio

GPT = ModelTuple("openai", "gpt-4o")
CLAUDE = ModelTuple("anthropic", "claude")


async def test_a_governed_tuple_is_admitted_by_the_fleet_and_others_locally(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(4)
        async with RedisFleet(redis_client, coordinator, name="blocking", ttl=3) as fleet:
            await fleet.set_budget(GPT, requests_per_minute=600)

            def governed() -> int:
                with coordinator.request_sync(GPT, timeout=5):
                    return fleet.latest_statistics().tuples[0].in_flight

            def local() -> str:
                with coordinator.request_sync(CLAUDE, timeout=5) as call:
                    return call.tuple.model

            await anyio.to_thread.run_sync(governed)
            assert (await fleet.statistics()).tuples[0].requests_available == pytest.approx(
                599, abs=1
            )  # drawn from the fleet's budget
            assert await anyio.to_thread.run_sync(local) == "claude"
        stats = coordinator.statistics()
        assert (stats.active, stats.queued) == (0, 0)

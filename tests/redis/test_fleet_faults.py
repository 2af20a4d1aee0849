"""RedisFleet when the server restarts or cannot be reached (a private server per test)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator import ModelTuple, TupleSuspendedError, create_agent_coordinator
from lovely_coordinator.redis import RedisFleet

from .helpers import RECONNECTING, anyio_backend, own_server

__all__ = ["anyio_backend", "own_server"]  # fixtures

pytestmark = pytest.mark.anyio

GPT = ModelTuple("openai", "gpt-4o")
CLOSED = ModelTuple("openai", "closed")


async def test_restart_without_persistence_starts_buckets_empty(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    coordinator = create_agent_coordinator(8)
    client = redis_connect(own_server.url, **RECONNECTING)
    with anyio.fail_after(20):
        async with RedisFleet(client, coordinator, name="f", ttl=1) as fleet:
            await fleet.set_budget(GPT, requests_per_minute=600, tokens_per_minute=6000)
            await fleet.set_tuple_limit(GPT, 3)
            await fleet.close_tuple(("a", "b"), 600)
            async with coordinator.request(GPT, tokens=10):
                pass
            own_server.restart()
            with caplog.at_level(logging.WARNING, "lovely_coordinator.redis"):
                stats = await fleet.statistics()
            assert "lost the fleet's state" in caplog.text
            row = {row.tuple: row for row in stats.tuples}
            assert row[GPT].limit == 3
            requests, tokens = row[GPT].requests_available, row[GPT].tokens_available
            assert requests is not None
            assert requests < 5  # empty at the restart, 10 a second since
            assert tokens is not None
            assert tokens < 50
            assert not row[ModelTuple("a", "b")].open  # the closure is kept
            # The limit's units were forgotten: nothing is admitted before the quiet period.
            started = anyio.current_time()
            async with coordinator.request(GPT, tokens=10):
                assert anyio.current_time() - started > 0.5


async def test_unreachable_local_mode_admits_at_the_member_share(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    ca, cb = create_agent_coordinator(8), create_agent_coordinator(8)
    with anyio.fail_after(30):
        async with (
            RedisFleet(redis_connect(own_server.url, **RECONNECTING), ca, name="f", ttl=1) as a,
            RedisFleet(redis_connect(own_server.url, **RECONNECTING), cb, name="f", ttl=1),
        ):
            await a.set_tuple_limit(GPT, 2)
            await a.set_budget(GPT, tokens_per_minute=60_000)
            await a.close_tuple(CLOSED, 60)
            assert (await a.statistics()).members == 2
            own_server.kill()
            with pytest.raises(TupleSuspendedError):  # the closure it knows still holds
                async with ca.request(CLOSED, reject_on_closed_tuple=True):
                    pass
            with anyio.move_on_after(0.1) as scope:
                async with ca.request(CLOSED):
                    pass
            assert scope.cancelled_caught
            with caplog.at_level(logging.INFO, "lovely_coordinator.redis"):
                stats = await a.statistics()
                assert not stats.available
                inside = peak = 0

                async def call() -> None:
                    nonlocal inside, peak
                    async with ca.request(GPT, tokens=100) as request:
                        inside += 1
                        peak = max(peak, inside)
                        await anyio.sleep(0.05)
                        request.settle(50)
                        inside -= 1

                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(call)
                assert peak == 1  # half of the limit of 2
                assert "cannot be reached" in caplog.text
                own_server.start()
                while not (await a.statistics()).available:  # noqa: ASYNC110
                    await anyio.sleep(0.05)  # (the member rejoins at its next heartbeat)
                async with ca.request(GPT, tokens=10):
                    pass
                assert "reachable again" in caplog.text


async def test_unreachable_wait_mode_waits_for_redis(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    coordinator = create_agent_coordinator(8)
    client = redis_connect(own_server.url, **RECONNECTING)
    with anyio.fail_after(30):
        async with RedisFleet(client, coordinator, name="f", ttl=1, on_unavailable="wait") as f:
            await f.set_tuple_limit(GPT, 2)
            own_server.kill()
            with anyio.move_on_after(0.3) as scope:
                async with coordinator.request(GPT):
                    pass
            assert scope.cancelled_caught
            entered = anyio.Event()

            async def call() -> None:
                async with coordinator.request(GPT):
                    entered.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.sleep(0.2)
                assert not entered.is_set()
                own_server.start()
                await entered.wait()


async def test_a_loss_the_generation_marker_notices_empties_the_buckets(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    coordinator = create_agent_coordinator(8)
    with anyio.fail_after(10):
        async with RedisFleet(redis_connect(redis_server.url), coordinator, name="f") as fleet:
            await fleet.set_budget(GPT, requests_per_minute=600)
            async with coordinator.request(GPT):
                pass
            assert (await fleet.statistics()).tuples[0].requests_available == pytest.approx(
                599, abs=1
            )
            # As after a failover to a replica that missed writes: the marker was written
            # by another boot, so the bucket may be stale.
            await redis_client.hset("lovely-coordinator:generation", "run", "another")
            async with coordinator.request(GPT):
                pass
            available = (await fleet.statistics()).tuples[0].requests_available
            assert available is not None
            assert available < 5

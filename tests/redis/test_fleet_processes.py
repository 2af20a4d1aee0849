"""RedisFleet across processes: members are real processes (tests/redis/fleet_replica.py)
sharing one throwaway server, calling the local fake provider, killed and stopped."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.child import Child, running
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer
from lovely_coordinator_limits.testing import FakeProvider, Quota, serve

from lovely_coordinator import ModelTuple, create_agent_coordinator
from lovely_coordinator.redis import RedisFleet

from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # fixture

pytestmark = pytest.mark.anyio

REPLICA = str(Path(__file__).with_name("fleet_replica.py"))
M = ModelTuple("openai", "m")


@asynccontextmanager
async def parent(server: ThrowawayServer, ttl: float = 1.0) -> AsyncIterator[Any]:
    """The test's own member of fleet "f", to change the settings and read the state."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(server.url)
    coordinator = create_agent_coordinator(16)
    try:
        async with RedisFleet(client, coordinator, name="f", ttl=ttl) as fleet:
            yield coordinator, fleet
    finally:
        await client.aclose()


async def ready(children: list[Child]) -> None:
    for child in children:
        assert (await child.read())["ready"]


async def queued(fleet: RedisFleet, count: int) -> None:
    while (await fleet.statistics()).tuples[0].queued < count:  # noqa: ASYNC110
        await anyio.sleep(0.005)  # (the line is in Redis)


async def both(coordinator: Any) -> None:
    """Two requests at once, in tasks of their own (two units of the limit)."""

    async def one() -> None:
        async with coordinator.request(M):
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)


async def test_budget_and_limit_are_shared_by_processes(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    provider = FakeProvider(reply=None, latency=0.02)
    provider.limit("shared", Quota(requests_per_minute=60, tokens_per_minute=30_000))
    seconds = 2.0
    with serve(provider) as url, anyio.fail_after(60):
        async with parent(redis_server) as (_, fleet):
            t = ModelTuple("openai", "shared")
            # A little under the provider's quota: the fleet counts on the
            # server's clock and the provider on its own, so a bucket set at exactly the quota can
            # admit a call a few milliseconds before the provider has refilled it.
            await fleet.set_budget(t, requests_per_minute=54, tokens_per_minute=27_000)
            await fleet.set_tuple_limit(t, 3)
            argv = ["calls", redis_server.url, "f", "5", url, "shared", "4", str(seconds), "100"]
            async with running(*[[REPLICA, *argv] for _ in range(3)]) as children:
                await ready(children)
                for child in children:
                    child.send("go")
                reports = [await child.read() for child in children]
    ok = sum(r["ok"] for r in reports)
    assert sum(r["refused"] for r in reports) == 0
    # In flight at the provider: overlaps of [arrival, arrival + latency). (Its own counter
    # also counts the instant between sending an answer and its handler's end, while the
    # caller has moved on.)
    edges = sorted(
        [(s.at, 1) for s in provider.seen("shared")]
        + [(s.at + 0.02, -1) for s in provider.seen("shared")]
    )
    current = peak = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    assert peak <= 3
    # Oracle: never more than the bucket allowed (full, plus 1 a second meanwhile).
    assert 10 <= ok <= 60 + (seconds + 2)
    assert all(r["ok"] > 0 for r in reports)


async def test_order_of_arrival_holds_across_processes(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(30):
        async with parent(redis_server) as (_, fleet):
            await fleet.set_tuple_limit(M, 1)
            names = ["a", "b", "c"]
            argvs = [[REPLICA, "order", redis_server.url, "f", "5", "seen", n] for n in names]
            async with running(*argvs) as (a, b, c):
                await ready([a, b, c])
                a.send("go")
                assert await a.read() == {"in": "a"}
                for count, child in enumerate((b, c, a), start=1):
                    child.send("go")
                    await queued(fleet, count)
                for holder, nxt in ((a, b), (b, c), (c, a)):
                    holder.send("out")
                    assert await nxt.read() == {"in": names[[a, b, c].index(nxt)]}
                a.send("out")
            assert await redis_client.lrange("seen", 0, -1) == [b"a", b"b", b"c", b"a"]


async def test_a_killed_member_gives_its_units_back(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    ttl = 1.0
    with anyio.fail_after(30):
        async with parent(redis_server, ttl) as (coordinator, fleet):
            await fleet.set_tuple_limit(M, 2)
            argv = [REPLICA, "hold", redis_server.url, "f", str(ttl), "2"]
            async with running(argv) as [child]:
                await ready([child])
                assert await child.read() == {"held": 2}
                with anyio.move_on_after(0.2) as scope:
                    async with coordinator.request(M):
                        pass
                assert scope.cancelled_caught
                child.signal(signal.SIGKILL)
                killed = anyio.current_time()
                with anyio.fail_after(ttl + 1):
                    await both(coordinator)
                assert anyio.current_time() - killed > ttl / 2


async def test_a_stopped_member_loses_its_units_and_its_late_settle_changes_nothing(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    ttl = 1.0
    with anyio.fail_after(30):
        async with parent(redis_server, ttl) as (coordinator, fleet):
            await fleet.set_tuple_limit(M, 2)
            await fleet.set_budget(M, tokens_per_minute=100_000)
            argv = [REPLICA, "hold", redis_server.url, "f", str(ttl), "2"]
            async with running(argv) as [child]:
                await ready([child])
                assert await child.read() == {"held": 2}
                child.signal(signal.SIGSTOP)
                with anyio.fail_after(ttl + 1):
                    await both(coordinator)
                child.signal(signal.SIGCONT)
                child.send("settle")
                assert await child.read() == {"settled": True}
                stats = await fleet.statistics()
    tokens = stats.tuples[0].tokens_available
    assert tokens is not None
    assert tokens > 95_000  # the two late settles (+9,900 each) were ignored

"""Lost state on real servers: failover (with and without lag), a clock behind or ahead.

Each test runs a primary and a replica of the same server binary; the clients reach the
primary through a fault proxy, which is pointed at the replica when it is promoted
(``REPLICAOF NO ONE``), as a Sentinel-aware client or a DNS switch would. Lag: the replica
stops following (is promoted) before the grants it is to miss. (A paused replica misses
nothing: what the primary sent waits in the socket until it resumes.) The replica's
clock is set off with ``faketime`` (Debian's package), which CI installs: without it these
tests skip, except under ``CI=true``, where they fail. (Those servers are the embedded
Valkey, whatever the suite runs on: Debian's Redis does not start under faketime.)

The oracles: never more holders than the limit at any instant (a holder counts until its
``lost`` is set), fences that never go back, and no write of an older holder accepted
after a newer holder's fenced read.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.faults import FaultProxy, proxy_to
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer, embedded_executable

from lovely_coordinator.redis import FencedLog, RedisLocker, RedisPermitPool, StaleFenceError

from .helpers import RECONNECTING, anyio_backend, require_faketime, uptime_at_least

__all__ = ["anyio_backend"]  # a fixture

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TTL = 1.0


def replica_clock(offset: float) -> float:
    if offset:
        require_faketime()
    return offset


@contextlib.contextmanager
def primary_and_replica(clock_offset: float) -> Iterator[tuple[ThrowawayServer, ThrowawayServer]]:
    offset = replica_clock(clock_offset)
    # A clock set off needs the embedded Valkey (see server.py); both of one binary.
    binary = embedded_executable() if offset else None
    with (
        ThrowawayServer(binary) as primary,
        ThrowawayServer(binary, clock_offset=offset or None) as replica,
    ):
        replica.replicate(primary)
        yield primary, replica


@contextlib.asynccontextmanager
async def through_proxy(primary: ThrowawayServer) -> AsyncIterator[FaultProxy]:
    async with proxy_to(primary.port) as proxy:
        yield proxy


def fail_over(primary: ThrowawayServer, replica: ThrowawayServer, proxy: FaultProxy) -> None:
    """The primary dies; the replica takes over; the clients' connections are reset."""
    primary.kill()
    replica.promote()
    proxy.upstream_port = replica.port
    proxy.partition()
    proxy.heal()


@pytest.mark.parametrize(
    ("lag", "clock_offset"),
    [(True, -60.0), (True, 0.0), (False, 60.0)],
    ids=["lag-clock-behind", "lag", "in-sync-clock-ahead"],
)
async def test_a_failover_never_gives_a_lease_twice_nor_a_lower_fence(
    lag: bool,
    clock_offset: float,
    redis_connect: Callable[..., Any],
    redis_server: ThrowawayServer,
) -> None:
    with primary_and_replica(clock_offset) as (primary, replica), anyio.fail_after(30):
        async with through_proxy(primary) as proxy:
            client = redis_connect(proxy.url, **RECONNECTING)
            store = FencedLog(redis_connect(redis_server.url), f"failover-{lag}-{clock_offset}")
            await uptime_at_least(redis_connect(replica.url), 2)  # older than the ttl
            if lag:
                replica.promote()  # it stops following here, and misses the grant below
            a = await RedisLocker(client, ttl=TTL).acquire("c")
            if not lag:
                assert await redis_connect(primary.url).wait(1, 5000) == 1
            await store.claim(a.fence)
            fail_over(primary, replica, proxy)
            b = await RedisLocker(client, ttl=TTL).acquire("c")
            # At the grant, the old holder knew it had lost the lease (or gave it up).
            assert a.lost.is_set()
            assert b.fence > a.fence
            await store.claim(b.fence)  # the new holder's fenced read...
            with pytest.raises(StaleFenceError):
                await store.append(a.fence, "stale")  # ...refuses the old holder's write
            await b.release()
            await a.release()


async def test_after_a_failover_without_lag_the_holder_keeps_its_lease(
    redis_connect: Callable[..., Any],
) -> None:
    with primary_and_replica(-60.0) as (primary, replica), anyio.fail_after(30):
        async with through_proxy(primary) as proxy:
            client = redis_connect(proxy.url, **RECONNECTING)
            locker = RedisLocker(client, ttl=TTL)
            a = await locker.acquire("c")
            assert await redis_connect(primary.url).wait(1, 5000) == 1
            fail_over(primary, replica, proxy)
            waiting = anyio.Event()
            granted: list[Any] = []

            async def other() -> None:
                waiting.set()
                granted.append(await RedisLocker(client, ttl=TTL).acquire("c"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                await waiting.wait()
                with anyio.move_on_after(3 * TTL):  # several renewals on the new primary
                    await a.lost.wait()
                assert not a.lost.is_set()
                assert granted == []
                await a.release()
            assert granted[0].fence > a.fence
            await granted[0].release()


@pytest.mark.parametrize("clock_offset", [-60.0, 60.0], ids=["clock-behind", "clock-ahead"])
async def test_a_failover_with_lag_never_exceeds_the_pool_limit(
    clock_offset: float, redis_connect: Callable[..., Any]
) -> None:
    with primary_and_replica(clock_offset) as (primary, replica), anyio.fail_after(30):
        async with through_proxy(primary) as proxy:
            client = redis_connect(proxy.url, **RECONNECTING)
            await uptime_at_least(redis_connect(replica.url), 2)
            replica.promote()  # it stops following here, and misses the grant below
            pool = RedisPermitPool(client, name="p", limit=1, ttl=TTL)
            first = await pool.acquire()
            fail_over(primary, replica, proxy)
            second = await pool.acquire()
            assert first.lost.is_set()  # one holder at a time
            assert second.fence > first.fence
            await second.release()
            await first.release()

"""RedisPermitPool against a real throwaway server, in one process and across three."""

from __future__ import annotations

import logging
import math
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.child import running
from lovely_coordinator_dev.testing.faults import proxy_to
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator import InvalidArgumentError, InvalidArgumentTypeError
from lovely_coordinator.redis import RedisPermit, RedisPermitPool

from .helpers import RECONNECTING, anyio_backend, own_server, pool_key

__all__ = ["anyio_backend", "own_server"]  # fixtures

pytestmark = pytest.mark.anyio

REPLICA = str(Path(__file__).with_name("replica.py"))
KEYS = pool_key("p", "x").removesuffix(":x")


async def queued(client: Any) -> int:
    return int(await client.zcard(f"{KEYS}:queue"))


async def wait_until_queued(client: Any, count: int) -> None:
    # The queue lives in Redis, so watch it there.
    while await queued(client) < count:  # noqa: ASYNC110
        await anyio.sleep(0.005)


async def test_acquire_release_and_context_manager(redis_client: Any) -> None:
    with anyio.fail_after(5):
        pool = RedisPermitPool(redis_client, name="p", limit=2, ttl=5)
        first = await pool.acquire()
        async with pool.permit() as second:
            assert second.fence > first.fence
            assert (first.ticket, second.ticket) == (1, 2)
            assert await redis_client.zcard(f"{KEYS}:holders") == 2
        assert second.released
        await first.release()
        await first.release()  # idempotent
        assert await redis_client.zcard(f"{KEYS}:holders") == 0
        assert not first.lost.is_set()


async def test_cap_holds_across_pool_objects(redis_client: Any) -> None:
    with anyio.fail_after(10):
        pools = [RedisPermitPool(redis_client, name="p", limit=2, ttl=5) for _ in range(3)]
        inside = peak = done = 0

        async def task(pool: RedisPermitPool) -> None:
            nonlocal inside, peak, done
            async with pool.permit():
                inside += 1
                peak = max(peak, inside)
                await anyio.sleep(0.003)
                inside -= 1
            done += 1

        async with anyio.create_task_group() as tg:
            for pool in pools:
                for _ in range(8):
                    tg.start_soon(task, pool)
        assert (peak, done) == (2, 24)
        assert await redis_client.zcard(f"{KEYS}:queue") == 0


async def test_waiters_are_served_in_ticket_order(redis_client: Any) -> None:
    with anyio.fail_after(10):
        pools = [RedisPermitPool(redis_client, name="p", limit=1, ttl=5) for _ in range(3)]
        holder = await pools[0].acquire()
        order: list[int] = []

        async def waiter(pool: RedisPermitPool, index: int) -> None:
            async with pool.permit():
                order.append(index)

        async with anyio.create_task_group() as tg:
            for index in range(6):
                tg.start_soon(waiter, pools[index % 3], index)
                await wait_until_queued(redis_client, index + 1)
            await holder.release()
        assert order == list(range(6))  # limit 1: no tolerance at all


async def test_cancelled_acquire_leaves_no_place_and_no_permit(redis_client: Any) -> None:
    with anyio.fail_after(5):
        pool = RedisPermitPool(redis_client, name="p", limit=1, ttl=5)
        holder = await pool.acquire()
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pool.acquire)
                await wait_until_queued(redis_client, 1)
                scope.cancel()
        assert await queued(redis_client) == 0
        assert await redis_client.zcard(f"{KEYS}:waiters") == 0
        await holder.release()
        assert await redis_client.zcard(f"{KEYS}:holders") == 0


async def test_permit_is_lost_when_its_entry_is_gone(redis_client: Any) -> None:
    with anyio.fail_after(5):
        permit = await RedisPermitPool(redis_client, name="p", limit=1, ttl=0.3).acquire()
        await redis_client.delete(f"{KEYS}:holders")
        await permit.lost.wait()
        await permit.release()


async def test_permits_renew_past_their_ttl(redis_client: Any) -> None:
    with anyio.fail_after(5):
        pool = RedisPermitPool(redis_client, name="p", limit=1, ttl=0.3)
        async with pool.permit() as permit:
            await anyio.sleep(1.0)
            assert not permit.lost.is_set()
            assert await redis_client.zcard(f"{KEYS}:holders") == 1


async def test_killed_process_permits_are_reclaimed_within_ttl(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(20):
        ttl = 1.0
        argv = (REPLICA, "pool-hold", redis_server.url, "p", "2", str(ttl), "2")
        async with running(argv) as (child,):
            fences = (await child.read())["fences"]
            child.signal(signal.SIGKILL)
            killed_at = anyio.current_time()
            pool = RedisPermitPool(redis_client, name="p", limit=2, ttl=ttl)
            first, second = await pool.acquire(), await pool.acquire()
            assert anyio.current_time() - killed_at <= ttl + 1.0
            assert min(first.fence, second.fence) > max(fences)
            await first.release()
            await second.release()


async def test_dead_waiter_at_the_head_is_skipped(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(20):
        ttl = 1.0
        pool = RedisPermitPool(redis_client, name="p", limit=1, ttl=ttl)
        holder = await pool.acquire()
        argv = (REPLICA, "pool-hold", redis_server.url, "p", "1", str(ttl), "1")
        async with running(argv) as (child,):
            await wait_until_queued(redis_client, 1)  # the child waits at the head
            child.signal(signal.SIGKILL)
            killed_at = anyio.current_time()
            await holder.release()
            async with pool.permit():
                assert anyio.current_time() - killed_at <= ttl + 1.0


async def test_three_processes_never_exceed_the_cap_and_stay_fifo(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(60):
        limit = 5
        argv = (REPLICA, "pool-run", redis_server.url, "p", str(limit), "5", "50")
        async with running(argv, argv, argv) as children:
            grants = [g for child in children for g in (await child.read())["grants"]]
        assert len(grants) == 150
        holders = [h for _, _, h in grants]
        assert max(holders) <= limit
        assert max(holders) == limit  # the cap was actually reached
        # FIFO within the free window: when ticket t is granted, at most limit - 1 earlier
        # tickets are still waiting (the fence orders the grants on the server clock).
        by_grant = sorted(grants)
        tickets = [t for _, t, _ in by_grant]
        assert sorted(tickets) == list(range(1, 151))
        for index, ticket in enumerate(tickets):
            overtaken = sum(1 for later in tickets[index + 1 :] if later < ticket)
            assert overtaken <= limit - 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "", "limit": 1}, "name must be a nonempty string"),
        ({"name": "\ud800", "limit": 1}, "name must be a string the client can encode as utf-8"),
        (
            {"name": "p", "limit": 1, "prefix": "\ud800"},
            "prefix must be a string the client can encode as utf-8",
        ),
        ({"name": "p", "limit": 0}, "limit must be a positive integer up to 1e9"),
        ({"name": "p", "limit": True}, "limit must be a positive integer up to 1e9"),
        ({"name": "p", "limit": 1.0}, "limit must be a positive integer up to 1e9"),
        # The scripts would pass it on as "1e+20", which the server refuses midway.
        ({"name": "p", "limit": 10**20}, "limit must be a positive integer up to 1e9"),
        ({"name": "p", "limit": 1, "ttl": 0}, r"ttl must be a number of seconds from 0\.01 to 1e9"),
        (
            {"name": "p", "limit": 1, "ttl": 1e16},
            r"ttl must be a number of seconds from 0\.01 to 1e9",
        ),
        (
            {"name": "p", "limit": 1, "ttl": math.nan},
            r"ttl must be a number of seconds from 0\.01 to 1e9",
        ),
    ],
)
def test_bad_arguments(redis_client: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"^{message}$"):
        RedisPermitPool(redis_client, **kwargs)


@pytest.mark.parametrize("client", [None, "redis://127.0.0.1:6379", object()])
def test_a_client_that_is_not_an_asyncio_redis_client_is_refused(client: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"^client must be a redis.asyncio.Redis"):
        RedisPermitPool(client, name="p", limit=1)


async def test_the_largest_limit_grants_and_releases(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pool = RedisPermitPool(redis_client, name="p", limit=10**9, ttl=5)
    with anyio.fail_after(10), caplog.at_level(logging.WARNING, "lovely_coordinator.redis"):
        permit = await pool.acquire()
        await permit.release()  # a script failing midway would be logged, and lapse
        assert await redis_client.zcard(pool_key("p", "holders")) == 0
    assert caplog.records == []


async def test_an_announcement_before_the_ticket_is_known_still_wakes(redis_client: Any) -> None:
    with anyio.fail_after(5):
        pool = RedisPermitPool(redis_client, name="p", limit=1, ttl=5)
        async with pool._watching() as watch:
            pool._on_announce("1")  # arrives before the attempt's reply
            assert watch.event.is_set()
            watch.reset()
            watch.ticket = 5
            pool._on_announce("4")
            assert not watch.event.is_set()  # meant for earlier tickets only
            pool._on_announce("5")
            assert watch.event.is_set()


async def test_a_restart_without_persistence_grants_nothing_while_old_permits_may_run(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(30):
        ttl, limit = 1.5, 2
        argv = (REPLICA, "pool-hold", own_server.url, "p", str(limit), str(ttl), str(limit))
        async with running(argv) as (holder,):
            old_fences = (await holder.read())["fences"]
            own_server.restart()  # the server forgets both permits; their holder runs on
            restarted_at = anyio.current_time()
            pool = RedisPermitPool(redis_connect(own_server.url, **RECONNECTING), name="p",
                                   limit=limit, ttl=ttl)  # fmt: skip
            permits = [await pool.acquire(), await pool.acquire()]
            granted_at = anyio.current_time()
            deadlines = [(await holder.read())["deadline"] for _ in range(limit)]
        # Never more than the limit: both old permits had lapsed before the new grants.
        assert max(deadlines) < granted_at
        assert granted_at - restarted_at >= ttl - 0.25
        assert min(p.fence for p in permits) > max(old_fences)
        for permit in permits:
            await permit.release()


async def test_a_permit_that_arrives_after_its_ttl_is_never_returned(
    redis_server: ThrowawayServer,
    redis_client: Any,
    redis_connect: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(20):
        ttl = 0.2
        async with proxy_to(redis_server.port) as proxy:
            slow = RedisPermitPool(redis_connect(proxy.url), name="p", limit=1, ttl=ttl)
            await (await slow.acquire()).release()  # connections made, version checked
            proxy.delay(0.3)  # replies only: granted at once, known 0.3 s later
            other = RedisPermitPool(redis_client, name="p", limit=1, ttl=5)
            returned: list[RedisPermit] = []

            async def slow_acquire() -> None:
                returned.append(await slow.acquire())

            with caplog.at_level(logging.WARNING, "lovely_coordinator.redis"):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(slow_acquire)
                    holder = await other.acquire()  # once the first grant lapsed
                    while "after its ttl had run out" not in caplog.text:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                    assert not returned  # limit 1: never two holders
                    proxy.heal()
                    await anyio.sleep(0.05)
                    assert not returned
                    await holder.release()
        (permit,) = returned
        assert permit.fence > holder.fence
        assert not permit.lost.is_set()
        assert await redis_client.zcard(f"{KEYS}:holders") == 1
        await permit.release()

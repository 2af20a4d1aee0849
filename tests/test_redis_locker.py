"""RedisLocker / RedisLease against a real throwaway server (asyncio-only)."""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio
import redis.exceptions

from lovely_coordinator import InvalidArgumentError
from lovely_coordinator._redis.child import Child
from lovely_coordinator._redis.server import ThrowawayServer
from lovely_coordinator.redis import RedisLease, RedisLocker

REPLICA = str(Path(__file__).with_name("redis_replica.py"))


def reconnecting_client(url: str) -> Any:
    """A client that retries a command once its pooled connection died with the server."""
    return redis.asyncio.Redis.from_url(url, retry_on_error=[redis.exceptions.ConnectionError])


@pytest.fixture
def own_server() -> Iterator[ThrowawayServer]:
    """A private server this test may kill, pause or restart."""
    with ThrowawayServer() as server:
        yield server


@pytest.mark.asyncio
async def test_acquire_release_and_context_manager(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=5)
        lease = await locker.acquire("c")
        assert isinstance(lease, RedisLease)
        assert lease.fence > 0
        assert not lease.lost.is_set()
        assert await redis_client.exists("lovely:{c}:lock") == 1
        async with lease:
            pass
        assert lease.released
        assert await redis_client.exists("lovely:{c}:lock") == 0
        await lease.release()  # idempotent
        assert not lease.lost.is_set()


@pytest.mark.asyncio
async def test_fences_strictly_increase_across_grants(redis_client: Any) -> None:
    with anyio.fail_after(10):
        locker = RedisLocker(redis_client, ttl=5)
        fences = []
        for _ in range(50):
            async with await locker.acquire("c") as lease:
                fences.append(lease.fence)
        assert fences == sorted(set(fences))


@pytest.mark.asyncio
async def test_fence_survives_server_restart_without_persistence(
    own_server: ThrowawayServer,
) -> None:
    with anyio.fail_after(10):
        client = reconnecting_client(own_server.url)
        locker = RedisLocker(client, ttl=5)
        async with await locker.acquire("c") as before:
            pass
        own_server.restart()
        assert await client.exists("lovely:{c}:fence") == 0  # the counter is gone
        async with await locker.acquire("c") as after:
            assert after.fence > before.fence
        await client.aclose()


@pytest.mark.asyncio
async def test_waiter_is_woken_by_release_not_by_polling(redis_client: Any) -> None:
    with anyio.fail_after(5):
        # A long ttl: without the release notification the waiter would sleep ~1 s.
        holder = await RedisLocker(redis_client, ttl=30).acquire("c")
        other_replica = RedisLocker(redis_client, ttl=30)
        granted: list[RedisLease] = []
        got_it = anyio.Event()

        async def wait_for_it() -> None:
            granted.append(await other_replica.acquire("c"))
            got_it.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_it)
            # The waiter's state lives in Redis, so watch it there.
            while not await redis_client.exists("lovely:{c}:waiting"):  # noqa: ASYNC110
                await anyio.sleep(0.005)
            await anyio.sleep(0.05)  # let the waiter park on its re-check timer
            with anyio.fail_after(0.5):  # far below the 1 s re-check
                await holder.release()
                await got_it.wait()
        assert granted[0].fence > holder.fence
        await granted[0].release()


@pytest.mark.asyncio
async def test_turns_are_exclusive_among_many_waiters(redis_client: Any) -> None:
    with anyio.fail_after(10):
        lockers = [RedisLocker(redis_client, ttl=5) for _ in range(3)]
        inside = 0
        fences: list[int] = []

        async def worker(locker: RedisLocker) -> None:
            nonlocal inside
            for _ in range(5):
                async with await locker.acquire("c") as lease:
                    inside += 1
                    assert inside == 1
                    fences.append(lease.fence)
                    await anyio.sleep(0.002)
                    inside -= 1

        async with anyio.create_task_group() as tg:
            for locker in lockers:
                for _ in range(2):
                    tg.start_soon(worker, locker)
        assert len(fences) == 30
        assert fences == sorted(set(fences))


@pytest.mark.asyncio
async def test_release_deletes_only_its_own_lease(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=5)
        old = await locker.acquire("c")
        await redis_client.delete("lovely:{c}:lock")  # as if it lapsed
        new = await locker.acquire("c")
        assert new.fence > old.fence
        await old.release()  # never raises for a lapsed lease
        assert await redis_client.exists("lovely:{c}:lock") == 1
        await new.release()
        assert await redis_client.exists("lovely:{c}:lock") == 0


@pytest.mark.asyncio
async def test_lapsed_lease_is_lost_at_next_renewal(redis_client: Any) -> None:
    with anyio.fail_after(5):
        lease = await RedisLocker(redis_client, ttl=0.3).acquire("c")
        await redis_client.delete("lovely:{c}:lock")
        await lease.lost.wait()
        await lease.release()


@pytest.mark.asyncio
async def test_renewal_keeps_the_lease_past_its_ttl(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=0.3)
        lease = await locker.acquire("c")
        await anyio.sleep(1.0)
        assert not lease.lost.is_set()
        assert await redis_client.exists("lovely:{c}:lock") == 1
        await lease.release()


@pytest.mark.asyncio
async def test_client_pause_beyond_deadline_loses_the_lease(redis_client: Any) -> None:
    with anyio.fail_after(10):
        ttl = 0.5
        lease = await RedisLocker(redis_client, ttl=ttl).acquire("c")
        await anyio.sleep(0.2)
        # The last renewal was sent before the pause began, so lost must come within ttl.
        paused_at = anyio.current_time()
        await redis_client.client_pause(1500, all=True)
        await lease.lost.wait()
        assert anyio.current_time() - paused_at < ttl
        await lease.release()  # no error once the server answers again


@pytest.mark.asyncio
async def test_different_prefixes_are_independent(redis_client: Any) -> None:
    with anyio.fail_after(5):
        a = await RedisLocker(redis_client, ttl=5, prefix="a:").acquire("c")
        b = await RedisLocker(redis_client, ttl=5, prefix="b:").acquire("c")
        await a.release()
        await b.release()


@pytest.mark.asyncio
async def test_cancelled_waiter_leaves_nothing_behind(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=5)
        holder = await locker.acquire("c")
        with anyio.move_on_after(0.1):
            await locker.acquire("c")
        await holder.release()
        assert await redis_client.exists("lovely:{c}:lock") == 0
        async with await locker.acquire("c"):
            pass


@pytest.mark.asyncio
async def test_cancelled_acquire_whose_reply_was_lost_cleans_up(
    own_server: ThrowawayServer,
) -> None:
    with anyio.fail_after(10):
        client = redis.asyncio.Redis.from_url(own_server.url)
        await client.ping()
        locker = RedisLocker(client, ttl=30)
        own_server.pause()
        try:
            # The request reaches the socket, the server grants it when it resumes, but the
            # caller has given up by then: the clean-up must delete that grant.
            with anyio.move_on_after(0.2):
                await locker.acquire("c")
        finally:
            own_server.resume()
        async with await locker.acquire("c") as lease:  # not stuck behind a 30 s ghost
            assert lease.fence > 0
        assert await client.exists("lovely:{c}:lock") == 0
        await client.aclose()


@pytest.mark.asyncio
async def test_killed_holder_expires_within_ttl_and_next_fence_is_higher(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(20):
        ttl = 1.0
        child = await Child.start(REPLICA, "hold", redis_server.url, "lovely:", "c", str(ttl))
        try:
            fence = (await child.read())["fence"]
            child.signal(signal.SIGKILL)
            killed_at = anyio.current_time()
            lease = await RedisLocker(redis_client, ttl=ttl).acquire("c")
            assert anyio.current_time() - killed_at <= ttl + 0.1
            assert lease.fence > fence
            await lease.release()
        finally:
            await child.kill()


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan, 0.001])
def test_bad_ttl(ttl: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^ttl must be a finite number"):
        RedisLocker(object(), ttl=ttl)


@pytest.mark.asyncio
async def test_bad_conversation_id(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client)
        with pytest.raises(InvalidArgumentError, match=r"^conversation_id must be a nonempty"):
            await locker.acquire("")

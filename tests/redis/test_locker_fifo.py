"""Fair leases: a conversation's lease goes to its waiters in the order they asked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator._redis import scripts
from lovely_coordinator.redis import RedisLease, RedisLocker

from .helpers import anyio_backend, lock_keys, run_id

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio

KEYS = lock_keys("c")


class Line:
    """The lease scripts of conversation ``c``, called as a process would."""

    def __init__(self, client: Any, fresh: str) -> None:
        self.client = client
        self.fresh = fresh
        self._acquire = client.register_script(scripts.LOCK_ACQUIRE)
        self._release = client.register_script(scripts.LOCK_RELEASE)

    async def acquire(self, owner: str) -> list[int]:
        keys = [KEYS["lock"], KEYS["fence"], KEYS["waiting"], KEYS["marker"]]
        keys += [self._tombstone(owner), KEYS["beats"], KEYS["ticket"]]
        reply: list[int] = await self._acquire(keys, [owner, 5000, 10**7, self.fresh, 5000])
        return reply

    async def release(self, owner: str, *, abandon: bool = False) -> int:
        keys = [KEYS["lock"], KEYS["waiting"], self._tombstone(owner), KEYS["beats"]]
        return int(await self._release(keys, [owner, "ch", "c", 5000 if abandon else 0]))

    def _tombstone(self, owner: str) -> str:
        return KEYS["lock"].replace(":lock", f":abandoned:{owner}")


@pytest.fixture
async def line(redis_client: Any) -> Line:
    return Line(redis_client, await run_id(redis_client))


async def test_a_free_lease_goes_to_the_head_of_the_line(line: Line) -> None:
    with anyio.fail_after(5):
        assert (await line.acquire("aa"))[0] == scripts.GRANTED
        assert (await line.acquire("bb"))[::2] == [scripts.WAITING, 2]  # aa had ticket 1
        assert (await line.acquire("cc"))[::2] == [scripts.WAITING, 3]
        assert await line.release("aa") == 1
        # cc comes first, but bb asked first: cc waits, bb is granted.
        assert (await line.acquire("cc"))[:3] == [scripts.WAITING, -1, 3]
        assert (await line.acquire("bb"))[0] == scripts.GRANTED
        assert await line.release("bb") == 1
        assert (await line.acquire("cc"))[0] == scripts.GRANTED


async def test_a_place_whose_heartbeat_lapsed_leaves_the_line(
    line: Line, redis_client: Any
) -> None:
    with anyio.fail_after(5):
        await line.acquire("aa")
        await line.acquire("bb")
        await line.acquire("cc")
        await redis_client.zadd(KEYS["beats"], {"bb": 0}, xx=True)  # bb's process died
        await line.release("aa")
        assert (await line.acquire("cc"))[0] == scripts.GRANTED
        assert await redis_client.zrange(KEYS["waiting"], 0, -1) == []


async def test_a_place_given_up_wakes_the_line_and_leaves_it(line: Line, redis_client: Any) -> None:
    with anyio.fail_after(5):
        pubsub = redis_client.pubsub()
        await pubsub.subscribe("ch")
        await pubsub.get_message(timeout=5)  # the confirmation
        await line.acquire("aa")
        await line.acquire("bb")
        await line.acquire("cc")
        assert await line.release("bb", abandon=True) == 0
        message = await pubsub.get_message(timeout=5)
        assert message is not None
        assert message["data"] == b"c"
        await line.release("aa")
        assert (await line.acquire("cc"))[0] == scripts.GRANTED
        await pubsub.aclose()


async def test_the_line_expires_once_nobody_stands_in_it(line: Line, redis_client: Any) -> None:
    with anyio.fail_after(5):
        await line.acquire("aa")
        await line.acquire("bb")
        for key in ("waiting", "beats", "ticket"):
            assert 0 < await redis_client.pttl(KEYS[key]) <= 10_000


async def test_waiters_are_granted_in_the_order_they_asked(
    redis_server: ThrowawayServer, redis_connect: Callable[..., Any], redis_client: Any
) -> None:
    with anyio.fail_after(20):
        holder = await RedisLocker(redis_client, ttl=5).acquire("c")
        order: list[int] = []

        async def wait(i: int) -> None:
            # Each waiter on its own connection, as if in its own process.
            locker = RedisLocker(redis_connect(redis_server.url), ttl=5)
            lease: RedisLease = await locker.acquire("c")
            order.append(i)
            await lease.release()

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(wait, i)
                while await redis_client.zcard(KEYS["waiting"]) < i + 1:  # noqa: ASYNC110
                    await anyio.sleep(0.002)  # (its place is taken on the server)
            await holder.release()
        assert order == list(range(6))


async def test_a_holder_that_asks_again_goes_to_the_back(
    redis_server: ThrowawayServer, redis_connect: Callable[..., Any], redis_client: Any
) -> None:
    with anyio.fail_after(20):
        a = RedisLocker(redis_client, ttl=5)
        b = RedisLocker(redis_connect(redis_server.url), ttl=5)
        lease = await a.acquire("c")
        got: list[str] = []

        async def b_waits() -> None:
            async with await b.acquire("c"):
                got.append("b")

        async def a_again() -> None:
            async with await a.acquire("c"):
                got.append("a")

        async with anyio.create_task_group() as tg:
            tg.start_soon(b_waits)
            while not await redis_client.exists(KEYS["waiting"]):  # noqa: ASYNC110
                await anyio.sleep(0.002)
            await lease.release()
            tg.start_soon(a_again)
        assert got == ["b", "a"]

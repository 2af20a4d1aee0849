"""The permit pool's scripts, driven directly on a real server.

The announcements (who is told that a permit may be free, and when) are pinned exactly:
a lost announcement only shows as latency in the pool's own tests (every waiter also
re-checks on a timer), so these read the channel itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator._redis import pool_scripts, scripts

from .helpers import anyio_backend, pool_key, pool_keys, run_id

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio

KEYS = pool_keys("p")
CHANNEL = pool_key("p", "released")


def tombstone(member: str) -> str:
    return pool_key("p", f"abandoned:{member}")


class Pool:
    """The pool scripts of pool ``p`` with limit ``limit``, called as a process would."""

    def __init__(self, client: Any, limit: int, fresh: str) -> None:
        self.client = client
        self.limit = limit
        self.fresh = fresh
        self._acquire = client.register_script(pool_scripts.POOL_ACQUIRE)
        self._leave = client.register_script(pool_scripts.POOL_LEAVE)

    async def acquire(self, member: str, ttl_ms: int = 60_000) -> list[int]:
        args: list[str | int] = [member, self.limit, ttl_ms, ttl_ms, 60_000, CHANNEL, self.fresh]
        reply: list[int] = await self._acquire([*KEYS, tombstone(member)], args)
        return reply

    async def leave(self, member: str) -> int:
        args: list[str | int] = [member, self.limit, CHANNEL, 0, "", 0]
        return int(await self._leave([*KEYS, tombstone(member)], args))

    async def die(self, member: str) -> None:
        """As if ``member``'s process stopped renewing: its expiry is in the past."""
        for key in (KEYS[0], KEYS[2]):
            await self.client.zadd(key, {member: 0}, xx=True)


class Announcements:
    """What the scripts publish on the pool's channel (a sharded one)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pubsub = client.pubsub()

    async def start(self) -> None:
        await self.pubsub.ssubscribe(CHANNEL)
        assert (await self.pubsub.get_message(timeout=5))["type"] == "ssubscribe"

    async def since_last(self) -> list[str]:
        """Everything published since the previous call, in order."""
        await self.client.spublish(CHANNEL, "end")  # delivered after all that came before
        out: list[str] = []
        while True:
            message = await self.pubsub.get_message(timeout=5)
            assert message is not None, "the end marker never arrived"
            data = message["data"].decode()
            if data == "end":
                return out
            out.append(data)


@pytest.fixture
async def pool_and_channel(redis_client: Any) -> AsyncIterator[tuple[Pool, Announcements]]:
    announcements = Announcements(redis_client)
    await announcements.start()
    yield Pool(redis_client, 2, await run_id(redis_client)), announcements
    await announcements.pubsub.aclose()


async def test_a_full_pool_announces_nothing(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(10):
        for member in ("a", "b", "c", "d"):
            await pool.acquire(member)  # a, b hold; c (ticket 3) and d (ticket 4) wait
        assert await pool.leave("d") == 0  # a place given up, but nothing is free
        assert await channel.since_last() == []


async def test_one_freed_permit_announces_the_first_waiter_two_the_second(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(10):
        for member in ("a", "b", "c", "d", "e"):
            await pool.acquire(member)  # c, d, e wait with tickets 3, 4, 5
        assert await pool.leave("a") == 1
        assert await channel.since_last() == ["3"]  # one free permit: ticket 3 may come
        assert await pool.leave("b") == 1
        assert await channel.since_last() == ["4"]  # two: tickets 3 and 4 may come


async def test_more_free_permits_than_waiters_announce_the_last_waiter(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(10):
        for member in ("a", "b", "c"):
            await pool.acquire(member)  # c waits with ticket 3
        await pool.leave("a")
        await pool.leave("b")
        assert await channel.since_last() == ["3", "3"]
        await pool.leave("c")  # nobody left to tell
        assert await channel.since_last() == []


async def test_a_place_given_up_in_the_free_window_announces_the_one_behind(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(10):
        for member in ("a", "b", "c", "d"):
            await pool.acquire(member)  # c: ticket 3, d: ticket 4
        await pool.leave("a")
        assert await channel.since_last() == ["3"]
        # c gives up before coming for the permit it was told of: now d may have it.
        assert await pool.leave("c") == 0
        assert await channel.since_last() == ["4"]


async def test_a_leave_that_only_purges_announces(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(10):
        for member in ("a", "b", "c"):
            await pool.acquire(member)  # c: ticket 3
        await pool.die("a")
        # The clean-up of an attempt that never got anywhere still purges the dead holder.
        assert await pool.leave("nobody") == 0
        assert await channel.since_last() == ["3"]


async def test_purging_a_dead_waiter_announces_the_one_behind(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(10):
        for member in ("a", "b", "dead", "live"):
            await pool.acquire(member)  # dead: ticket 3, live: ticket 4
        await pool.leave("a")
        assert await channel.since_last() == ["3"]
        await pool.die("dead")  # the head of the queue stopped renewing
        # The next call of anyone purges it: the live waiter must be told at once, not
        # at its next re-check.
        tag, _, _ = await pool.acquire("newcomer")
        assert tag == scripts.WAITING
        assert await channel.since_last() == ["4"]


async def test_purging_dead_holders_announces_even_when_the_caller_is_granted(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(10):
        for member in ("a", "b", "first", "second"):
            await pool.acquire(member)  # first: ticket 3, second: ticket 4
        await pool.die("a")
        await pool.die("b")
        # second's retry purges both holders and takes one of the two free permits (it is
        # within the free window); first, ahead of it, must be told of the other.
        tag, _, ticket = await pool.acquire("second")
        assert (tag, ticket) == (scripts.GRANTED, 4)
        assert await channel.since_last() == ["3"]


async def test_a_retried_grant_that_purged_announces_too(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(10):
        await pool.acquire("a")
        await pool.acquire("b")
        await pool.acquire("c")  # ticket 3 waits
        await pool.die("b")
        tag, _, _ = await pool.acquire("a")  # a's retried call (its reply was lost)
        assert tag == scripts.GRANTED
        assert await channel.since_last() == ["3"]


async def test_a_waiting_reply_tells_the_remaining_time_until_a_permit_expires(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, _ = pool_and_channel
    with anyio.fail_after(10):
        await pool.acquire("a", ttl_ms=5000)
        await pool.acquire("b", ttl_ms=60_000)
        tag, until_free, ticket = await pool.acquire("c")
        assert (tag, ticket) == (scripts.WAITING, 3)
        assert 4000 < until_free <= 5000  # remaining ms of the first to expire


async def test_a_waiting_reply_with_no_holder_has_no_expiry(
    pool_and_channel: tuple[Pool, Announcements],
) -> None:
    pool, _ = pool_and_channel
    with anyio.fail_after(10):
        for member in ("a", "b", "c", "d"):
            await pool.acquire(member)
        await pool.leave("a")
        await pool.leave("b")  # c and d may come, but have not yet
        assert await pool.acquire("e") == [scripts.WAITING, -1, 5]


async def test_retried_pool_acquire_never_returns_an_expired_permit(
    pool_and_channel: tuple[Pool, Announcements], redis_client: Any
) -> None:
    pool, _ = pool_and_channel
    with anyio.fail_after(5):
        pool.limit = 1
        tag, first_fence, first_ticket = await pool.acquire("me", ttl_ms=5000)
        assert (tag, first_ticket) == (scripts.GRANTED, 1)
        await redis_client.zadd(KEYS[0], {"me": 0}, xx=True)  # it expired meanwhile
        # The retry (as after a lost reply) must not hand back the lapsed permit: it is
        # purged, and the caller is granted afresh, with a live expiry.
        tag, fence, ticket = await pool.acquire("me", ttl_ms=5000)
        assert (tag, ticket) == (scripts.GRANTED, 2)
        assert fence > first_fence
        [(_, expiry)] = await redis_client.zrange(KEYS[0], 0, -1, withscores=True)
        seconds, _ = await redis_client.time()
        assert expiry > int(seconds) * 1000


async def test_a_pool_acquire_overtaken_by_its_own_clean_up_takes_no_place(
    pool_and_channel: tuple[Pool, Announcements], redis_client: Any
) -> None:
    pool, _ = pool_and_channel
    with anyio.fail_after(5):
        leave = redis_client.register_script(pool_scripts.POOL_LEAVE)
        assert await leave([*KEYS, tombstone("me")], ["me", 2, CHANNEL, 5000, "", 0]) == 0
        assert (await pool.acquire("me"))[0] == scripts.WAITING
        for key in KEYS[:3]:  # neither a permit nor a queue place
            assert await redis_client.zcard(key) == 0


async def test_giving_a_late_grant_back_keeps_the_place_in_line(
    pool_and_channel: tuple[Pool, Announcements], redis_client: Any
) -> None:
    pool, channel = pool_and_channel
    with anyio.fail_after(5):
        pool.limit = 1
        await pool.acquire("a")
        await pool.acquire("b")  # ticket 2 waits
        leave = redis_client.register_script(pool_scripts.POOL_LEAVE)
        # a's grant came too late to use: back into line with its ticket, ahead of b.
        assert await leave([*KEYS, tombstone("a")], ["a", 1, CHANNEL, 0, "1", 5000]) == 1
        assert await redis_client.zrange(KEYS[1], 0, -1, withscores=True) == [
            (b"a", 1.0),
            (b"b", 2.0),
        ]
        assert await channel.since_last() == ["1"]
        assert (await pool.acquire("b"))[0] == scripts.WAITING
        assert (await pool.acquire("a"))[:3:2] == [scripts.GRANTED, 1]


async def test_an_acquire_that_fails_midway_leaves_no_place_without_a_heartbeat(
    pool_and_channel: tuple[Pool, Announcements], redis_client: Any
) -> None:
    pool, _ = pool_and_channel
    with anyio.fail_after(5):
        pool.limit = 1
        await redis_client.set(KEYS[4], "not a number")  # a corrupted fence counter
        with pytest.raises(redis.exceptions.ResponseError):
            await pool.acquire("a")  # fails as it mints, after taking its place in line
        await redis_client.delete(KEYS[4])
        # Whatever the failed call left in line has a heartbeat, so it is purged once that
        # expires (here: at once), instead of blocking everyone behind it forever.
        queued = set(await redis_client.zrange(KEYS[1], 0, -1))
        beating = set(await redis_client.zrange(KEYS[2], 0, -1))
        assert queued <= beating
        await pool.die("a")
        assert (await pool.acquire("b"))[0] == scripts.GRANTED


async def test_a_pool_without_state_on_a_restarted_server_gives_no_place(
    redis_connect: Any,
) -> None:
    with ThrowawayServer() as server, anyio.fail_after(10):
        server.restart()
        client = redis_connect(server.url)
        pool = Pool(client, 2, "")
        tag, wait, _ = await pool.acquire("a", ttl_ms=5000)
        assert (tag, 4000 < wait <= 6000) == (scripts.QUIET, True)
        assert await client.exists(*KEYS[:4]) == 0  # not even a ticket


class PoolModel(RuleBasedStateMachine):
    """The permit pool's scripts against a plain Python model of the same rules.

    Expiry is simulated by moving a holder's or waiter's expiry score to 0, which the
    scripts must treat exactly like a process that stopped renewing.
    """

    url = ""  # the server's, set by the test (hypothesis builds the instances)
    fresh = ""
    LIMIT = 2
    KEYS = tuple(pool_keys("model"))

    def __init__(self) -> None:
        super().__init__()
        self.client = redis.Redis.from_url(PoolModel.url)
        self.client.delete(*self.KEYS)
        self.acquire = self.client.register_script(pool_scripts.POOL_ACQUIRE)
        self.leave = self.client.register_script(pool_scripts.POOL_LEAVE)
        self.queue: dict[str, int] = {}  # live or not-yet-purged waiter -> ticket
        self.holders: set[str] = set()
        self.dead: set[str] = set()  # expired, purged by the next script call
        self.tickets = 0
        self.ids = 0

    def purge(self) -> None:
        for member in self.dead:
            self.queue.pop(member, None)
            self.holders.discard(member)
        self.dead.clear()

    def attempt(self, member: str) -> None:
        self.purge()
        if member not in self.queue:
            self.tickets += 1
            self.queue[member] = self.tickets
        ticket = self.queue[member]
        rank = sorted(self.queue.values()).index(ticket)
        granted = rank < self.LIMIT - len(self.holders)
        args: list[str | int] = [member, self.LIMIT, 60_000, 60_000, 60_000, "model:ev", self.fresh]
        tag, _, reply_ticket = self.acquire([*self.KEYS, "model:x"], args)
        assert (tag, reply_ticket) == (scripts.GRANTED if granted else scripts.WAITING, ticket)
        if granted:
            del self.queue[member]
            self.holders.add(member)

    @rule()
    def arrive(self) -> None:
        self.ids += 1
        self.attempt(f"m{self.ids}")

    @precondition(lambda self: bool(set(self.queue) - self.dead))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        self.attempt(data.draw(st.sampled_from(sorted(set(self.queue) - self.dead))))

    @precondition(lambda self: bool((self.holders | set(self.queue)) - self.dead))
    @rule(data=st.data())
    def leave_(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(sorted((self.holders | set(self.queue)) - self.dead)))
        self.purge()
        held = member in self.holders
        args: list[str | int] = [member, self.LIMIT, "model:events", 0, "", 0]
        assert self.leave([*self.KEYS, "model:x"], args) == int(held)
        self.holders.discard(member)
        self.queue.pop(member, None)

    @precondition(lambda self: bool(self.holders - self.dead))
    @rule(data=st.data())
    def holder_dies(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(sorted(self.holders - self.dead)))
        self.client.zadd(self.KEYS[0], {member: 0}, xx=True)
        self.dead.add(member)

    @precondition(lambda self: bool(set(self.queue) - self.dead))
    @rule(data=st.data())
    def waiter_dies(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(sorted(set(self.queue) - self.dead)))
        self.client.zadd(self.KEYS[2], {member: 0}, xx=True)
        self.dead.add(member)

    @invariant()
    def server_matches_model(self) -> None:
        client: Any = self.client
        holders = {m.decode() for m in client.zrange(self.KEYS[0], 0, -1)}
        queued = client.zrange(self.KEYS[1], 0, -1, withscores=True)
        assert holders == self.holders
        assert {m.decode(): int(t) for m, t in queued} == self.queue
        assert len(self.holders - self.dead) <= self.LIMIT

    def teardown(self) -> None:
        self.client.close()


def test_pool_scripts_follow_the_model(redis_server: ThrowawayServer) -> None:
    PoolModel.url = redis_server.url
    with redis.Redis.from_url(redis_server.url) as client:
        PoolModel.fresh = str(client.info("server")["run_id"])
    run_state_machine_as_test(
        PoolModel, settings=settings(max_examples=40, stateful_step_count=30, deadline=None)
    )

"""The Lua scripts' shared rules, driven directly on a real server."""

from __future__ import annotations

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

from lovely_coordinator._redis import scripts
from lovely_coordinator._redis.server import ThrowawayServer
from lovely_coordinator.redis import RedisLocker, RedisPermitPool


async def server_time_us(client: Any) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1_000_000 + int(micros)


@pytest.mark.asyncio
async def test_a_token_is_the_server_time_of_its_grant(redis_client: Any) -> None:
    with anyio.fail_after(5):
        before = await server_time_us(redis_client)
        lease = await RedisLocker(redis_client).acquire("c")
        after = await server_time_us(redis_client)
        assert before <= lease.fence <= after
        await lease.release()


@pytest.mark.asyncio
async def test_counter_ahead_of_the_clock_is_passed_at_once(redis_client: Any) -> None:
    with anyio.fail_after(5):
        # As after a backward step of the server clock by an hour: the last token is in
        # the future. The grant must not wait for the clock to catch up.
        ahead = await server_time_us(redis_client) + 3_600_000_000
        await redis_client.set("lovely:{c}:fence", ahead)
        locker = RedisLocker(redis_client)
        async with await locker.acquire("c") as first:
            assert first.fence == ahead + 1
        async with await locker.acquire("c") as second:
            assert second.fence == ahead + 2


@pytest.mark.asyncio
async def test_grants_within_one_microsecond_still_get_increasing_tokens(
    redis_client: Any,
) -> None:
    with anyio.fail_after(5):
        # The minting rule itself, fed one reading of the clock three times over.
        same_instant = redis_client.register_script(
            scripts._PRELUDE
            + "local now = now_us()\n"
            + "return {mint(KEYS[1], 10000, now), mint(KEYS[1], 10000, now), now}"
        )
        first, second, now = await same_instant(["lovely:{c}:fence"], [])
        assert (first, second) == (now, now + 1)
        assert int(await redis_client.get("lovely:{c}:fence")) == now + 1


@pytest.mark.asyncio
async def test_pool_tokens_follow_the_same_rule(redis_client: Any) -> None:
    with anyio.fail_after(5):
        ahead = await server_time_us(redis_client) + 3_600_000_000
        await redis_client.set("lovely:{pool:p}:fence", ahead)
        async with RedisPermitPool(redis_client, name="p", limit=1).permit() as permit:
            assert permit.fence == ahead + 1


@pytest.mark.asyncio
async def test_retried_acquire_of_the_same_owner_keeps_its_grant(redis_client: Any) -> None:
    with anyio.fail_after(5):
        acquire = redis_client.register_script(scripts.LOCK_ACQUIRE)
        keys = ["lovely:{c}:lock", "lovely:{c}:fence", "lovely:{c}:waiting", "lovely:{c}:x"]
        first = await acquire(keys, ["me", 5000, 10_000])
        again = await acquire(keys, ["me", 5000, 10_000])
        other = await acquire(keys, ["you", 5000, 10_000])
        assert first == again
        assert first[0] == scripts.GRANTED
        assert other[0] == scripts.WAITING
        assert 0 < other[1] <= 5000
        assert await redis_client.exists("lovely:{c}:waiting") == 1


@pytest.mark.asyncio
async def test_retried_pool_acquire_never_returns_an_expired_permit(redis_client: Any) -> None:
    with anyio.fail_after(5):
        acquire = redis_client.register_script(scripts.POOL_ACQUIRE)
        keys = [f"lovely:{{pool:p}}:{part}" for part in ("h", "q", "w", "t", "f", "g", "x")]
        args = ["me", 1, 5000, 5000, 10_000, "events"]
        tag, first_fence, first_ticket = await acquire(keys, args)
        assert (tag, first_ticket) == (scripts.GRANTED, 1)
        await redis_client.zadd(keys[0], {"me": 0}, xx=True)  # it expired meanwhile
        # The retry (as after a lost reply) must not hand back the lapsed permit: it is
        # purged, and the caller is granted afresh, with a live expiry.
        tag, fence, ticket = await acquire(keys, args)
        assert (tag, ticket) == (scripts.GRANTED, 2)
        assert fence > first_fence
        [(_, expiry)] = await redis_client.zrange(keys[0], 0, -1, withscores=True)
        seconds, _ = await redis_client.time()
        assert expiry > int(seconds) * 1000


@pytest.mark.asyncio
async def test_an_acquire_overtaken_by_its_own_clean_up_grants_nothing(
    redis_client: Any,
) -> None:
    with anyio.fail_after(5):
        # The clean-up of an abandoned attempt travels on another connection than the
        # attempt's last request, so the server may run the two in either order.
        acquire = redis_client.register_script(scripts.LOCK_ACQUIRE)
        release = redis_client.register_script(scripts.LOCK_RELEASE)
        keys = ["lovely:{c}:lock", "lovely:{c}:fence", "lovely:{c}:waiting"]
        tombstone = "lovely:{c}:abandoned:me"
        assert await release([keys[0], keys[2], tombstone], ["me", "ch", "c", 5000]) == 0
        tag, _ = await acquire([*keys, tombstone], ["me", 5000, 10_000])
        assert tag == scripts.WAITING
        assert await redis_client.exists(keys[0]) == 0  # no ghost lease
        assert 0 < await redis_client.pttl(tombstone) <= 5000  # and no lasting litter
        # An ordinary release leaves no tombstone behind.
        tag, _ = await acquire([*keys, "lovely:{c}:abandoned:you"], ["you", 5000, 10_000])
        assert tag == scripts.GRANTED
        assert await release([keys[0], keys[2], "lovely:{c}:abandoned:you"], ["you", "ch", "c", 0])
        assert await redis_client.exists("lovely:{c}:abandoned:you") == 0


@pytest.mark.asyncio
async def test_a_pool_acquire_overtaken_by_its_own_clean_up_takes_no_place(
    redis_client: Any,
) -> None:
    with anyio.fail_after(5):
        acquire = redis_client.register_script(scripts.POOL_ACQUIRE)
        leave = redis_client.register_script(scripts.POOL_LEAVE)
        keys = [f"lovely:{{pool:p}}:{part}" for part in ("h", "q", "w", "t", "f", "g")]
        tombstone = "lovely:{pool:p}:abandoned:me"
        assert await leave([*keys, tombstone], ["me", 1, "ch", 5000]) == 0
        tag, _, _ = await acquire([*keys, tombstone], ["me", 1, 5000, 5000, 10_000, "ch"])
        assert tag == scripts.WAITING
        for key in keys[:3]:  # neither a permit nor a queue place
            assert await redis_client.zcard(key) == 0


@pytest.mark.asyncio
async def test_gate_close_keeps_the_later_reopen_time(redis_client: Any) -> None:
    with anyio.fail_after(5):
        close = redis_client.register_script(scripts.GATE_CLOSE)
        state = redis_client.register_script(scripts.GATE_STATE)
        assert await close(["g"], ["m", 5000, "events"]) == 5000
        remaining = await close(["g"], ["m", 100, "events"])
        assert 4900 < remaining <= 5000
        member, left = await state(["g"], [])
        assert member == b"m"
        assert 4900 < int(left) <= 5000


@pytest.mark.asyncio
async def test_gate_state_drops_closures_that_ran_out(redis_client: Any) -> None:
    with anyio.fail_after(5):
        close = redis_client.register_script(scripts.GATE_CLOSE)
        state = redis_client.register_script(scripts.GATE_STATE)
        await close(["g"], ["m", 20, "events"])
        await anyio.sleep(0.05)
        assert await state(["g"], []) == []
        assert await redis_client.zcard("g") == 0


class PoolModel(RuleBasedStateMachine):
    """The permit pool's scripts against a plain Python model of the same rules.

    Expiry is simulated by moving a holder's or waiter's expiry score to 0, which the
    scripts must treat exactly like a process that stopped renewing.
    """

    url = ""  # the server's, set by the test (hypothesis builds the instances)
    LIMIT = 2
    KEYS = tuple(f"model:{{pool}}:{part}" for part in ("h", "q", "w", "t", "f", "g", "x"))

    def __init__(self) -> None:
        super().__init__()
        self.client = redis.Redis.from_url(PoolModel.url)
        self.client.delete(*self.KEYS)
        self.acquire = self.client.register_script(scripts.POOL_ACQUIRE)
        self.leave = self.client.register_script(scripts.POOL_LEAVE)
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
        tag, _, reply_ticket = self.acquire(
            self.KEYS, [member, self.LIMIT, 60_000, 60_000, 60_000, "model:events"]
        )
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
        assert self.leave(self.KEYS, [member, self.LIMIT, "model:events", 0]) == int(held)
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
    run_state_machine_as_test(
        PoolModel, settings=settings(max_examples=40, stateful_step_count=30, deadline=None)
    )

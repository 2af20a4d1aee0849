"""The Lua scripts' shared rules, driven directly on a real server."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from lovely_coordinator._redis import scripts
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
async def test_counter_ahead_of_the_clock_stalls_the_grant_instead_of_reusing_numbers(
    redis_client: Any,
) -> None:
    with anyio.fail_after(5):
        # As after a backward step of the server clock: the last token is in the future.
        ahead = await server_time_us(redis_client) + 300_000
        await redis_client.set("lovely:{c}:fence", ahead)
        acquire = redis_client.register_script(scripts.LOCK_ACQUIRE)
        tag, wait_us = await acquire(
            ["lovely:{c}:lock", "lovely:{c}:fence", "lovely:{c}:waiting"], ["me", 1000, 10_000]
        )
        assert tag == scripts.CLOCK_BEHIND
        assert 0 < wait_us <= 300_001
        assert await redis_client.exists("lovely:{c}:lock") == 0
        lease = await RedisLocker(redis_client).acquire("c")  # waits for the clock
        assert lease.fence > ahead
        await lease.release()


@pytest.mark.asyncio
async def test_pool_tokens_follow_the_same_rule(redis_client: Any) -> None:
    with anyio.fail_after(5):
        ahead = await server_time_us(redis_client) + 200_000
        await redis_client.set("lovely:{pool:p}:fence", ahead)
        async with RedisPermitPool(redis_client, name="p", limit=1).permit() as permit:
            assert permit.fence > ahead


@pytest.mark.asyncio
async def test_retried_acquire_of_the_same_owner_keeps_its_grant(redis_client: Any) -> None:
    with anyio.fail_after(5):
        acquire = redis_client.register_script(scripts.LOCK_ACQUIRE)
        keys = ["lovely:{c}:lock", "lovely:{c}:fence", "lovely:{c}:waiting"]
        first = await acquire(keys, ["me", 5000, 10_000])
        again = await acquire(keys, ["me", 5000, 10_000])
        other = await acquire(keys, ["you", 5000, 10_000])
        assert first == again
        assert first[0] == scripts.GRANTED
        assert other[0] == scripts.WAITING
        assert 0 < other[1] <= 5000
        assert await redis_client.exists("lovely:{c}:waiting") == 1


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

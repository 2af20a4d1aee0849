"""The lease and log scripts and the rules every script shares, driven on a real server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from lovely_coordinator._redis import scripts
from lovely_coordinator._redis.server import ThrowawayServer
from lovely_coordinator.redis import RedisLocker, RedisPermitPool

from .redis_helpers import (
    anyio_backend,
    lock_keys,
    own_server,
    pool_key,
    run_id,
    server_time_us,
    uptime_at_least,
)

__all__ = ["anyio_backend", "own_server"]  # fixtures

pytestmark = pytest.mark.anyio


def acquire_keys(conversation: str, owner: str) -> list[str]:
    keys = lock_keys(conversation)
    base = keys["lock"].removesuffix(":lock")
    return [
        keys["lock"],
        keys["fence"],
        keys["waiting"],
        keys["quiet"],
        f"{base}:abandoned:{owner}",
    ]


async def test_a_token_is_the_server_time_of_its_grant(redis_client: Any) -> None:
    with anyio.fail_after(5):
        before = await server_time_us(redis_client)
        lease = await RedisLocker(redis_client).acquire("c")
        after = await server_time_us(redis_client)
        assert before <= lease.fence <= after
        await lease.release()


async def test_counter_ahead_of_the_clock_is_passed_at_once(redis_client: Any) -> None:
    with anyio.fail_after(5):
        # As after a backward step of the server clock by an hour: the last token is in
        # the future. The grant must not wait for the clock to catch up.
        ahead = await server_time_us(redis_client) + 3_600_000_000
        await redis_client.set(lock_keys("c")["fence"], ahead)
        locker = RedisLocker(redis_client)
        async with await locker.acquire("c") as first:
            assert first.fence == ahead + 1
        async with await locker.acquire("c") as second:
            assert second.fence == ahead + 2


async def test_grants_within_one_microsecond_still_get_increasing_tokens(
    redis_client: Any,
) -> None:
    with anyio.fail_after(5):
        # The minting rule itself, fed one reading of the clock three times over.
        same_instant = redis_client.register_script(
            scripts.PRELUDE
            + "local now = now_us()\n"
            + "return {mint(KEYS[1], 10000, now), mint(KEYS[1], 10000, now), now}"
        )
        fence = lock_keys("c")["fence"]
        first, second, now = await same_instant([fence], [])
        assert (first, second) == (now, now + 1)
        assert int(await redis_client.get(fence)) == now + 1


async def test_pool_tokens_follow_the_same_rule(redis_client: Any) -> None:
    with anyio.fail_after(5):
        ahead = await server_time_us(redis_client) + 3_600_000_000
        await redis_client.set(pool_key("p", "fence"), ahead)
        async with RedisPermitPool(redis_client, name="p", limit=1).permit() as permit:
            assert permit.fence == ahead + 1


async def test_retried_acquire_of_the_same_owner_keeps_its_grant(redis_client: Any) -> None:
    with anyio.fail_after(5):
        acquire = redis_client.register_script(scripts.LOCK_ACQUIRE)
        fresh = await run_id(redis_client)  # the test server is declared fresh
        first = await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10_000, fresh])
        again = await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10_000, fresh])
        other = await acquire(acquire_keys("c", "bb"), ["bb", 5000, 10_000, fresh])
        assert first == again
        assert first[0] == scripts.GRANTED
        assert other[0] == scripts.WAITING
        assert 0 < other[1] <= 5000
        assert await redis_client.exists(lock_keys("c")["waiting"]) == 1
        # The lease names its owner and its token, so a retry can answer with the token.
        assert await redis_client.get(lock_keys("c")["lock"]) == f"aa {first[1]}".encode()


async def test_an_acquire_overtaken_by_its_own_clean_up_grants_nothing(
    redis_client: Any,
) -> None:
    with anyio.fail_after(5):
        # The clean-up of an abandoned attempt travels on another connection than the
        # attempt's last request, so the server may run the two in either order.
        acquire = redis_client.register_script(scripts.LOCK_ACQUIRE)
        release = redis_client.register_script(scripts.LOCK_RELEASE)
        fresh = await run_id(redis_client)
        lock, fence, waiting, quiet, tombstone = acquire_keys("c", "aa")
        assert await release([lock, waiting, tombstone], ["aa", "ch", "c", 5000]) == 0
        keys = [lock, fence, waiting, quiet, tombstone]
        tag, _ = await acquire(keys, ["aa", 5000, 10_000, fresh])
        assert tag == scripts.WAITING
        assert await redis_client.exists(lock) == 0  # no ghost lease
        assert 0 < await redis_client.pttl(tombstone) <= 5000  # and no lasting litter
        # An ordinary release leaves no tombstone behind.
        keys = acquire_keys("c", "bb")
        tag, _ = await acquire(keys, ["bb", 5000, 10_000, fresh])
        assert tag == scripts.GRANTED
        assert await release([lock, waiting, keys[4]], ["bb", "ch", "c", 0])
        assert await redis_client.exists(keys[4]) == 0


async def test_a_resent_acquire_after_the_clean_up_of_its_grant_grants_nothing(
    redis_client: Any,
) -> None:
    with anyio.fail_after(5):
        # The attempt was granted but its reply lost; redis-py resends it on a new
        # connection while the clean-up (on a third) deletes the grant. The resend may
        # arrive last: it must not grant a lease nobody holds.
        acquire = redis_client.register_script(scripts.LOCK_ACQUIRE)
        release = redis_client.register_script(scripts.LOCK_RELEASE)
        fresh = await run_id(redis_client)
        keys = acquire_keys("c", "aa")
        lock, waiting, tombstone = keys[0], keys[2], keys[4]
        tag, _ = await acquire(keys, ["aa", 5000, 10_000, fresh])
        assert tag == scripts.GRANTED
        assert await release([lock, waiting, tombstone], ["aa", "ch", "c", 5000]) == 1
        tag, _ = await acquire(keys, ["aa", 5000, 10_000, fresh])
        assert tag == scripts.WAITING
        assert await redis_client.exists(lock) == 0  # no ghost lease


# --- the quiet period after a restart without persistence ---------------------------------


async def test_a_restarted_server_grants_nothing_for_a_ttl(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        own_server.restart()  # as after a crash: not declared fresh
        client = redis_connect(own_server.url)
        acquire = client.register_script(scripts.LOCK_ACQUIRE)
        tag, wait, server_run_id = await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10**7, ""])
        assert tag == scripts.QUIET
        assert 4000 < wait <= 6000  # a ttl from the end of the second the server started in
        assert server_run_id.decode() == await run_id(client)
        assert await client.exists(lock_keys("c")["lock"]) == 0  # nothing granted
        # A caller with a longer ttl lengthens the period for everyone.
        tag, longer, _ = await acquire(acquire_keys("c", "bb"), ["bb", 8000, 10**7, ""])
        assert (tag, 7000 < longer <= 9000) == (scripts.QUIET, True)
        tag, after, _ = await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10**7, ""])
        assert (tag, 5000 < after <= longer) == (scripts.QUIET, True)


async def test_the_quiet_period_counts_from_the_second_the_server_started_in(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        # The server's uptime is a difference of whole wall-clock seconds: it reads 1 as
        # soon as the clock passes the next second, however young the server is. Read as
        # a rounded-down uptime it ended the quiet period up to a second early (a chaos
        # run caught a permit granted 0.2 s after a restart, while the old one was valid).
        while not 0.6 < time.time() % 1 < 0.7:  # noqa: ASYNC110  (the wall clock itself)
            await anyio.sleep(0.005)
        own_server.restart()
        restarted_at = anyio.current_time()
        client = redis_connect(own_server.url)
        await uptime_at_least(client, 1)  # some 0.3 s later
        acquire = client.register_script(scripts.LOCK_ACQUIRE)
        tag, wait, _ = await acquire(acquire_keys("c", "aa"), ["aa", 3000, 10**7, ""])
        elapsed_ms = (anyio.current_time() - restarted_at) * 1000
        assert tag == scripts.QUIET
        assert wait >= 3000 - elapsed_ms  # a full ttl after the restart, at least


async def test_a_boot_declared_fresh_has_no_quiet_period(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        own_server.restart()
        client = redis_connect(own_server.url)
        acquire = client.register_script(scripts.LOCK_ACQUIRE)
        wrong = "0" * 40  # another boot's run id declares nothing
        assert (await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10**7, wrong]))[0] == 2
        reply = await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10**7, await run_id(client)])
        assert reply[0] == scripts.GRANTED


async def test_state_that_survived_needs_no_quiet_period(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        own_server.restart()
        client = redis_connect(own_server.url)
        # A restart that kept the data (persistence) kept the fence counter: nothing of
        # this conversation was lost, so there is no reason to wait.
        await client.set(lock_keys("c")["fence"], 1)
        acquire = client.register_script(scripts.LOCK_ACQUIRE)
        assert (await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10**7, ""]))[0] == 1


async def test_a_server_up_longer_than_the_ttl_grants_new_objects_at_once(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        own_server.restart()
        client = redis_connect(own_server.url)
        await uptime_at_least(client, 2)
        acquire = client.register_script(scripts.LOCK_ACQUIRE)
        # Anything held before the server started has lapsed by now (ttl 0.5 s, and the
        # second the server started in), so an object it has no state for is simply new:
        # detection is per server.
        for prefix in ("a:", "b:"):
            keys = [k.replace("lovely:", prefix, 1) for k in acquire_keys("c", "aa")]
            assert (await acquire(keys, ["aa", 500, 10**7, ""]))[0] == scripts.GRANTED


# --- the fenced log -----------------------------------------------------------------------


async def test_a_claim_raises_the_mark_or_is_refused_below_it(redis_client: Any) -> None:
    with anyio.fail_after(5):
        claim = redis_client.register_script(scripts.FENCED_CLAIM)
        keys = ["{log:x}:high-water"]
        assert await claim(keys, ["5"]) == 1
        assert await redis_client.get(keys[0]) == b"5"
        assert await claim(keys, ["4"]) == b"5"  # refused: the mark it is below
        assert await claim(keys, ["5"]) == 1  # equal: allowed
        assert await claim(keys, ["10"]) == 1  # longer decimal: larger
        assert await claim(keys, ["9"]) == b"10"
        assert await claim(keys, ["0"]) == 1  # unfenced: never moves it
        assert await redis_client.get(keys[0]) == b"10"

"""The lease and log scripts and the rules every script shares, driven on a real server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator._redis import scripts
from lovely_coordinator.redis import RedisLocker, RedisPermitPool

from .helpers import (
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
        keys["marker"],
        f"{base}:abandoned:{owner}",
        keys["beats"],
        keys["ticket"],
    ]


def release_keys(conversation: str, owner: str) -> list[str]:
    lock, _, waiting, _, tombstone, beats, _ = acquire_keys(conversation, owner)
    return [lock, waiting, tombstone, beats]


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
        first = await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10_000, fresh, 5000])
        again = await acquire(acquire_keys("c", "aa"), ["aa", 5000, 10_000, fresh, 5000])
        other = await acquire(acquire_keys("c", "bb"), ["bb", 5000, 10_000, fresh, 5000])
        assert first[:2] == again[:2]  # (the retry's reply does not know the ticket)
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
        keys = acquire_keys("c", "aa")
        lock, tombstone = keys[0], keys[4]
        assert await release(release_keys("c", "aa"), ["aa", "ch", "c", 5000]) == 0
        tag, *_ = await acquire(keys, ["aa", 5000, 10_000, fresh, 5000])
        assert tag == scripts.WAITING
        assert await redis_client.exists(lock) == 0  # no ghost lease
        assert 0 < await redis_client.pttl(tombstone) <= 5000  # and no lasting litter
        # An ordinary release leaves no tombstone behind.
        keys = acquire_keys("c", "bb")
        tag, *_ = await acquire(keys, ["bb", 5000, 10_000, fresh, 5000])
        assert tag == scripts.GRANTED
        assert await release(release_keys("c", "bb"), ["bb", "ch", "c", 0])
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
        lock = keys[0]
        tag, *_ = await acquire(keys, ["aa", 5000, 10_000, fresh, 5000])
        assert tag == scripts.GRANTED
        assert await release(release_keys("c", "aa"), ["aa", "ch", "c", 5000]) == 1
        tag, *_ = await acquire(keys, ["aa", 5000, 10_000, fresh, 5000])
        assert tag == scripts.WAITING
        assert await redis_client.exists(lock) == 0  # no ghost lease


# --- lost state and the quiet period (generation.py) -------------------------------------


async def lock_acquire(client: Any, owner: str, ttl_ms: int, fresh: str = "", c: str = "c") -> Any:
    acquire = client.register_script(scripts.LOCK_ACQUIRE)
    return await acquire(acquire_keys(c, owner), [owner, ttl_ms, 10**7, fresh, ttl_ms])


async def test_a_restarted_server_grants_nothing_for_a_ttl(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        own_server.restart()  # as after a crash: not declared fresh
        client = redis_connect(own_server.url)
        tag, wait, server_run_id = await lock_acquire(client, "aa", 5000)
        assert tag == scripts.QUIET
        assert 5000 < wait <= 6000  # the caller's ttl and a tick
        # The generation's token: the run id, and the marker's generation.
        assert server_run_id.decode().startswith(f"{await run_id(client)}:")
        assert await client.exists(lock_keys("c")["lock"]) == 0  # nothing granted
        # Each caller waits out its own ttl, counted from when the loss was noticed.
        tag, longer, _ = await lock_acquire(client, "bb", 8000, c="d")
        assert (tag, 8000 < longer <= 9000) == (scripts.QUIET, True)
        tag, after, _ = await lock_acquire(client, "aa", 5000)
        assert (tag, 5000 < after <= wait) == (scripts.QUIET, True)


async def test_a_flush_is_noticed_however_long_the_server_has_been_up(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        client = redis_connect(own_server.url)
        fresh = await run_id(client)
        assert (await lock_acquire(client, "aa", 500, fresh))[0] == scripts.GRANTED
        await uptime_at_least(client, 2)  # up longer than the ttl
        await client.flushall()  # the grant is forgotten, while its holder still runs
        assert (await lock_acquire(client, "bb", 500))[0] == scripts.QUIET


async def test_a_restart_from_an_old_snapshot_is_noticed(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        client = redis_connect(own_server.url)
        fresh = await run_id(client)
        assert (await lock_acquire(client, "aa", 500, fresh))[0] == scripts.GRANTED
        release = client.register_script(scripts.LOCK_RELEASE)
        await release(release_keys("c", "aa"), ["aa", "ch", "c", 0])
        own_server.save()  # the snapshot has the fence counter and the marker...
        assert (await lock_acquire(client, "bb", 5000, fresh))[0] == scripts.GRANTED
        own_server.restart()  # ...but not bb's grant, which is still held
        client = redis_connect(own_server.url)
        assert await client.exists(lock_keys("c")["fence"]) == 1
        assert (await lock_acquire(client, "cc", 5000))[0] == scripts.QUIET


async def test_a_forward_step_of_the_clock_shortens_the_quiet_period_by_a_tick_at_most(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        own_server.restart()
        client = redis_connect(own_server.url)
        _, wait, _ = await lock_acquire(client, "aa", 5000)
        # As if the server clock jumped a minute ahead since that call.
        marker = lock_keys("c")["marker"]
        last = int(await client.hget(marker, "last"))
        await client.hset(marker, "last", last - 60_000)
        _, after, _ = await lock_acquire(client, "aa", 5000)
        assert wait - 1000 <= after < wait
        assert after > 4000  # still about a ttl to go


async def test_a_boot_declared_fresh_has_no_quiet_period(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        own_server.restart()
        client = redis_connect(own_server.url)
        wrong = "0" * 40  # another boot's run id declares nothing
        tag, _, token = await lock_acquire(client, "aa", 5000, wrong)
        assert tag == scripts.QUIET
        other_generation = f"{await run_id(client)}:1"  # nor another generation's token
        assert (await lock_acquire(client, "aa", 5000, other_generation))[0] == scripts.QUIET
        # The token the quiet period was reported with, once vouched for, ends it.
        assert (await lock_acquire(client, "aa", 5000, token.decode()))[0] == scripts.GRANTED
        await client.flushall()  # a new generation: the token vouches for nothing now
        assert (await lock_acquire(client, "bb", 5000, token.decode()))[0] == scripts.QUIET
        # A bare run id vouches for the whole boot (what these tests pass).
        assert (await lock_acquire(client, "bb", 5000, await run_id(client)))[0] == 1


async def test_a_new_prefix_on_a_server_that_kept_its_state_is_granted_at_once(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        client = redis_connect(own_server.url)
        acquire = client.register_script(scripts.LOCK_ACQUIRE)
        # The first grant of a boot vouched for (declared fresh at its start)...
        assert (await lock_acquire(client, "aa", 500, await run_id(client)))[0] == 1
        for prefix in ("a:", "b:"):  # ...and the state is this boot's: new objects are new
            keys = [k.replace("lovely:", prefix, 1) for k in acquire_keys("c", "aa")]
            assert (await acquire(keys, ["aa", 500, 10**7, "", 500]))[0] == scripts.GRANTED


async def test_a_renewal_reports_its_fence_even_when_the_lease_is_gone(
    redis_client: Any,
) -> None:
    with anyio.fail_after(5):
        # As on a new primary that lost the grant and whose clock is behind: the counter
        # is older than the holder's fence, and the next grant must mint above it.
        keys = lock_keys("c")
        now = await server_time_us(redis_client)
        held = now + 60_000_000
        extend = redis_client.register_script(scripts.LOCK_EXTEND)
        renewed = await extend([keys["lock"], keys["fence"]], [f"aa {held}", 5000, held, 10**7])
        assert renewed == 0
        assert int(await redis_client.get(keys["fence"])) == held
        assert await extend([keys["lock"], keys["fence"]], ["aa 1", 5000, 1, 10**7]) == 0
        assert int(await redis_client.get(keys["fence"])) == held  # never lowered
        _, fence, _ = await lock_acquire(redis_client, "bb", 5000, await run_id(redis_client))
        assert fence == held + 1


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

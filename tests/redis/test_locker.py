"""RedisLocker / RedisLease against a real throwaway server (asyncio-only)."""

from __future__ import annotations

import logging
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio
from lovely_coordinator_dev.testing.child import Child, running
from lovely_coordinator_dev.testing.faults import proxy_to
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator import InvalidArgumentError, InvalidArgumentTypeError
from lovely_coordinator._base.errors import UsageError
from lovely_coordinator._redis import scripts
from lovely_coordinator.redis import (
    FencedLog,
    RedisLease,
    RedisLocker,
    RedisPermitPool,
    UnsupportedServerError,
)
from lovely_coordinator.turns import Job, LeaseLostError, TurnRegistry

from .helpers import RECONNECTING, anyio_backend, lock_keys, own_server

__all__ = ["anyio_backend", "own_server"]  # fixtures

pytestmark = pytest.mark.anyio

REPLICA = str(Path(__file__).with_name("replica.py"))
KEYS = lock_keys("c")


async def test_acquire_release_and_context_manager(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=5)
        lease = await locker.acquire("c")
        assert isinstance(lease, RedisLease)
        assert lease.fence > 0
        assert not lease.lost.is_set()
        assert await redis_client.exists(KEYS["lock"]) == 1
        async with lease:
            pass
        assert lease.released
        assert await redis_client.exists(KEYS["lock"]) == 0
        await lease.release()  # idempotent
        assert not lease.lost.is_set()


async def test_fences_strictly_increase_across_grants(redis_client: Any) -> None:
    with anyio.fail_after(10):
        locker = RedisLocker(redis_client, ttl=5)
        fences = []
        for _ in range(50):
            async with await locker.acquire("c") as lease:
                fences.append(lease.fence)
        assert fences == sorted(set(fences))


async def test_fence_survives_server_restart_without_persistence(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        client = redis_connect(own_server.url, **RECONNECTING)
        locker = RedisLocker(client, ttl=0.5)
        async with await locker.acquire("c") as before:
            pass
        own_server.restart()
        assert await client.exists(KEYS["fence"]) == 0  # the counter is gone
        async with await locker.acquire("c") as after:  # after the quiet period
            assert after.fence > before.fence


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
            while not await redis_client.exists(KEYS["waiting"]):  # noqa: ASYNC110
                await anyio.sleep(0.005)
            await anyio.sleep(0.05)  # let the waiter park on its re-check timer
            with anyio.fail_after(0.5):  # far below the 1 s re-check
                await holder.release()
                await got_it.wait()
        assert granted[0].fence > holder.fence
        await granted[0].release()


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


async def test_release_deletes_only_its_own_lease(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=5)
        old = await locker.acquire("c")
        await redis_client.delete(KEYS["lock"])  # as if it lapsed
        new = await locker.acquire("c")
        assert new.fence > old.fence
        await old.release()  # never raises for a lapsed lease
        assert await redis_client.exists(KEYS["lock"]) == 1
        await new.release()
        assert await redis_client.exists(KEYS["lock"]) == 0


async def test_release_in_a_cancelled_scope_still_deletes_the_lease(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=0.3)
        lease = await locker.acquire("c")
        await anyio.sleep(0.15)  # past the first renewal: the watchdog task is running
        with anyio.CancelScope() as scope:
            scope.cancel()
            await lease.release()  # shielded: the redis-py #3847 wedge cannot happen
        assert lease.released
        assert await redis_client.exists(KEYS["lock"]) == 0
        assert not lease.lost.is_set()


async def test_lapsed_lease_is_lost_at_next_renewal(redis_client: Any) -> None:
    with anyio.fail_after(5):
        lease = await RedisLocker(redis_client, ttl=0.3).acquire("c")
        await redis_client.delete(KEYS["lock"])
        await lease.lost.wait()
        await lease.release()


async def test_renewal_keeps_the_lease_past_its_ttl(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=0.3)
        lease = await locker.acquire("c")
        await anyio.sleep(1.0)
        assert not lease.lost.is_set()
        assert await redis_client.exists(KEYS["lock"]) == 1
        await lease.release()


async def test_client_pause_beyond_deadline_loses_the_lease(redis_client: Any) -> None:
    with anyio.fail_after(10):
        ttl = 1.0
        lease = await RedisLocker(redis_client, ttl=ttl).acquire("c")
        await anyio.sleep(0.4)
        await redis_client.client_pause(3000, all=True)
        # Every renewal that can still succeed was sent before this moment, so lost must
        # come within ttl of it: before the pause ends, long before the server answers.
        # (The exact bound, "before ttl since the last successful renewal was sent", is
        # pinned without scheduling slack in test_redis_renewal; 0.1 s covers the lag of
        # this task's own wake-up on a loaded machine.)
        paused_at = anyio.current_time()
        await lease.lost.wait()
        assert anyio.current_time() - paused_at < ttl + 0.1
        await lease.release()  # no error once the server answers again


async def test_works_with_a_decoding_client(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(5):
        client = redis_connect(redis_server.url, decode_responses=True)
        locker = RedisLocker(client, ttl=30)
        holder = await locker.acquire("ç")

        async def next_turn() -> None:
            async with await locker.acquire("ç"):  # woken through a decoded message
                pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(next_turn)
            while not await redis_client.exists(lock_keys("ç")["waiting"]):  # noqa: ASYNC110
                await anyio.sleep(0.005)
            await anyio.wait_all_tasks_blocked()
            with anyio.fail_after(0.5):  # far below the 1 s re-check
                await holder.release()


async def test_different_prefixes_are_independent(redis_client: Any) -> None:
    with anyio.fail_after(5):
        a = await RedisLocker(redis_client, ttl=5, prefix="a:").acquire("c")
        b = await RedisLocker(redis_client, ttl=5, prefix="b:").acquire("c")
        await a.release()
        await b.release()


async def test_cancelled_waiter_leaves_nothing_behind(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=5)
        holder = await locker.acquire("c")
        with anyio.move_on_after(0.1):
            await locker.acquire("c")
        await holder.release()
        assert await redis_client.exists(KEYS["lock"]) == 0
        async with await locker.acquire("c"):
            pass


async def test_cancelled_acquire_whose_reply_was_lost_cleans_up(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with proxy_to(redis_server.port) as proxy:
            client = redis_connect(proxy.url)
            locker = RedisLocker(client, ttl=30)
            await client.ping()  # the connection the acquire will use
            await redis_client.script_load(scripts.LOCK_ACQUIRE)  # no NOSCRIPT round trip
            await locker.acquire("warm-up")  # the version check is done
            # The server grants the request, but the reply never arrives and the caller
            # gives up: the clean-up (on a fresh connection) must delete that grant.
            proxy.cut_replies(only_open=True)
            with anyio.move_on_after(0.3):
                await locker.acquire("c")
        assert await redis_client.exists(KEYS["fence"]) == 1  # the grant did happen
        assert await redis_client.exists(KEYS["lock"]) == 0  # ...and was cleaned up
        async with await RedisLocker(redis_client, ttl=30).acquire("c"):
            pass  # not stuck behind a 30 s ghost


async def test_killed_holder_expires_within_ttl_and_next_fence_is_higher(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(20):
        ttl = 1.0
        argv = (REPLICA, "hold", redis_server.url, "lovely:", "c", str(ttl))
        async with running(argv) as (child,):
            fence = (await child.read())["fence"]
            child.signal(signal.SIGKILL)
            killed_at = anyio.current_time()
            lease = await RedisLocker(redis_client, ttl=ttl).acquire("c")
            # Within the ttl of its last renewal; the waiter re-checks at the expiry it
            # was told (the design allows a re-poll of up to 1 s; 0.5 s is ample slack).
            assert anyio.current_time() - killed_at <= ttl + 0.5
            assert lease.fence > fence
            await lease.release()


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan, 0.001, 1e16, 10**400])
def test_bad_ttl(redis_client: Any, ttl: float) -> None:
    # 1e16 s: more than the server can represent; refused at once, not at every turn.
    message = r"^ttl must be a number of seconds from 0\.01 to 1e9$"
    with pytest.raises(InvalidArgumentError, match=message):
        RedisLocker(redis_client, ttl=ttl)


@pytest.mark.parametrize(
    ("client", "hint"),
    [
        (None, "NoneType"),
        ("redis://127.0.0.1:6379", r"str \(make one with redis.asyncio.Redis.from_url\(url\)\)"),
        (redis.Redis(), r"Redis \(this module is asyncio-only: use redis.asyncio.Redis or "),
    ],
    ids=["none", "url", "sync-client"],
)
def test_a_client_that_is_not_an_asyncio_redis_client_is_refused(client: Any, hint: str) -> None:
    with pytest.raises(
        InvalidArgumentTypeError,
        match=f"^client must be a redis.asyncio.Redis or redis.asyncio.RedisCluster, not {hint}",
    ):
        RedisLocker(client)


# Both backends, overriding the module's asyncio-only fixture: the refusal under trio.
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_under_trio_the_error_says_asyncio_only(anyio_backend: str) -> None:
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1")
    if anyio_backend == "asyncio":
        RedisLocker(client)  # fine
        return
    with pytest.raises(UsageError, match=r"asyncio-only .* cannot be used under trio"):
        RedisLocker(client)


def test_a_locker_made_outside_a_loop_refuses_trio_at_acquire() -> None:
    import trio

    locker = RedisLocker(redis.asyncio.Redis.from_url("redis://127.0.0.1:1"))

    async def main() -> None:
        with pytest.raises(UsageError, match=r"asyncio-only .* cannot be used under trio"):
            await locker.acquire("c")

    trio.run(main)


async def test_a_server_older_than_redis_7_is_refused_at_first_use(
    redis_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with proxy_to(redis_server.port) as proxy:
            # The real server, made to report an unsupported version.
            # Valkey is judged by valkey_version, Redis by redis_version (the suite runs on
            # either: whichever server_name the real server reports).
            info = await redis_connect(redis_server.url).info("server")
            name = "Valkey" if info.get("server_name") == "valkey" else "Redis"
            field = f"{name.lower()}_version"
            version = str(info[field])  # "7.0.15", "8.1.4": rewritten at equal length
            proxy.replace_in_replies(
                f"{field}:{version}".encode(), f"{field}:6.2{version[3:]}".encode()
            )
            client = redis_connect(proxy.url)
            locker = RedisLocker(client, ttl=5)
            message = (
                rf"^{name} 6\.2\.\d+ is not supported: .* needs Redis >= 7\.0 or Valkey >= 7\.2$"
            )
            with pytest.raises(UnsupportedServerError, match=message):
                await locker.acquire("old-server")
            with pytest.raises(UnsupportedServerError):  # remembered, not asked again
                await RedisPermitPool(client, name="old-server", limit=1).acquire()
            lock = lock_keys("old-server")["lock"]
            assert await redis_connect(redis_server.url).exists(lock) == 0  # nothing written


async def test_bad_conversation_id(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client)
        with pytest.raises(InvalidArgumentError, match=r"^conversation_id must be a nonempty"):
            await locker.acquire("")


async def test_a_string_the_client_cannot_encode_is_refused_and_changes_nothing(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(5):
        with pytest.raises(InvalidArgumentError, match=r"^prefix must be a string the client"):
            RedisLocker(redis_client, prefix="\ud800")
        locker = RedisLocker(redis_client)
        with (
            caplog.at_level(logging.WARNING, "lovely_coordinator.redis"),
            pytest.raises(
                InvalidArgumentError, match=r"^conversation_id must be a string the client"
            ),
        ):
            await locker.acquire("a\ud800")  # a lone surrogate: no UTF-8 for it
        assert caplog.records == []  # no clean-up of an attempt that was never made
        assert await redis_client.keys("lovely:*") == []


# --- replicas sharing one conversation through TurnRegistry ------------------------------


async def outcomes_of(child: Child) -> list[str]:
    while True:
        report = await child.read()
        if "outcomes" in report:
            outcomes: list[str] = report["outcomes"]
            return outcomes


def turn_blocks(entries: list[tuple[int, str]]) -> dict[str, list[tuple[int, int, str]]]:
    """Each turn's log entries as (index, fence, kind), by turn label."""
    blocks: dict[str, list[tuple[int, int, str]]] = {}
    for index, (fence, entry) in enumerate(entries):
        kind, _, label = entry.partition(" ")
        blocks.setdefault(label, []).append((index, fence, kind))
    return blocks


def assert_completed_turns_never_overlap(
    entries: list[tuple[int, str]], completed: set[str]
) -> None:
    fences = [fence for fence, _ in entries]
    assert fences == sorted(fences), "the store accepted a stale fence"
    blocks = turn_blocks(entries)
    for label in completed:
        block = blocks[label]
        assert [kind for _, _, kind in block] == ["start", "tick", "tick", "end"]
        indexes = [index for index, _, _ in block]
        assert indexes == list(range(indexes[0], indexes[0] + 4)), f"{label} overlapped"
        assert len({fence for _, fence, _ in block}) == 1


@pytest.mark.parametrize("replicas", [2, 3])
async def test_replica_processes_never_overlap_turns(
    redis_server: ThrowawayServer, redis_client: Any, replicas: int
) -> None:
    with anyio.fail_after(60):
        url = redis_server.url
        argvs = [(REPLICA, "turns", url, url, "c", "2", "8", f"r{n}") for n in range(replicas)]
        async with running(*argvs) as children:
            outcomes = [await outcomes_of(child) for child in children]
        assert outcomes == [["ok"] * 8] * replicas
        entries = await FencedLog(redis_client, "log").entries()
        assert len(entries) == 4 * 8 * replicas
        labels = {f"r{n}-{i}" for n in range(replicas) for i in range(8)}
        assert_completed_turns_never_overlap(entries, labels)


async def test_paused_replica_is_fenced_off_and_its_turn_cancelled(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(30):
        ttl = 0.5
        url = redis_server.url
        async with running((REPLICA, "stale", url, url, "c", str(ttl))) as (child,):
            stale_fence = (await child.read())["started"]
            child.signal(signal.SIGSTOP)  # a GC pause / stalled loop, past the ttl
            stopped_at = anyio.current_time()
            lease = await RedisLocker(redis_client, ttl=ttl).acquire("c")
            assert anyio.current_time() - stopped_at <= ttl + 0.5
            assert lease.fence > stale_fence
            log = FencedLog(redis_client, "log")
            takeover = await log.append(lease.fence, "takeover")
            child.signal(signal.SIGCONT)
            report = await child.read()
            await lease.release()
        assert report["error"] == "LeaseLostError"  # its turn was cancelled
        assert report["refused"] >= 1  # ...and its writes after the takeover refused
        after = (await log.entries())[takeover:]
        assert all(fence == lease.fence for fence, _ in after)


async def test_server_killed_and_restarted_mid_run(
    own_server: ThrowawayServer, redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(60):
        # The lock server restarts without persistence; the store (where the fences are
        # checked) is another server and keeps its high-water mark.
        lock_url, store_url = own_server.url, redis_server.url
        argvs = [
            (REPLICA, "turns", lock_url, store_url, "c", "0.6", "40", f"r{n}") for n in range(2)
        ]
        async with running(*argvs) as children:
            for child in children:
                assert "started" in await child.read()
            own_server.kill()
            await anyio.sleep(0.3)
            own_server.start()
            outcomes = [await outcomes_of(child) for child in children]
        flat = [outcome for per_child in outcomes for outcome in per_child]
        assert len(flat) == 80  # every turn accounted for
        allowed = {"ok", "LeaseLostError", "CoordinationUnavailableError", "StaleFenceError"}
        assert set(flat) <= allowed, flat
        assert flat.count("ok") >= 40  # it recovered
        completed = {
            f"r{n}-{i}"
            for n, per_child in enumerate(outcomes)
            for i, o in enumerate(per_child)
            if o == "ok"
        }
        entries = await FencedLog(redis_client, "log").entries()
        assert_completed_turns_never_overlap(entries, completed)


async def test_client_pause_cancels_the_running_turn(redis_client: Any) -> None:
    with anyio.fail_after(10):
        started = anyio.Event()

        async def turn(fence: int) -> None:
            started.set()
            await anyio.sleep(30)

        job = Job(turn)
        async with TurnRegistry(locker=RedisLocker(redis_client, ttl=0.5)) as turns:
            turns.submit("c", job)
            await started.wait()
            await redis_client.client_pause(1500, all=True)
            await job.wait()
        assert isinstance(job.error, LeaseLostError)


# --- issue 12: no stale write, ever ---------------------------------------------------------


async def test_a_stalled_holders_write_is_refused_once_the_next_holder_has_read(
    redis_server: ThrowawayServer, redis_client: Any
) -> None:
    with anyio.fail_after(30):
        # A read-modify-write: the holder reads the log, waits on "the model", writes
        # entries + 1. The old holder stalls (SIGSTOP) past its ttl after reading; the new
        # holder takes over and reads under its fence, but has not written yet when the
        # old one wakes and writes. The fenced read must have fenced that write off, or the
        # new holder's write would then lose it.
        ttl = 0.5
        log = FencedLog(redis_client, "log")
        await log.append(1, "1")
        async with running((REPLICA, "stall-rmw", redis_server.url, "c", str(ttl))) as (old,):
            first = await old.read()
            assert first["read"] == 1
            old.signal(signal.SIGSTOP)
            lease = await RedisLocker(redis_client, ttl=ttl).acquire("c")  # after it lapsed
            assert lease.fence > first["fence"]
            read = len(await log.entries(fence=lease.fence))  # the new holder's read
            old.signal(signal.SIGCONT)
            old.send("the model answered")
            assert (await old.read())["append"] == "StaleFenceError"
            await log.append(lease.fence, str(read + 1))
            await lease.release()
        assert await log.entries() == [(1, "1"), (lease.fence, "2")]  # no update lost


async def test_a_restart_without_persistence_grants_nothing_while_old_leases_may_run(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(30):
        ttl = 1.5
        argv = (REPLICA, "hold", own_server.url, "lovely:", "c", str(ttl))
        async with running(argv) as (holder,):
            old_fence = (await holder.read())["fence"]
            own_server.restart()  # every lease forgotten, but the holder still runs
            restarted_at = anyio.current_time()
            client = redis_connect(own_server.url, **RECONNECTING)
            lease = await RedisLocker(client, ttl=ttl).acquire("c")
            granted_at = anyio.current_time()
            # The holder's renewal was refused (the lease is gone) or failed: it knows it
            # lost the lease, and the last deadline it could show it held by came before
            # anyone else was granted it.
            deadline = (await holder.read())["deadline"]
        assert deadline < granted_at
        assert granted_at - restarted_at >= ttl - 0.25  # a quiet period of the ttl
        assert lease.fence > old_fence  # fences keep increasing
        await lease.release()


async def test_a_grant_that_arrives_after_its_ttl_is_never_returned(
    redis_server: ThrowawayServer,
    redis_client: Any,
    redis_connect: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(20):
        ttl = 0.2
        async with proxy_to(redis_server.port) as proxy:
            slow = RedisLocker(redis_connect(proxy.url), ttl=ttl)
            await slow.acquire("warm-up")  # connections made, version checked
            # Requests arrive at once, replies 0.3 s late: the server grants, the lease
            # lapses there after 0.2 s, another replica takes it, and only then does the
            # grant reach the caller.
            proxy.delay(0.3)
            other = RedisLocker(redis_client, ttl=5)
            returned: list[RedisLease] = []

            async def slow_acquire() -> None:
                returned.append(await slow.acquire("c"))

            with caplog.at_level(logging.WARNING, "lovely_coordinator.redis"):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(slow_acquire)
                    holder = await other.acquire("c")  # once the first grant lapsed
                    while "after its ttl had run out" not in caplog.text:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                    assert not returned  # the stale grant was given back, not returned
                    proxy.heal()
                    await anyio.sleep(0.05)
                    assert not returned  # ...and the caller waits while the other holds
                    await holder.release()
        (lease,) = returned
        assert lease.fence > holder.fence
        assert not lease.lost.is_set()
        owner_and_fence = (await redis_client.get(KEYS["lock"])).decode()
        assert owner_and_fence.endswith(f" {lease.fence}")  # really held, by this grant
        await lease.release()


async def test_braces_in_prefixes_and_ids_never_make_two_objects_meet(redis_client: Any) -> None:
    with anyio.fail_after(10):
        # Without escaping, these pairs produced the same keys (or one hash tag for all).
        pairs = [
            (("app:{t}:", "x"), ("app:", "t}:{x")),
            (("", "{a}"), ("{", "a}")),
            (("p{", "}q"), ("p", "{}q")),
        ]
        for (prefix_a, conv_a), (prefix_b, conv_b) in pairs:
            a = await RedisLocker(redis_client, ttl=5, prefix=prefix_a).acquire(conv_a)
            with anyio.fail_after(1):  # never waits for the other
                b = await RedisLocker(redis_client, ttl=5, prefix=prefix_b).acquire(conv_b)
            await a.release()
            await b.release()
        # A locker's conversation "pool:q" and the pool "q" of the same prefix.
        lease = await RedisLocker(redis_client, ttl=5).acquire("pool:q")
        with anyio.fail_after(1):  # never waits for the other
            await RedisPermitPool(redis_client, name="q", limit=1, ttl=5).acquire()
        await lease.release()
        # Every object its own counter (hence its own keys).
        assert len(await redis_client.keys("*fence")) == 2 * 3 + 2


def test_a_lease_held_at_shutdown_never_keeps_the_loop_alive(
    redis_server: ThrowawayServer,
) -> None:
    # 40 programs each return while holding a lease with a 50 ms ttl, at random moments
    # of the renewal cycle. Before the fix about one in ten never finished: the renewal
    # outlived asyncio.run()'s cancellation (redis-py swallowed it on Python 3.11).
    import subprocess

    result = subprocess.run(
        [sys.executable, REPLICA, "exit-holding", redis_server.url, "0.05", "40"],
        capture_output=True,
        text=True,
        timeout=30,  # a hung run: subprocess.TimeoutExpired
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert '"runs": 40' in result.stdout

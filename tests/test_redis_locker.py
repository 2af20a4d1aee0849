"""RedisLocker / RedisLease against a real throwaway server (asyncio-only)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio
import redis.exceptions

from lovely_coordinator import InvalidArgumentError
from lovely_coordinator._redis import scripts
from lovely_coordinator._redis.child import Child, running
from lovely_coordinator._redis.server import ThrowawayServer
from lovely_coordinator.redis import FencedLog, RedisLease, RedisLocker
from lovely_coordinator.turns import Job, LeaseLostError, TurnRegistry

REPLICA = str(Path(__file__).with_name("redis_replica.py"))


# Options of a client that retries a command once its pooled connection died with the server.
RECONNECTING: dict[str, Any] = {"retry_on_error": [redis.exceptions.ConnectionError]}


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
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        client = redis_connect(own_server.url, **RECONNECTING)
        locker = RedisLocker(client, ttl=5)
        async with await locker.acquire("c") as before:
            pass
        own_server.restart()
        assert await client.exists("lovely:{c}:fence") == 0  # the counter is gone
        async with await locker.acquire("c") as after:
            assert after.fence > before.fence


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
async def test_release_in_a_cancelled_scope_still_deletes_the_lease(redis_client: Any) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(redis_client, ttl=0.3)
        lease = await locker.acquire("c")
        await anyio.sleep(0.15)  # past the first renewal: the watchdog task is running
        with anyio.CancelScope() as scope:
            scope.cancel()
            await lease.release()  # shielded: the redis-py #3847 wedge cannot happen
        assert lease.released
        assert await redis_client.exists("lovely:{c}:lock") == 0
        assert not lease.lost.is_set()


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


@pytest.mark.asyncio
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
            while not await redis_client.exists("lovely:{ç}:waiting"):  # noqa: ASYNC110
                await anyio.sleep(0.005)
            await anyio.wait_all_tasks_blocked()
            with anyio.fail_after(0.5):  # far below the 1 s re-check
                await holder.release()


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


class ReplyEatingProxy:
    """A loopback TCP proxy: on its first connection, replies to scripts never arrive.

    The connection handshake is answered normally; from the first EVALSHA on, requests
    still reach the server but its replies are dropped.
    """

    def __init__(self, port: int) -> None:
        self._port = port
        self._connections = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        first = self._connections == 1
        eating = False
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._writers += (writer, up_writer)

        async def requests() -> None:
            nonlocal eating
            while data := await reader.read(65536):
                eating = eating or (first and b"EVALSHA" in data.upper())
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def replies() -> None:
            while data := await up_reader.read(65536):
                if not eating:
                    writer.write(data)
                    await writer.drain()
            writer.close()

        for pump in (requests(), replies()):
            self._tasks.add(asyncio.create_task(pump))

    async def close(self) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await self._server.wait_closed()


@pytest.mark.asyncio
async def test_cancelled_acquire_whose_reply_was_lost_cleans_up(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        proxy = ReplyEatingProxy(redis_server.port)
        try:
            client = redis_connect(f"redis://127.0.0.1:{await proxy.start()}")
            await cancel_an_acquire_whose_reply_is_lost(client, redis_client)
        finally:
            await proxy.close()


async def cancel_an_acquire_whose_reply_is_lost(client: Any, redis_client: Any) -> None:
    locker = RedisLocker(client, ttl=30)
    await redis_client.script_load(scripts.LOCK_ACQUIRE)  # no NOSCRIPT round trip
    # The server grants the request, but the reply never arrives and the caller
    # gives up: the clean-up (on a fresh connection) must delete that grant.
    with anyio.move_on_after(0.3):
        await locker.acquire("c")
    assert await redis_client.exists("lovely:{c}:fence") == 1  # the grant did happen
    assert await redis_client.exists("lovely:{c}:lock") == 0  # ...and was cleaned up
    async with await RedisLocker(redis_client, ttl=30).acquire("c"):
        pass  # not stuck behind a 30 s ghost


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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

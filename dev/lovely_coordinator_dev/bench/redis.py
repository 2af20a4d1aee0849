"""Benchmark section ``redis``: leases, hand-offs, gates, fenced reads and the permit pool.

Everything runs against one private server started here (see ``testing/redis_server.py``),
and every comparison is made in the same run: against redis-py's own ``redis.asyncio.lock.Lock``
used with its defaults, and a fenced read against a plain ``entries()``. Hand-offs and
gate closes are measured between processes (``redis_workers.py``) on the system-wide
monotonic clock: from just before the holder's release (or the close) to the moment the
other process holds the lease (or its coordinator's gate is closed).

Leases contended by 8 processes are measured on the server and again on a 3-node Redis
Cluster (``testing/redis_cluster.py``) of the same binary, with an uncontended
acquire+release on each, taken in turn.

The cross-process hand-off is also measured through a TCP proxy (the fault proxy of the
chaos runs, an asyncio process in the path) and with the machine busy (three processes
cycling pool permits through that proxy, as the replicas of a fault run do): together they
account for the milliseconds a fault run measures, which the lease protocol does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import redis.asyncio
from redis.asyncio.lock import Lock

from lovely_coordinator import create_agent_coordinator
from lovely_coordinator._redis.keys import object_base
from lovely_coordinator.redis import FencedLog, RedisGates, RedisLocker

from ..testing.child import Child, running
from ..testing.faults import FaultProxy
from ..testing.redis_cluster import ThrowawayCluster
from ..testing.redis_server import ThrowawayServer
from . import Figure
from .redis_workers import GATED, HANDOFF_ID

__all__ = ["run"]

_WORKERS = "lovely_coordinator_dev.bench.redis_workers"


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def _alternating(
    contenders: list[Callable[[int], Awaitable[object]]], rounds: int
) -> list[float]:
    """Seconds per call of each contender (medians over 30 chunks), measured in chunks
    taken in turn, so that load from elsewhere on the machine falls on all alike, and the
    median keeps a burst from deciding."""
    chunks: list[list[float]] = [[] for _ in contenders]
    size = max(1, rounds // 30)
    for i in range(50):  # warm up: connections, script cache
        for op in contenders:
            await op(i)
    for _ in range(30):
        for which, op in enumerate(contenders):
            start = time.perf_counter()
            for i in range(size):
                await op(i)
            chunks[which].append((time.perf_counter() - start) / size)
    return [statistics.median(times) for times in chunks]


async def _uncontended(client: redis.asyncio.Redis, rounds: int) -> list[float]:
    locker = RedisLocker(client, ttl=30)

    async def ours(i: int) -> None:
        lease = await locker.acquire(f"u{i % 8}")
        await lease.release()

    async def theirs(i: int) -> None:
        lock = Lock(client, f"lock:u{i % 8}", timeout=30)
        await lock.acquire()
        await lock.release()

    return await _alternating([ours, theirs], rounds)


async def _confirmed(client: redis.asyncio.Redis, rounds: int) -> list[float]:
    """Acquire+release with ``min_replicas`` 0 and 1 (the server has one replica)."""
    plain, confirmed = RedisLocker(client, ttl=30), RedisLocker(client, ttl=30, min_replicas=1)

    async def unconfirmed(i: int) -> None:
        await (await plain.acquire(f"r{i % 8}")).release()

    async def one_replica(i: int) -> None:
        await (await confirmed.acquire(f"r{i % 8}")).release()

    return await _alternating([unconfirmed, one_replica], rounds)


async def _fenced_read(client: redis.asyncio.Redis, rounds: int, size: int) -> list[float]:
    log = FencedLog(client, f"bench:log:{size}")
    for n in range(20):  # a conversation of some length
        await log.append(7, f"message {n}: " + "x" * size)

    async def plain(_: int) -> None:
        await log.entries()

    async def fenced(_: int) -> None:
        await log.entries(fence=7)

    return await _alternating([plain, fenced], rounds)


async def _in_process_handoffs(url: str, rounds: int) -> tuple[list[float], list[float]]:
    """Release-to-held latency between two clients of one process: ours and redis-py's."""
    async with redis.asyncio.Redis.from_url(url) as a, redis.asyncio.Redis.from_url(url) as b:
        locker_a, locker_b = RedisLocker(a, ttl=30), RedisLocker(b, ttl=30)

        async def ours(locker: RedisLocker) -> Callable[[], Awaitable[None]]:
            return (await locker.acquire("h-local")).release

        async def theirs(client: redis.asyncio.Redis) -> Callable[[], Awaitable[None]]:
            lock = Lock(client, "lock:h", timeout=30, blocking_timeout=30)
            await lock.acquire()
            return lock.release

        async def handoffs(
            hold: Callable[[], Awaitable[Callable[[], Awaitable[None]]]],
            wait: Callable[[], Awaitable[Callable[[], Awaitable[None]]]],
            count: int,
        ) -> list[float]:
            latencies: list[float] = []
            for _ in range(count):
                release = await hold()
                waiter = asyncio.ensure_future(wait())
                await asyncio.sleep(0.02)  # let the waiter find the lock held and park
                released_at = time.perf_counter()
                await release()
                release_waiter = await waiter
                latencies.append(time.perf_counter() - released_at)
                await release_waiter()
            return latencies

        mine = await handoffs(lambda: ours(locker_a), lambda: ours(locker_b), rounds)
        redis_py = await handoffs(lambda: theirs(a), lambda: theirs(b), max(5, rounds // 2))
        return mine, redis_py


async def _cross_process_handoffs(url: str, child_url: str, rounds: int) -> list[float]:
    """Release (here) to held (in another process, connected to ``child_url``)."""
    async with redis.asyncio.Redis.from_url(url) as client:
        locker = RedisLocker(client, ttl=30)
        waiting = f"{object_base('lovely:', 'conv', HANDOFF_ID)}:waiting"
        async with running(("-m", _WORKERS, "handoff", child_url)) as (child,):
            assert (await child.read())["ready"]
            latencies: list[float] = []
            for _ in range(rounds):
                lease = await locker.acquire(HANDOFF_ID)
                child.send("go")
                while not await client.exists(waiting):  # noqa: ASYNC110  (state in Redis)
                    await asyncio.sleep(0.001)  # until its refused attempt is in
                await asyncio.sleep(0.01)  # ...and it parked
                released_at = time.monotonic()
                await lease.release()
                latencies.append((await child.read())["t"] - released_at)
                assert (await child.read())["released"]
            child.send("stop")
            return latencies


async def _gate_propagation(url: str, rounds: int) -> list[float]:
    """From a close here to the other process's coordinator having the gate closed."""
    async with redis.asyncio.Redis.from_url(url) as client:
        gates = RedisGates(client, create_agent_coordinator(1), resync_interval=60)
        async with gates, running(("-m", _WORKERS, "gates", url)) as (child,):
            assert (await child.read())["ready"]
            latencies: list[float] = []
            for _ in range(rounds):
                closed_at = time.monotonic()
                await gates.close_tuple(GATED, reopen_after=60)
                report = await child.read()
                assert report["open"] is False
                latencies.append(report["t"] - closed_at)
                await gates.open_tuple(GATED)
                assert (await child.read())["open"] is True
            child.send("stop")
            return latencies


@contextlib.asynccontextmanager
async def _busy(url: str, processes: int = 3) -> AsyncIterator[list[Child]]:
    """``processes`` pool workers cycling permits (with no work) until the block ends."""
    args = ("-m", _WORKERS, "pool", url, "bench-load", "5", "8", "1000000")
    async with running(*[args] * processes) as children:
        for child in children:
            assert (await child.read())["ready"]
        for child in children:
            child.send("go")
        await asyncio.sleep(0.5)  # up to speed
        yield children


async def _pool_throughput(url: str, tasks: int, rounds: int) -> float:
    args = ("-m", _WORKERS, "pool", url, "bench-pool", "5", str(tasks), str(rounds))
    async with running(args, args, args) as children:
        for child in children:
            assert (await child.read())["ready"]
        for child in children:
            child.send("go")
        reports = [await child.read() for child in children]
    grants: int = sum(r["grants"] for r in reports)
    elapsed: float = max(r["elapsed"] for r in reports)
    return grants / elapsed


async def _contended(
    url: str, processes: int, rounds: int, *, cluster: bool = False
) -> tuple[list[float], int]:
    """``processes`` processes taking turns on one conversation (20 ms holds): each wait,
    and the FIFO inversions (grants, in fence order, whose ticket is below the one before)."""
    args: tuple[str, ...] = ("-m", _WORKERS, "contend", url, str(rounds), "20")
    if cluster:
        args += ("--cluster",)
    async with running(*[args] * processes) as children:
        for child in children:
            assert (await child.read())["ready"]
        for child in children:
            child.send("go")
        reports = [(await child.read())["grants"] for child in children]
    waits = [wait for report in reports for wait, _, _ in report]
    by_fence = sorted((fence, ticket) for report in reports for _, fence, ticket in report)
    tickets = [ticket for _, ticket in by_fence]
    inversions = sum(1 for a, b in itertools.pairwise(tickets) if b < a)
    return waits, inversions


def _latencies(name: str, samples: list[float], target: float | None, note: str) -> list[Figure]:
    ms = 1000.0
    return [
        Figure(f"{name} p50", _percentile(samples, 0.5) * ms, "ms", target=target, note=note),
        Figure(
            f"{name} p99",
            _percentile(samples, 0.99) * ms,
            "ms",
            target=None if target is None else 2.5 * target,
        ),
    ]


async def _single_and_cluster(url: str, cluster_url: str, rounds: int) -> list[float]:
    """Uncontended acquire+release on one server and on a cluster, in turn."""
    single = redis.asyncio.Redis.from_url(url)
    on_cluster = redis.asyncio.RedisCluster.from_url(cluster_url)
    try:
        lockers = [RedisLocker(single, ttl=30), RedisLocker(on_cluster, ttl=30)]

        def cycle(locker: RedisLocker) -> Callable[[int], Awaitable[None]]:
            async def op(i: int) -> None:
                await (await locker.acquire(f"k{i % 8}")).release()

            return op

        return await _alternating([cycle(locker) for locker in lockers], rounds)
    finally:
        await single.aclose()
        await on_cluster.aclose()


def _contention(name: str, waits: list[float], inversions: int) -> list[Figure]:
    p50, p99 = _percentile(waits, 0.5), _percentile(waits, 0.99)
    return [
        Figure(f"{name}: wait p50", p50 * 1000, "ms", note="20 ms holds, ask to held"),
        Figure("  wait p99", p99 * 1000, "ms"),
        Figure("  p99 / p50", p99 / p50, "x", target=5.0),
        Figure("  FIFO inversions", inversions, "", target=0, note=f"of {len(waits)} grants"),
    ]


async def _measure(server: ThrowawayServer, quick: bool) -> list[Figure]:
    n = 30 if quick else 300
    async with redis.asyncio.Redis.from_url(server.url) as client:
        info = await client.info("server")
        name = info.get("server_name", "redis")
        version = info.get(f"{name}_version", info["redis_version"])
        ours, theirs = await _uncontended(client, 300 if quick else 3000)
        plain, fenced = await _fenced_read(client, 300 if quick else 3000, 100)
        plain_big, fenced_big = await _fenced_read(client, 300 if quick else 3000, 2000)
    local, redis_py = await _in_process_handoffs(server.url, 20 if quick else 100)
    between = await _cross_process_handoffs(server.url, server.url, n)
    proxy = await FaultProxy(server.port).start()
    try:
        proxied = await _cross_process_handoffs(server.url, proxy.url, n)
        async with _busy(proxy.url):
            busy = await _cross_process_handoffs(server.url, proxy.url, n)
    finally:
        await proxy.close()
    waits, inversions = await _contended(server.url, 8, 10 if quick else 40)
    with ThrowawayCluster(server.executable) as cluster:
        cluster_url = f"redis://{cluster.host}:{cluster.port}/0"
        one, many = await _single_and_cluster(server.url, cluster_url, 300 if quick else 3000)
        cluster_waits, cluster_inversions = await _contended(
            cluster_url, 8, 10 if quick else 40, cluster=True
        )
    with ThrowawayServer(server.executable) as replica:
        replica.replicate(server)
        async with redis.asyncio.Redis.from_url(server.url) as client:
            alone, confirmed = await _confirmed(client, 300 if quick else 3000)
    gate = await _gate_propagation(server.url, n)
    per_second = await _pool_throughput(server.url, 16, 20 if quick else 100)
    return [
        Figure("uncontended acquire+release", ours * 1e6, "us", note=f"{name} {version}"),
        Figure("  redis-py Lock acquire+release", theirs * 1e6, "us"),
        Figure("  ratio to redis-py Lock", ours / theirs, "x", target=1.5),
        *_latencies("hand-off between processes", between, 2.0, "release to held"),
        *_latencies("  same, in one process", local, None, "two clients"),
        *_latencies("  same, through a TCP proxy", proxied, None, "the chaos runs' proxy"),
        *_latencies(
            "  same, proxy + busy machine", busy, None, "3 processes cycling permits through it"
        ),
        *_latencies("  redis-py Lock hand-off", redis_py, None, "polls every 0.1 s by default"),
        *_contention("lease, 8 processes contending", waits, inversions),
        *_contention("  same, 3-node cluster", cluster_waits, cluster_inversions),
        Figure(
            "  cluster / single wait p50",
            _percentile(cluster_waits, 0.5) / _percentile(waits, 0.5),
            "x",
            target=1.5,
        ),
        Figure("acquire+release, one server", one * 1e6, "us", note="uncontended"),
        Figure("  same, 3-node cluster", many * 1e6, "us", note="RedisCluster client"),
        Figure("  ratio cluster / one server", many / one, "x", target=1.5),
        Figure("acquire+release, min_replicas=0", alone * 1e6, "us", note="1 replica"),
        Figure("  same, min_replicas=1", confirmed * 1e6, "us", note="WAIT after each grant"),
        Figure("  cost of min_replicas=1", (confirmed - alone) * 1e6, "us"),
        *_latencies("gate close propagation", gate, 5.0, "to the other process's coordinator"),
        Figure("plain entries(), 20 of 100 B", plain * 1e6, "us"),
        Figure("fenced entries(fence=f), same", fenced * 1e6, "us"),
        Figure("  ratio fenced / plain", fenced / plain, "x", target=1.2),
        Figure("plain entries(), 20 of 2 kB", plain_big * 1e6, "us"),
        Figure("fenced entries(fence=f), same", fenced_big * 1e6, "us"),
        Figure("  ratio fenced / plain", fenced_big / plain_big, "x", target=1.2),
        Figure(
            "permit pool grants/s",
            per_second,
            "1/s",
            note="3 processes x 16 tasks, limit 5, acquire+release with no work",
        ),
    ]


def run(quick: bool) -> list[Figure]:
    with ThrowawayServer() as server:
        return asyncio.run(_measure(server, quick))

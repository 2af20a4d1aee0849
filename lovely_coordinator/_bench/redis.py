"""Benchmark section ``redis``: leases, hand-off and the permit pool on a throwaway server.

Everything runs against one private server started here (see ``_redis/server.py``), and
every comparison is made in the same run against redis-py's own ``redis.asyncio.lock.Lock``
used with its defaults. Replicas are separate clients (separate connections); the permit
pool is driven by three processes. Run as a module with ``worker`` it is one of those
processes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio
from redis.asyncio.lock import Lock

from .._redis.child import running
from .._redis.server import ThrowawayServer
from ..redis import RedisLocker, RedisPermitPool
from . import Figure

__all__ = ["run"]


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def _uncontended(client: Any, rounds: int) -> tuple[float, float]:
    """Seconds per acquire+release, ours and redis-py's, measured in alternating chunks so
    that load from elsewhere on the machine falls on both alike."""
    locker = RedisLocker(client, ttl=30)

    async def ours(i: int) -> None:
        lease = await locker.acquire(f"u{i % 8}")
        await lease.release()

    async def theirs(i: int) -> None:
        lock = Lock(client, f"lock:u{i % 8}", timeout=30)
        await lock.acquire()
        await lock.release()

    contenders: list[Callable[[int], Awaitable[None]]] = [ours, theirs]
    totals = [0.0, 0.0]
    chunk = max(1, rounds // 10)
    for i in range(50):  # warm up: connections, script cache
        for op in contenders:
            await op(i)
    for _ in range(10):
        for which, op in enumerate(contenders):
            start = time.perf_counter()
            for i in range(chunk):
                await op(i)
            totals[which] += time.perf_counter() - start
    return totals[0] / (10 * chunk), totals[1] / (10 * chunk)


async def _handoffs(
    hold: Callable[[], Awaitable[Callable[[], Awaitable[None]]]],
    wait: Callable[[], Awaitable[Callable[[], Awaitable[None]]]],
    rounds: int,
) -> list[float]:
    """Latency from the holder starting its release to the waiter (other client) holding."""
    latencies: list[float] = []
    for _ in range(rounds):
        release = await hold()
        acquired: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def waiter(acquired: asyncio.Future[float]) -> None:
            release_waiter = await wait()
            acquired.set_result(time.perf_counter())
            await release_waiter()

        task = asyncio.create_task(waiter(acquired))
        await asyncio.sleep(0.02)  # let the waiter find the lock held and park
        released_at = time.perf_counter()
        await release()
        latencies.append(await acquired - released_at)
        await task
    return latencies


async def _contended(url: str, rounds: int) -> tuple[list[float], list[float]]:
    async with redis.asyncio.Redis.from_url(url) as a, redis.asyncio.Redis.from_url(url) as b:
        return await _contended_on(a, b, rounds)


async def _contended_on(a: Any, b: Any, rounds: int) -> tuple[list[float], list[float]]:
    locker_a, locker_b = RedisLocker(a, ttl=30), RedisLocker(b, ttl=30)

    def ours(locker: RedisLocker) -> Callable[[], Awaitable[Callable[[], Awaitable[None]]]]:
        async def take() -> Callable[[], Awaitable[None]]:
            return (await locker.acquire("h")).release

        return take

    def theirs(client: Any) -> Callable[[], Awaitable[Callable[[], Awaitable[None]]]]:
        async def take() -> Callable[[], Awaitable[None]]:
            lock = Lock(client, "lock:h", timeout=30, blocking_timeout=30)
            await lock.acquire()
            return lock.release

        return take

    mine = await _handoffs(ours(locker_a), ours(locker_b), rounds)
    redis_py = await _handoffs(theirs(a), theirs(b), max(5, rounds // 2))
    return mine, redis_py


async def _pool_throughput(url: str, tasks: int, rounds: int) -> float:
    args = ("-m", __name__, "worker", url, "bench-pool", "5", str(tasks), str(rounds))
    async with running(args, args, args) as children:
        for child in children:
            assert (await child.read())["ready"]
        for child in children:
            child.send("go")
        reports = [await child.read() for child in children]
    grants: int = sum(r["grants"] for r in reports)
    elapsed: float = max(r["elapsed"] for r in reports)
    return grants / elapsed


async def _measure(server: ThrowawayServer, quick: bool) -> list[Figure]:
    async with redis.asyncio.Redis.from_url(server.url) as client:
        info = await client.info("server")
        name = info.get("server_name", "redis")
        version = info.get(f"{name}_version", info["redis_version"])
        ours, theirs = await _uncontended(client, 300 if quick else 3000)
    mine, redis_py = await _contended(server.url, 20 if quick else 100)
    per_second = await _pool_throughput(server.url, 16, 20 if quick else 100)
    ms = 1000.0
    return [
        Figure("uncontended acquire+release", ours * 1e6, "us", note=f"{name} {version}"),
        Figure("  redis-py Lock acquire+release", theirs * 1e6, "us"),
        Figure("  ratio to redis-py Lock", ours / theirs, "x", target=1.5),
        Figure("hand-off latency p50", _percentile(mine, 0.5) * ms, "ms", target=2.0),
        Figure("hand-off latency p99", _percentile(mine, 0.99) * ms, "ms"),
        Figure(
            "  redis-py Lock hand-off p50",
            _percentile(redis_py, 0.5) * ms,
            "ms",
            note="polls every 0.1 s by default",
        ),
        Figure("  redis-py Lock hand-off p99", _percentile(redis_py, 0.99) * ms, "ms"),
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


async def _worker(args: argparse.Namespace) -> None:
    """One pool process: report ready, wait for "go", then every task cycles its permits."""
    async with redis.asyncio.Redis.from_url(args.url, max_connections=None) as client:
        await _work(client, args)


async def _work(client: Any, args: argparse.Namespace) -> None:
    pool = RedisPermitPool(client, name=args.name, limit=args.limit, ttl=30)
    await client.ping()
    print('{"ready": true}', flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = time.perf_counter()

    async def task() -> None:
        for _ in range(args.rounds):
            async with pool.permit():
                pass

    async with asyncio.TaskGroup() as tg:
        for _ in range(args.tasks):
            tg.create_task(task())
    elapsed = time.perf_counter() - start
    print(f'{{"grants": {args.tasks * args.rounds}, "elapsed": {elapsed}}}', flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m lovely_coordinator._bench.redis")
    parser.add_argument("mode", choices=["worker"])
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("limit", type=int)
    parser.add_argument("tasks", type=int)
    parser.add_argument("rounds", type=int)
    asyncio.run(_worker(parser.parse_args()))

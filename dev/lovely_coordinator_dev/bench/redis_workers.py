"""The other processes of the ``redis`` benchmark (``python -m`` this module, MODE ARGS).

Each reports on stdout, one JSON object per line, and takes orders on stdin as JSON
strings (see ``testing/child.py``). Times are ``time.monotonic()``, the system-wide
monotonic clock, so the parent can subtract its own readings from them.

* ``pool URL NAME LIMIT TASKS ROUNDS``: report ready, wait for ``"go"``, then TASKS tasks
  each take and release a permit ROUNDS times; report ``{"grants", "elapsed"}``.
* ``handoff URL``: on each ``"go"``, acquire the lease on ``h`` (the parent holds it),
  report ``{"t": when granted}``, release it, report ``{"released": true}``.
* ``contend URL ROUNDS HOLD_MS [--cluster]``: report ready, wait for ``"go"``, then ROUNDS
  times take the lease on ``fair``, hold it HOLD_MS, release it; report ``{"grants": [[wait
  s, fence, ticket], ...]}``. With ``--cluster``, URL is a node of a Redis Cluster.
* ``gates URL``: keep a coordinator in step through ``RedisGates``; report
  ``{"open": bool, "t": when}`` each time the coordinator's gate of ``bench/gate`` changes,
  as its ``subscribe`` callback sees it; stop on ``"stop"``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import redis.asyncio

from lovely_coordinator import CoordinatorStatistics, ModelTuple, create_agent_coordinator
from lovely_coordinator.redis import RedisGates, RedisLocker, RedisPermitPool

__all__ = ["CONTENDED_ID", "GATED", "HANDOFF_ID"]

GATED = ModelTuple("bench", "gate")
HANDOFF_ID = "h"
CONTENDED_ID = "fair"


def _report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def _order() -> str:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return str(json.loads(line)) if line else "stop"


async def _pool(args: argparse.Namespace) -> None:
    async with redis.asyncio.Redis.from_url(args.url, max_connections=None) as client:
        pool = RedisPermitPool(client, name=args.name, limit=args.limit, ttl=30)
        await client.ping()
        _report(ready=True)
        await _order()
        start = time.perf_counter()

        async def task() -> None:
            for _ in range(args.rounds):
                async with pool.permit():
                    pass

        async with asyncio.TaskGroup() as tg:
            for _ in range(args.tasks):
                tg.create_task(task())
        _report(grants=args.tasks * args.rounds, elapsed=time.perf_counter() - start)


async def _handoff(args: argparse.Namespace) -> None:
    async with redis.asyncio.Redis.from_url(args.url) as client:
        locker = RedisLocker(client, ttl=30)
        await client.ping()
        _report(ready=True)
        while await _order() == "go":
            lease = await locker.acquire(HANDOFF_ID)
            _report(t=time.monotonic())
            await lease.release()
            _report(released=True)


async def _contend(args: argparse.Namespace) -> None:
    connect = redis.asyncio.RedisCluster if args.cluster else redis.asyncio.Redis
    async with connect.from_url(args.url) as client:
        locker = RedisLocker(client, ttl=30)
        # Warm up (connection, script cache, the server's boot), outside the measurement.
        await (await locker.acquire(f"{CONTENDED_ID}-{os.getpid()}")).release()
        _report(ready=True)
        await _order()
        grants: list[tuple[float, int, int]] = []
        for _ in range(args.rounds):
            asked = time.monotonic()
            lease = await locker.acquire(CONTENDED_ID)
            grants.append((time.monotonic() - asked, lease.fence, lease.ticket))
            await asyncio.sleep(args.hold_ms / 1000)
            await lease.release()
        _report(grants=grants)


async def _gates(args: argparse.Namespace) -> None:
    async with redis.asyncio.Redis.from_url(args.url) as client:
        coordinator = create_agent_coordinator(1)
        last = True

        def on_update(_: CoordinatorStatistics) -> None:
            nonlocal last
            now_open = coordinator.is_tuple_open(GATED)
            if now_open != last:
                last = now_open
                _report(open=now_open, t=time.monotonic())

        coordinator.subscribe(on_update)
        async with RedisGates(client, coordinator, resync_interval=60):
            _report(ready=True)
            await _order()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m lovely_coordinator_dev.bench.redis_workers")
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("pool")
    p.add_argument("url")
    p.add_argument("name")
    p.add_argument("limit", type=int)
    p.add_argument("tasks", type=int)
    p.add_argument("rounds", type=int)
    c = modes.add_parser("contend")
    c.add_argument("url")
    c.add_argument("rounds", type=int)
    c.add_argument("hold_ms", type=float)
    c.add_argument("--cluster", action="store_true")
    for mode in ("handoff", "gates"):
        modes.add_parser(mode).add_argument("url")
    args = parser.parse_args()
    modes_run = {"pool": _pool, "handoff": _handoff, "gates": _gates, "contend": _contend}
    asyncio.run(modes_run[args.mode](args))


if __name__ == "__main__":
    main()

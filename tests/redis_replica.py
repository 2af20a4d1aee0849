"""A replica process for the cross-process Redis tests (run as a script, never collected).

Each mode connects to the server at ``url``, does its part and reports on stdout, one JSON
object per line, so the test can SIGKILL, SIGSTOP or wait for it at the right moment.

* ``hold URL PREFIX CONV TTL``: acquire the lease, print ``{"fence": n}``, hold it until killed.
* ``pool-hold URL NAME LIMIT TTL COUNT``: take COUNT permits, print their fences, hold them.
* ``pool-run URL NAME LIMIT TTL TASKS``: TASKS tasks each take one permit; inside it they
  INCR a shared counter (recording the value: the number of holders at that moment), pause
  briefly, DECR it. Prints ``{"grants": [[fence, ticket, holders], ...]}`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from typing import Any

import redis.asyncio

from lovely_coordinator.redis import RedisLocker, RedisPermitPool


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def hold(args: argparse.Namespace) -> None:
    client = redis.asyncio.Redis.from_url(args.url)
    lease = await RedisLocker(client, ttl=args.ttl, prefix=args.prefix).acquire(args.conv)
    report(fence=lease.fence)
    await asyncio.sleep(3600)


def pool(args: argparse.Namespace) -> tuple[Any, RedisPermitPool]:
    client = redis.asyncio.Redis.from_url(args.url)
    return client, RedisPermitPool(client, name=args.name, limit=args.limit, ttl=args.ttl)


async def pool_hold(args: argparse.Namespace) -> None:
    _, permits = pool(args)
    held = [await permits.acquire() for _ in range(args.count)]
    report(fences=[p.fence for p in held])
    await asyncio.sleep(3600)


async def pool_run(args: argparse.Namespace) -> None:
    client, permits = pool(args)
    grants: list[list[int]] = []
    rng = random.Random(args.tasks)

    async def task() -> None:
        async with permits.permit() as permit:
            holders = await client.incr(f"{args.name}:holders-now")
            await asyncio.sleep(rng.uniform(0.001, 0.004))
            await client.decr(f"{args.name}:holders-now")
            grants.append([permit.fence, permit.ticket, holders])

    async with asyncio.TaskGroup() as tg:
        for _ in range(args.tasks):
            tg.create_task(task())
    report(grants=grants)
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("hold")
    p.add_argument("url")
    p.add_argument("prefix")
    p.add_argument("conv")
    p.add_argument("ttl", type=float)
    for mode in ("pool-hold", "pool-run"):
        p = modes.add_parser(mode)
        p.add_argument("url")
        p.add_argument("name")
        p.add_argument("limit", type=int)
        p.add_argument("ttl", type=float)
        p.add_argument("count" if mode == "pool-hold" else "tasks", type=int)
    args = parser.parse_args()
    run = {"hold": hold, "pool-hold": pool_hold, "pool-run": pool_run}[args.mode]
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

"""A replica process for the cross-process Redis tests (run as a script, never collected).

Each mode connects to the server at ``url``, does its part and reports on stdout, one JSON
object per line, so the test can SIGKILL, SIGSTOP or wait for it at the right moment.

* ``hold URL PREFIX CONV TTL``: acquire the lease, print ``{"fence": n}``, hold it until killed.
* ``pool-hold URL NAME LIMIT TTL COUNT``: take COUNT permits, print their fences, hold them.
* ``pool-run URL NAME LIMIT TTL TASKS``: TASKS tasks each take one permit; inside it they
  INCR a shared counter (recording the value: the number of holders at that moment), pause
  briefly, DECR it. Prints ``{"grants": [[fence, ticket, holders], ...]}`` at the end.
* ``turns URL STORE_URL CONV TTL TURNS NAME``: run TURNS turns one after another through
  ``TurnRegistry(locker=RedisLocker(...))``; each appends ``start``, two ticks and ``end``
  to the FencedLog ``log`` on the store server. Prints ``{"started": fence}`` after its
  first turn, then ``{"outcomes": [...]}``: ``"ok"`` or the exception's class name. After
  a refusal for want of coordination it waits 50 ms, as a client retrying would.
* ``stale URL STORE_URL CONV TTL``: one turn that prints ``{"started": fence}`` and then
  keeps appending ticks (counting the refused ones) until it is cancelled, with one last
  shielded append on its way out. Prints ``{"error": class name, "refused": n}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import anyio
import redis.asyncio

from lovely_coordinator.redis import FencedLog, RedisLocker, RedisPermitPool, StaleFenceError
from lovely_coordinator.turns import CoordinationUnavailableError, Job, TurnRegistry


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


@contextlib.asynccontextmanager
async def registry(args: argparse.Namespace) -> AsyncIterator[tuple[TurnRegistry, FencedLog]]:
    """A turn registry on the lock server and the log on the store; clients closed after."""
    async with (
        redis.asyncio.Redis.from_url(args.url) as lock_client,
        redis.asyncio.Redis.from_url(args.store_url) as store_client,
    ):
        locker = RedisLocker(lock_client, ttl=args.ttl)
        yield TurnRegistry(locker=locker), FencedLog(store_client, "log")


async def turns(args: argparse.Namespace) -> None:
    async with registry(args) as (turn_registry, log):
        await run_turns(args, turn_registry, log)


async def run_turns(args: argparse.Namespace, turn_registry: TurnRegistry, log: FencedLog) -> None:
    outcomes: list[str] = []
    async with turn_registry:
        for index in range(args.turns):
            label = f"{args.name}-{index}"

            async def turn(fence: int, label: str = label) -> None:
                await log.append(fence, f"start {label}")
                for _ in range(2):
                    await asyncio.sleep(0.002)
                    await log.append(fence, f"tick {label}")
                await log.append(fence, f"end {label}")
                if not outcomes:
                    report(started=fence)

            try:
                await turn_registry.run(args.conv, turn)
            except CoordinationUnavailableError as exc:
                outcomes.append(type(exc).__name__)
                await asyncio.sleep(0.05)  # as its message says: retry the turn shortly
            except Exception as exc:
                outcomes.append(type(exc).__name__)
            else:
                outcomes.append("ok")
    report(outcomes=outcomes)


async def stale(args: argparse.Namespace) -> None:
    async with registry(args) as (turn_registry, log):
        await run_stale(args, turn_registry, log)


async def run_stale(args: argparse.Namespace, turn_registry: TurnRegistry, log: FencedLog) -> None:
    refused = 0

    async def turn(fence: int) -> None:
        nonlocal refused
        report(started=fence)
        try:
            while True:
                try:
                    await log.append(fence, "tick stale")
                except StaleFenceError:
                    refused += 1
                await asyncio.sleep(0.02)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await log.append(fence, "last words")
                except StaleFenceError:
                    refused += 1

    async with turn_registry:
        job = Job(turn)
        turn_registry.submit(args.conv, job)
        await job.wait()
    report(error=type(job.error).__name__, refused=refused)


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
    for mode in ("turns", "stale"):
        p = modes.add_parser(mode)
        p.add_argument("url")
        p.add_argument("store_url")
        p.add_argument("conv")
        p.add_argument("ttl", type=float)
        if mode == "turns":
            p.add_argument("turns", type=int)
            p.add_argument("name")
    args = parser.parse_args()
    run = {
        "hold": hold,
        "pool-hold": pool_hold,
        "pool-run": pool_run,
        "turns": turns,
        "stale": stale,
    }[args.mode]
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

"""A replica process for the cross-process Redis tests (run as a script, never collected).

Each mode connects to the server at ``url``, does its part and reports on stdout, one JSON
object per line, so the test can SIGKILL, SIGSTOP or wait for it at the right moment.

* ``hold URL PREFIX CONV TTL``: acquire the lease, print ``{"fence": n}``, hold it until
  killed, printing ``{"lost": t, "deadline": d}`` (loop time) if it is lost meanwhile:
  when that was noticed, and the local deadline it could be shown held until.
* ``pool-hold URL NAME LIMIT TTL COUNT``: take COUNT permits, print their fences, hold them
  (printing ``{"lost": t, "deadline": d}`` when one is lost).
* ``stall-rmw URL CONV TTL``: take the lease, read the FencedLog ``log`` under its fence and
  print ``{"fence": n, "read": entries}``; on a line from stdin (the "model" answered),
  append ``str(entries + 1)`` under the same fence whatever happened to the lease, and
  print ``{"append": "ok" | error class name}``.
* ``exit-holding URL TTL RUNS``: RUNS times, ``asyncio.run()`` a program that takes a lease
  and returns at a random moment while still holding it; print ``{"runs": RUNS}`` at the
  end (a run whose loop never closes leaves the parent waiting).
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
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from lovely_coordinator.redis import FencedLog, RedisLocker, RedisPermitPool, StaleFenceError
from lovely_coordinator.turns import CoordinationUnavailableError, Job, TurnRegistry


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def connect(url: str) -> redis.asyncio.Redis:
    """A client that retries a command whose connection broke (as the README shows)."""
    return redis.asyncio.Redis.from_url(
        url, retry=Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.01), 3)
    )


async def report_loss(*grants: Any) -> None:
    """Report each grant's loss: when it was noticed, and the deadline it was valid until."""
    async with anyio.create_task_group() as tg:
        for grant in grants:

            async def wait(grant: Any = grant) -> None:
                await grant.lost.wait()
                report(lost=anyio.current_time(), deadline=grant._renewer._deadline)

            tg.start_soon(wait)


async def hold(args: argparse.Namespace) -> None:
    client = connect(args.url)
    lease = await RedisLocker(client, ttl=args.ttl, prefix=args.prefix).acquire(args.conv)
    report(fence=lease.fence)
    await report_loss(lease)
    await asyncio.sleep(3600)


def pool(args: argparse.Namespace) -> tuple[Any, RedisPermitPool]:
    client = connect(args.url)
    return client, RedisPermitPool(client, name=args.name, limit=args.limit, ttl=args.ttl)


async def pool_hold(args: argparse.Namespace) -> None:
    _, permits = pool(args)
    held = [await permits.acquire() for _ in range(args.count)]
    report(fences=[p.fence for p in held])
    await report_loss(*held)
    await asyncio.sleep(3600)


async def stall_rmw(args: argparse.Namespace) -> None:
    client = connect(args.url)
    lease = await RedisLocker(client, ttl=args.ttl).acquire(args.conv)
    log = FencedLog(client, "log")
    entries = len(await log.entries(fence=lease.fence))
    report(fence=lease.fence, read=entries)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        await log.append(lease.fence, str(entries + 1))
    except StaleFenceError as exc:
        report(append=type(exc).__name__)
    else:
        report(append="ok")


def exit_holding(args: argparse.Namespace) -> None:
    rng = random.Random(0)

    async def one_run() -> None:
        # Neither the lease nor the client is closed: the loop's shutdown must stop both.
        client = redis.asyncio.Redis.from_url(args.url)
        await RedisLocker(client, ttl=args.ttl).acquire("c")
        # Return (the loop shuts down) at some moment of the renewal cycle.
        await asyncio.sleep(rng.uniform(0, 3 * args.ttl))

    for _ in range(args.runs):
        asyncio.run(one_run())
    report(runs=args.runs)


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
        connect(args.url) as lock_client,
        connect(args.store_url) as store_client,
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
    p = modes.add_parser("stall-rmw")
    p.add_argument("url")
    p.add_argument("conv")
    p.add_argument("ttl", type=float)
    p = modes.add_parser("exit-holding")
    p.add_argument("url")
    p.add_argument("ttl", type=float)
    p.add_argument("runs", type=int)
    args = parser.parse_args()
    if args.mode == "exit-holding":
        exit_holding(args)
        return
    run = {
        "hold": hold,
        "pool-hold": pool_hold,
        "pool-run": pool_run,
        "turns": turns,
        "stale": stale,
        "stall-rmw": stall_rmw,
    }[args.mode]
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

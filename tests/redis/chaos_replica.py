"""One replica of the chaos runs (run as a script by ``chaos.py``, never collected).

``python chaos_replica.py LOCK_URL STORE_URL NAME TTL LIMIT TOKENS_PER_MINUTE
[--unfenced] [--cluster]`` (``--cluster``: LOCK_URL is a node of a Redis Cluster)

It does, at the same time, what a server replica of an agent runtime does:

* **turns** of the conversation ``counter`` through ``TurnRegistry(locker=RedisLocker)``:
  each reads the FencedLog ``counter`` on the store (under its fence, unless
  ``--unfenced``), "waits on the model" for a while, and appends the number of entries it
  read plus one, under its fence: a read-modify-write counter;
* **permits** of the pool ``pool`` (limit LIMIT), taken by two tasks in turn and held
  briefly, or now and then for longer than a renewal;
* **gates**: a ``RedisGates`` keeps its coordinator in step; it samples whether the tuple
  ``chaos/gpt`` is open;
* **fleet calls**: two tasks make model requests for ``chaos/fleet`` one after another,
  admitted by the ``RedisFleet`` ``chaos`` (``on_unavailable="wait"``): its tuple limit is
  LIMIT, its budget TOKENS_PER_MINUTE tokens a minute, each call charged
  :data:`FLEET_TOKENS`.

Everything it observes is printed at once, one JSON object per line (a SIGKILL must lose
as little as possible), with times on the loop clock, which is the system-wide monotonic
clock, comparable across the processes of one machine:

* ``{"ready": true}`` once it runs;
* ``{"read": [fence, entries]}`` as a turn has read, and ``{"turn": {...}}`` as it ends:
  ``fence``, ``seen`` (entries read, or null), ``index`` (of its append, or null),
  ``outcome`` ("ok" or the exception's class name);
* ``{"hold": [start, end, fence]}`` for each permit: from when ``acquire()`` returned to
  the earlier of its release and the last local deadline it was renewed to (the part of
  the hold during which the permit could still be shown held);
* ``{"gate": [time, open]}`` whenever the sampled state of the tuple changes;
* ``{"closed": [time, seconds]}`` after it closed the tuple on request;
* ``{"unit": [start, end, server_ms, tokens]}`` for each fleet call: from when it was
  admitted to the earlier of its end and the member's last local deadline (while the
  unit could be shown held), the server's time of the admission, and its charge.

Commands on stdin, one JSON string per line (as ``Child.send`` writes them):
``"close SECONDS"`` (close the tuple through the gates) and ``"stop"``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from typing import Any

import anyio
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from lovely_coordinator import ModelTuple, create_agent_coordinator
from lovely_coordinator.redis import (
    FencedLog,
    RedisFleet,
    RedisGates,
    RedisLocker,
    RedisPermitPool,
)
from lovely_coordinator.turns import TurnRegistry

GATED = ModelTuple("chaos", "gpt")
FLEETED = ModelTuple("chaos", "fleet")
FLEET_TOKENS = 50


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def connect(url: str) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(
        url,
        retry=Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.01), 3),
        socket_timeout=2.0,  # a black-holed connection is given up after 2 s
        socket_connect_timeout=2.0,
    )


async def turns(args: argparse.Namespace, lock: redis.asyncio.Redis, store: Any) -> None:
    rng = random.Random(f"{args.name}-turns")
    log = FencedLog(store, "counter")

    async with TurnRegistry(locker=RedisLocker(lock, ttl=args.ttl)) as registry:
        while True:
            record: dict[str, Any] = {"fence": None, "seen": None, "index": None}

            async def turn(fence: int, record: dict[str, Any] = record) -> None:
                record["fence"] = fence
                if args.unfenced:
                    entries = await log.entries()
                else:
                    entries = await log.entries(fence=fence)
                record["seen"] = len(entries)
                report(read=[fence, len(entries)])
                await anyio.sleep(rng.uniform(0.02, 0.4))  # the model's answer
                record["index"] = await log.append(fence, str(len(entries) + 1))

            try:
                await registry.run("counter", turn)
            except Exception as exc:
                record["outcome"] = type(exc).__name__
                await anyio.sleep(0.05)  # retry the turn shortly, as a client would
            else:
                record["outcome"] = "ok"
            report(turn=record)


async def permits(args: argparse.Namespace, lock: redis.asyncio.Redis) -> None:
    rng = random.Random(f"{args.name}-permits")
    pool = RedisPermitPool(lock, name="pool", limit=args.limit, ttl=args.ttl)

    async def holder() -> None:
        while True:
            try:
                permit = await pool.acquire()
            except Exception:
                await anyio.sleep(0.05)
                continue
            start = anyio.current_time()
            # Mostly a short call; now and then a long one, across several renewals.
            long = rng.random() < 0.3
            await anyio.sleep(rng.uniform(0.3, 1.2) if long else rng.uniform(0.02, 0.08))
            end = anyio.current_time()
            deadline: float = permit._renewer._deadline
            await permit.release()
            report(hold=[start, min(end, deadline), permit.fence])
            await anyio.sleep(rng.uniform(0, 0.03))

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(holder)


async def fleet_calls(args: argparse.Namespace, lock: redis.asyncio.Redis) -> None:
    rng = random.Random(f"{args.name}-fleet")
    coordinator = create_agent_coordinator(4)
    fleet = RedisFleet(lock, coordinator, name="chaos", ttl=args.ttl, on_unavailable="wait")
    while True:
        try:
            await fleet.__aenter__()
            await fleet.set_tuple_limit(FLEETED, args.limit)
            await fleet.set_budget(FLEETED, tokens_per_minute=args.tokens_per_minute)
        except Exception:
            if fleet._stack is not None:
                await fleet.__aexit__(None, None, None)
                fleet = RedisFleet(
                    lock, coordinator, name="chaos", ttl=args.ttl, on_unavailable="wait"
                )
            await anyio.sleep(0.2)  # Redis unreachable at start: try again
            continue
        break

    async def caller() -> None:
        while True:
            try:
                async with coordinator.request(FLEETED, tokens=FLEET_TOKENS) as call:
                    start = anyio.current_time()
                    await anyio.sleep(rng.uniform(0.02, 0.1))
                    end = anyio.current_time()
                    deadline: float = fleet._member._deadline
                    unit: Any = call._outer
                    report(unit=[start, min(end, deadline), unit.admitted_ms, FLEET_TOKENS])
            except Exception:
                await anyio.sleep(0.05)

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(caller)
    finally:
        await fleet.__aexit__(None, None, None)


async def gates(args: argparse.Namespace, lock: redis.asyncio.Redis) -> None:
    coordinator = create_agent_coordinator(4)
    shared = RedisGates(lock, coordinator, resync_interval=2.0)
    while True:
        try:
            await shared.__aenter__()
        except Exception:
            await anyio.sleep(0.2)  # Redis unreachable at start: try again
            continue
        break
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample, coordinator)
            await commands(shared)
            tg.cancel_scope.cancel()
    finally:
        await shared.__aexit__(None, None, None)


async def sample(coordinator: Any) -> None:
    last: bool | None = None
    while True:
        now = coordinator.is_tuple_open(GATED)
        if now != last:
            report(gate=[anyio.current_time(), now])
            last = now
        await anyio.sleep(0.05)


async def commands(shared: RedisGates) -> None:
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        command = json.loads(line).split() if line else ["stop"]
        if command[0] == "stop":
            return
        if command[0] == "close":
            seconds = float(command[1])
            at = anyio.current_time()
            await shared.close_tuple(GATED, reopen_after=seconds)
            report(closed=[at, seconds])


def connect_cluster(url: str) -> Any:
    return redis.asyncio.RedisCluster.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)


async def main(args: argparse.Namespace) -> None:
    lock = connect_cluster(args.lock_url) if args.cluster else connect(args.lock_url)
    store = connect(args.store_url)
    report(ready=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(turns, args, lock, store)
        tg.start_soon(permits, args, lock)
        tg.start_soon(fleet_calls, args, lock)
        await gates(args, lock)  # returns on "stop"
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("lock_url")
    parser.add_argument("store_url")
    parser.add_argument("name")
    parser.add_argument("ttl", type=float)
    parser.add_argument("limit", type=int)
    parser.add_argument("tokens_per_minute", type=float)
    parser.add_argument("--unfenced", action="store_true")
    parser.add_argument("--cluster", action="store_true")
    asyncio.run(main(parser.parse_args()))

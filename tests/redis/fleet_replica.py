"""A fleet member process for the cross-process fleet tests (run as a script, never collected).

Each mode joins fleet NAME on the server at URL with its own coordinator, prints
``{"ready": true}``, and then does its part, reporting on stdout one JSON object per line.

* ``calls URL NAME TTL PROVIDER MODEL TASKS SECONDS TOKENS``: on a "go" line, TASKS tasks
  send chat completions to the fake provider at PROVIDER for SECONDS, each through
  ``coordinator.request(("openai", MODEL), tokens=TOKENS)`` and settled from the answer's
  usage. Prints ``{"ok": n, "refused": m}`` (429s) at the end.
* ``order URL NAME TTL KEY ME``: for every "go" line, one request for ("openai", "m")
  in a task of its own: once admitted it pushes ME onto the list KEY, prints
  ``{"in": ME}`` and holds until an "out" line.
* ``hold URL NAME TTL COUNT``: COUNT requests for ("openai", "m") with 100 tokens each,
  held; prints ``{"held": COUNT}``. On a "settle" line each settles at 10,000 tokens and
  is released; then prints ``{"settled": true}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import anyio
import httpx
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from lovely_coordinator import AgentCoordinator, ModelTuple, create_agent_coordinator
from lovely_coordinator.redis import RedisFleet

M = ModelTuple("openai", "m")


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def line() -> str:
    text = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return json.loads(text) if text.strip() else ""


def member(args: argparse.Namespace) -> tuple[AgentCoordinator, RedisFleet]:
    client = redis.asyncio.Redis.from_url(
        args.url, retry=Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.01), 3)
    )
    coordinator = create_agent_coordinator(64)
    return coordinator, RedisFleet(client, coordinator, name=args.name, ttl=args.ttl)


async def calls(args: argparse.Namespace) -> None:
    coordinator, fleet = member(args)
    model = ModelTuple("openai", args.model)
    ok = refused = 0
    async with fleet, httpx.AsyncClient(base_url=args.provider, timeout=30) as http:
        report(ready=True)
        await line()

        async def agent() -> None:
            nonlocal ok, refused
            while True:
                async with coordinator.request(model, tokens=args.tokens) as call:
                    response = await http.post(
                        "/v1/chat/completions",
                        json={
                            "model": args.model,
                            "messages": [{"role": "user", "content": "x" * 40}],
                            "max_tokens": args.tokens - 20,
                        },
                    )
                    if response.status_code == 429:
                        refused += 1
                        call.settle(0)
                        continue
                    usage = response.json()["usage"]
                    call.settle(usage["prompt_tokens"] + usage["completion_tokens"])
                    ok += 1

        with anyio.move_on_after(args.seconds):
            async with anyio.create_task_group() as tg:
                for _ in range(args.tasks):
                    tg.start_soon(agent)
    report(ok=ok, refused=refused)


async def order(args: argparse.Namespace) -> None:
    coordinator, fleet = member(args)
    async with fleet:
        client = redis.asyncio.Redis.from_url(args.url)
        report(ready=True)
        out = anyio.Event()

        async def one() -> None:
            async with coordinator.request(M):
                await client.rpush(args.key, args.me)
                report(**{"in": args.me})
                await out.wait()

        async with anyio.create_task_group() as tg:
            while (command := await line()) != "":
                if command == "go":
                    tg.start_soon(one)
                elif command == "out":
                    out.set()
                    out = anyio.Event()


async def hold(args: argparse.Namespace) -> None:
    coordinator, fleet = member(args)
    async with fleet:
        report(ready=True)
        settle = anyio.Event()
        held = 0

        async def one() -> None:
            nonlocal held
            async with coordinator.request(M, tokens=100) as call:
                held += 1
                if held == args.count:
                    report(held=held)
                await settle.wait()
                call.settle(10_000)

        async with anyio.create_task_group() as tg:
            for _ in range(args.count):
                tg.start_soon(one)
            await line()
            settle.set()
        await anyio.sleep(0.5)  # the settles and releases are sent meanwhile
        report(settled=True)
        await anyio.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("calls", "order", "hold"):
        p = sub.add_parser(mode)
        p.add_argument("url")
        p.add_argument("name")
        p.add_argument("ttl", type=float)
        if mode == "calls":
            p.add_argument("provider")
            p.add_argument("model")
            p.add_argument("tasks", type=int)
            p.add_argument("seconds", type=float)
            p.add_argument("tokens", type=int)
        elif mode == "order":
            p.add_argument("key")
            p.add_argument("me")
        else:
            p.add_argument("count", type=int)
    args = parser.parse_args()
    asyncio.run({"calls": calls, "order": order, "hold": hold}[args.mode](args))


if __name__ == "__main__":
    main()

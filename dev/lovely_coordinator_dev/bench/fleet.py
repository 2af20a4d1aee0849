"""Benchmark section ``fleet``: processes sharing one provider key, with and without a fleet.

A local fake provider (``lovely_coordinator_limits.testing``) announces :data:`PER_MINUTE`
in its headers and enforces a :data:`WINDOW`-second bucket of it, as ``bench provider``
does. Separate processes share the key, each with :data:`AGENTS` agents sending one chat
completion after another through the real openai SDK and the coordinator's transport
(SDK retries off, 429s parked and retried by the transport). Three configurations, with 3
and 8 processes, each for :data:`SECONDS` seconds:

- ``alone``: no fleet; each process learns its budget from the headers and estimates its
  share of it (the fallback without Redis);
- ``fleet``: a ``RedisFleet`` with the budget set explicitly and a fleet tuple limit of
  :data:`FLEET_LIMIT` calls in flight;
- ``learned``: the same fleet, its budget learned from the headers only.

Measured at the provider: the share of 429s, the goodput (tokens served over what the quota
allowed in the run), the most calls in flight at once; by the agents: calls lost; across
processes: Jain's fairness index of the calls each completed. Then: a process that joins a
busy fleet late (how long until its share of the calls over a 2 s window is within 30% of
its demand share), a killed member's units (how long until they are admitted elsewhere),
and the cost of a fleet admission when nothing waits (one script call on loopback).

Run as ``python -m lovely_coordinator_dev.bench.fleet worker ...`` it is one process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import openai
import redis.asyncio
from lovely_coordinator_httpx import CoordinatedTransport
from lovely_coordinator_limits.testing import FakeProvider, Quota, Seen, serve

from lovely_coordinator import ModelTuple, create_agent_coordinator
from lovely_coordinator.redis import RedisFleet

from ..testing.child import running
from ..testing.redis_server import ThrowawayServer
from . import Figure
from .provider import LATENCY, PER_MINUTE, WINDOW, _prompt

__all__ = ["run"]

SECONDS = 20.0
AGENTS = 8
FLEET_LIMIT = 12
TTL = 2.0
CONFIGURATIONS = {
    "alone": "no fleet (per-process share estimation)",
    "fleet": "RedisFleet, budget set",
    "learned": "RedisFleet, budget learned from headers",
}


@dataclass(frozen=True, slots=True)
class Result:
    mode: str
    processes: int
    calls: int
    refused: int
    served_tokens: int
    allowed_tokens: float
    lost: int
    peak: int
    jain: float

    @property
    def refused_percent(self) -> float:
        return 100.0 * self.refused / self.calls if self.calls else 0.0

    @property
    def goodput_percent(self) -> float:
        return 100.0 * self.served_tokens / self.allowed_tokens


def _jain(values: Sequence[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 0.0


# --- one process ---------------------------------------------------------------------------


async def _worker(args: argparse.Namespace) -> None:
    """Report ready, wait for "go", run the agents, report what was done (and when)."""
    import random

    rng = random.Random(args.seed)
    coordinator = create_agent_coordinator(AGENTS)
    transport = CoordinatedTransport(coordinator, providers={"127.0.0.1": "bench"})
    client = openai.AsyncOpenAI(
        api_key="bench",
        base_url=f"{args.url}/v1",
        http_client=httpx2.AsyncClient(transport=transport, timeout=60.0),
        max_retries=0,
    )
    done: list[float] = []
    lost = 0
    async with client, redis.asyncio.Redis.from_url(args.redis) as store:
        fleet = None if args.mode == "alone" else RedisFleet(store, coordinator, name=args.fleet)
        async with fleet if fleet is not None else _nothing():
            print('{"ready": true}', flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

            async def agent() -> None:
                nonlocal lost
                while True:
                    try:
                        await client.chat.completions.create(
                            model=args.model,
                            messages=[{"role": "user", "content": _prompt(rng)}],
                            max_tokens=200,
                        )
                        done.append(time.monotonic())
                    except openai.APIError:
                        lost += 1

            with anyio.move_on_after(args.seconds):
                async with anyio.create_task_group() as tg:
                    for _ in range(AGENTS):
                        tg.start_soon(agent)
    print(json.dumps({"ok": len(done), "lost": lost, "done": done}), flush=True)


class _nothing:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


# --- the parent ----------------------------------------------------------------------------


async def _fleet_settings(redis_url: str, name: str, model: str, mode: str) -> None:
    if mode == "alone":
        return
    async with (
        redis.asyncio.Redis.from_url(redis_url) as store,
        RedisFleet(store, create_agent_coordinator(1), name=name) as fleet,
    ):
        t = ModelTuple("bench", model)
        await fleet.set_tuple_limit(t, FLEET_LIMIT)
        if mode == "fleet":
            await fleet.set_budget(
                t,
                requests_per_minute=PER_MINUTE["requests"],
                tokens_per_minute=PER_MINUTE["tokens"],
            )


async def _run_one(
    provider: FakeProvider,
    url: str,
    redis_url: str,
    mode: str,
    processes: int,
    seconds: float,
    *,
    late: float | None = None,
) -> tuple[Result, list[dict[str, Any]], float]:
    model = f"fleet-{mode}-{processes}-{late}"
    name = model
    provider.limit(model, Quota(PER_MINUTE["requests"], PER_MINUTE["tokens"], window=WINDOW))
    await _fleet_settings(redis_url, name, model, mode)
    argvs = [
        ("-m", __name__, "worker", url, redis_url, mode, name, model, str(seconds), str(seed))
        for seed in range(processes)
    ]
    async with running(*argvs) as children:
        for child in children:
            assert (await child.read())["ready"]
        start = time.monotonic()
        for i, child in enumerate(children):
            if late is not None and i == len(children) - 1:
                await anyio.sleep(late)
            child.send("go")
        reports = [await child.read() for child in children]
    seen = [s for s in provider.seen(model) if start <= s.at <= start + seconds + (late or 0)]
    capacity = PER_MINUTE["tokens"] * WINDOW / 60
    result = Result(
        mode=mode,
        processes=processes,
        calls=len(seen),
        refused=sum(s.status == 429 for s in seen),
        served_tokens=sum(s.input_tokens + s.output_tokens for s in seen if s.status == 200),
        allowed_tokens=capacity + PER_MINUTE["tokens"] / 60 * (seconds + (late or 0)),
        lost=sum(r["lost"] for r in reports),
        peak=_peak(seen),
        jain=_jain([r["ok"] for r in reports]),
    )
    return result, reports, start


def _peak(seen: Sequence[Seen]) -> int:
    """The most calls the provider worked on at once: overlaps of [arrival, arrival +
    latency) of the calls it served. (Its own counter also counts the instant between
    sending an answer and its handler's end, while the caller has already moved on.)"""
    edges = sorted(
        [(s.at, 1) for s in seen if s.status == 200]
        + [(s.at + LATENCY, -1) for s in seen if s.status == 200]
    )
    peak = current = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        current += step
        peak = max(peak, current)
    return peak


def _late_share(reports: list[dict[str, Any]], start: float, late: float) -> float:
    """Seconds after its start until the late process's share of the calls over 2 s is
    within 30% of its demand share (inf if never)."""
    demand = 1 / len(reports)
    joined = start + late
    mine = reports[-1]["done"]
    everyone = sorted(t for r in reports for t in r["done"])
    t = joined
    while t < everyone[-1] if everyone else False:
        window = [x for x in everyone if t <= x < t + 2.0]
        own = [x for x in mine if t <= x < t + 2.0]
        if window and len(own) / len(window) >= 0.7 * demand:
            return t - joined
        t += 0.25
    return float("inf")


async def _killed_units(redis_url: str) -> float:
    """Seconds from a member's SIGKILL until its units are admitted elsewhere."""
    name = "fleet-killed"
    t = ModelTuple("bench", "killed")
    async with (
        redis.asyncio.Redis.from_url(redis_url) as store,
        RedisFleet(store, create_agent_coordinator(4), name=name, ttl=TTL) as fleet,
    ):
        await fleet.set_tuple_limit(t, 2)
        argv = ("-m", __name__, "hold", redis_url, name)
        async with running(argv) as [child]:
            assert (await child.read())["held"] == 2
            child.signal(signal.SIGKILL)
            killed = time.monotonic()
            async with anyio.create_task_group() as tg:  # two requests: two units
                for _ in range(2):
                    tg.start_soon(_one_request, fleet, t)
            return time.monotonic() - killed
    raise AssertionError("unreachable")  # pragma: no cover


async def _one_request(fleet: RedisFleet, t: ModelTuple) -> None:
    async with fleet.coordinator.request(t):
        pass


async def _hold(args: argparse.Namespace) -> None:
    coordinator = create_agent_coordinator(4)
    async with (
        redis.asyncio.Redis.from_url(args.redis) as store,
        RedisFleet(store, coordinator, name=args.fleet, ttl=TTL),
    ):
        t = ModelTuple("bench", "killed")
        held = 0

        async def hold() -> None:
            nonlocal held
            async with coordinator.request(t):
                held += 1
                if held == 2:
                    print('{"held": 2}', flush=True)
                await anyio.sleep(3600)

        async with anyio.create_task_group() as tg:  # two tasks: two units
            tg.start_soon(hold)
            tg.start_soon(hold)


async def _overhead(redis_url: str, rounds: int) -> tuple[float, float, float]:
    """p50 and p99 of entering and leaving a fleet-admitted request when nothing waits, and
    the p50 of the same without a fleet (seconds)."""
    t = ModelTuple("bench", "overhead")

    async def timings(coordinator: Any) -> list[float]:
        samples = []
        for _ in range(rounds):
            began = time.perf_counter()
            async with coordinator.request(t, tokens=100):
                pass
            samples.append(time.perf_counter() - began)
        return samples

    plain = await timings(create_agent_coordinator(4))
    coordinator = create_agent_coordinator(4)
    async with (
        redis.asyncio.Redis.from_url(redis_url) as store,
        RedisFleet(store, coordinator, name="fleet-overhead") as fleet,
    ):
        await fleet.set_budget(t, requests_per_minute=1e9, tokens_per_minute=1e12)
        await fleet.set_tuple_limit(t, 1000)
        await timings(coordinator)  # warm up: connections, script cache
        samples = sorted(await timings(coordinator))
    return (
        samples[len(samples) // 2],
        samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))],
        statistics.median(plain),
    )


async def measure(quick: bool) -> tuple[list[Result], float, float, tuple[float, float, float]]:
    seconds = 5.0 if quick else SECONDS
    provider = FakeProvider(reply=None, latency=LATENCY)
    results = []
    with ThrowawayServer() as server, serve(provider) as url:
        for processes in (3, 8):
            for mode in CONFIGURATIONS:
                result, _, _ = await _run_one(provider, url, server.url, mode, processes, seconds)
                results.append(result)
        late = 2.0 if quick else 5.0
        _, reports, start = await _run_one(
            provider, url, server.url, "fleet", 3, seconds, late=late
        )
        joined = _late_share(reports, start, late)
        killed = await _killed_units(server.url)
        overhead = await _overhead(server.url, 300 if quick else 3000)
    return results, joined, killed, overhead


def table(results: Sequence[Result]) -> str:
    lines = [
        "| configuration | processes | calls | 429s | goodput | lost | peak in flight | Jain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {CONFIGURATIONS[r.mode]} | {r.processes} | {r.calls} | {r.refused_percent:.1f}% "
            f"| {r.goodput_percent:.0f}% | {r.lost} | {r.peak} | {r.jain:.2f} |"
        )
    return "\n".join(lines)


def run(quick: bool) -> list[Figure]:
    results, joined, killed, (p50, p99, plain) = asyncio.run(measure(quick))
    figures: list[Figure] = []
    for r in results:
        fleet = r.mode != "alone"
        name = f"{r.mode}, {r.processes} processes"
        figures += [
            Figure(f"{name}: 429s", r.refused_percent, "%", 0.5 if fleet else None),
            Figure(
                f"{name}: quota unused",
                100.0 - r.goodput_percent,
                "%",
                5.0 if fleet else None,
                note=f"goodput {r.goodput_percent:.1f}%, {r.calls} calls",
            ),
            Figure(f"{name}: calls lost", r.lost, "", 0.0 if fleet else None),
            Figure(
                f"{name}: peak in flight",
                r.peak,
                "",
                FLEET_LIMIT if fleet else None,
                note="at the provider",
            ),
            Figure(f"{name}: 1 - Jain's index", 1 - r.jain, "", 0.05 if fleet else None),
        ]
    figures += [
        Figure("late joiner: time to its share", joined, "s", 8.0, note="within 30%, 2 s window"),
        Figure("killed member: units back after", killed, "s", TTL + 1, note=f"ttl {TTL:g} s"),
        Figure("fleet admission, p50", p50 * 1000, "ms", 1.0, note=f"{plain * 1e6:.0f} us alone"),
        Figure("fleet admission, p99", p99 * 1000, "ms", 5.0),
    ]
    print("\n" + table(results))
    return figures


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="one agent process (started by the benchmark)")
    for field in ("url", "redis", "mode", "fleet", "model"):
        worker.add_argument(field)
    worker.add_argument("seconds", type=float)
    worker.add_argument("seed", type=int)
    hold = sub.add_parser("hold", help="a member holding two units until killed")
    hold.add_argument("redis")
    hold.add_argument("fleet")
    args = parser.parse_args(argv)
    asyncio.run(_worker(args) if args.command == "worker" else _hold(args))
    return 0


if __name__ == "__main__":
    sys.exit(_main())

"""Benchmark section ``provider``: agents under a provider's rate limits, with and without us.

A local fake provider (``lovely_coordinator_limits.testing``) announces 600 requests and
480,000 tokens a minute in its headers and enforces a ten-second bucket of them (100
requests and 80,000 tokens at once, refilled at 10 requests and 8,000 tokens a second), as
providers enforce over windows shorter than a minute. It answers after
:data:`LATENCY` seconds with as many tokens as the request's ``max_tokens`` allows.

Each process runs :data:`AGENTS` agents, each sending one chat completion after another
through the real openai SDK: a prompt of 300 to 1,500 tokens (by characters) and
``max_tokens=200``. Three configurations, each for :data:`SECONDS` seconds with one
process and with three processes sharing the quota (no shared store between them):

- ``sdk``: the SDK alone, with its default retries (2, honouring ``retry-after``);
- ``cap``: through the coordinator's transport with a concurrency cap of
  :data:`CONCURRENCY` and gates closed on 429s, but no budgets, and the SDK's default
  retries;
- ``budget``: the transport as it comes: budgets learned from the headers only (no
  ``set_budget``), 429s retried by the transport, the SDK's retries off
  (``max_retries=0``);
- ``compressed``: the same, with the provider compressing its answers (gzip, as the SDK
  asks and providers do; the rows above answer uncompressed): goodput must not drop;
- ``sync``: the same through ``CoordinatedSyncTransport``, the sync openai client called
  from :data:`THREADS` threads per process instead of async agents (compressed answers).

Then the shares of processes that share the quota without a fleet (each learns its share
from the headers alone), from the calls each completes: four processes with equal demand
(Jain's fairness index of their calls in the last :data:`SHARE_TAIL` seconds of
:data:`SHARE_SECONDS`), and a process joining a busy one :data:`JOIN_AFTER` seconds in
(its share of the calls in the two seconds before it has run for ten).

Measured at the provider: the share of HTTP calls refused with a 429, and the *goodput*:
the tokens it served (usage of the completed calls) over the tokens its quota allowed in
the run (the bucket's capacity plus its refill). Measured by the agents: calls *lost*
(that ended in an error after every retry). A call cut short by the end of the run is not
lost. Each run is also drawn over time (429s and tokens served per second) into a PNG
when matplotlib is installed (``pip install 'lovely-coordinator[bench]'``).

Run as ``python -m lovely_coordinator_dev.bench.provider worker ...`` it is one process.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import openai
from lovely_coordinator_httpx import CoordinatedSyncTransport, CoordinatedTransport
from lovely_coordinator_limits.testing import FakeProvider, Quota, Seen, serve

from lovely_coordinator._agents.coordinator import create_agent_coordinator

from ..testing.child import running
from . import Figure

__all__ = ["CONFIGURATIONS", "Result", "run"]

SECONDS = 20.0
AGENTS = 32
CONCURRENCY = 8
LATENCY = 0.5
PER_MINUTE = {"requests": 600, "tokens": 480_000}
WINDOW = 10.0
CONFIGURATIONS = {
    "sdk": "SDK alone (default retries)",
    "cap": "coordinator, concurrency cap only",
    "budget": "coordinator, budgets from headers",
    "compressed": "coordinator, budgets, gzip answers",
    "sync": "coordinator, budgets, sync client in threads",
}
COMPRESSED = frozenset({"compressed", "sync"})  # the provider compresses for these rows
THREADS = 8
SHARE_SECONDS = 25.0
SHARE_TAIL = 5.0
JOIN_AFTER = 10.0
TARGETS = {1: (1.0, 90.0), 3: (5.0, 85.0)}  # processes: (most % 429s, least % goodput)
PLOT = Path("bench-provider.png")

_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "while", "agents")


@dataclass(frozen=True, slots=True)
class Result:
    """One configuration's run: what the provider saw and what the agents lost."""

    mode: str
    processes: int
    seconds: float
    calls: int  # HTTP calls the provider received in the run
    refused: int  # of which 429s
    served_tokens: int
    allowed_tokens: float
    lost: int
    timeline: list[tuple[int, int, int]]  # (second, 429s, tokens served)
    done: list[list[float]]  # per process: when each of its calls completed (monotonic)

    @property
    def refused_percent(self) -> float:
        return 100.0 * self.refused / self.calls if self.calls else 0.0

    @property
    def goodput_percent(self) -> float:
        return 100.0 * self.served_tokens / self.allowed_tokens


def _prompt(rng: random.Random) -> str:
    size = rng.randint(300, 1500) * 4  # characters: four to a token
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def _client(args: argparse.Namespace) -> openai.AsyncOpenAI:
    base_url = f"{args.url}/v1"
    if args.mode == "sdk":
        return openai.AsyncOpenAI(api_key="bench", base_url=base_url)  # default retries
    coordinator = create_agent_coordinator(CONCURRENCY)
    # "cap": gates and the cap, as before budgets: no learning, the SDK retries 429s.
    options: dict[str, Any] = (
        {"learn_budgets": False, "max_attempts": 1} if args.mode == "cap" else {}
    )
    transport = CoordinatedTransport(coordinator, providers={"127.0.0.1": "bench"}, **options)
    return openai.AsyncOpenAI(
        api_key="bench",
        base_url=base_url,
        http_client=httpx2.AsyncClient(transport=transport, timeout=60.0),
        max_retries=0 if args.mode == "budget" else 2,
    )


async def _worker(args: argparse.Namespace) -> None:
    """One process: report ready, wait for "go", run the agents, report what was lost."""
    rng = random.Random(args.seed)
    outcomes: Counter[str] = Counter()
    done: list[float] = []
    async with _client(args) as client:
        print('{"ready": true}', flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await anyio.sleep(args.delay)

        async def agent() -> None:
            while True:
                try:
                    await client.chat.completions.create(
                        model=args.model,
                        messages=[{"role": "user", "content": _prompt(rng)}],
                        max_tokens=200,
                    )
                    outcomes["ok"] += 1
                    done.append(time.monotonic())
                except openai.APIError as exc:
                    outcomes["lost"] += 1
                    outcomes[type(exc).__name__] += 1

        with anyio.move_on_after(args.seconds - args.delay):
            async with anyio.create_task_group() as tg:
                for _ in range(args.agents):
                    tg.start_soon(agent)
    report = {"ok": outcomes["ok"], "lost": outcomes["lost"], "done": done}
    print(json.dumps(report), flush=True)


def _sync_worker(args: argparse.Namespace) -> None:
    """One process of sync clients: :data:`THREADS` threads calling one after another."""
    coordinator = create_agent_coordinator(CONCURRENCY)
    transport = CoordinatedSyncTransport(coordinator, providers={"127.0.0.1": "bench"})
    http = httpx2.Client(transport=transport, timeout=60.0)
    client = openai.OpenAI(
        api_key="bench", base_url=f"{args.url}/v1", http_client=http, max_retries=0
    )
    outcomes: Counter[str] = Counter()
    done: list[float] = []
    print('{"ready": true}', flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + args.seconds

    def agent(seed: int) -> None:
        rng = random.Random(seed)
        while (left := deadline - time.monotonic()) > 0:
            try:
                # The pool timeout ends a call still waiting for admission at the deadline.
                client.chat.completions.create(
                    model=args.model,
                    messages=[{"role": "user", "content": _prompt(rng)}],
                    max_tokens=200,
                    timeout=httpx2.Timeout(60.0, pool=left),
                )
                outcomes["ok"] += 1
                done.append(time.monotonic())
            except openai.APIError as exc:
                if time.monotonic() < deadline:  # cut short by the end of the run: not lost
                    outcomes["lost"] += 1
                    outcomes[type(exc).__name__] += 1

    with client, ThreadPoolExecutor(THREADS) as pool:
        for future in [pool.submit(agent, args.seed * 100 + i) for i in range(THREADS)]:
            future.result()
    report = {"ok": outcomes["ok"], "lost": outcomes["lost"], "done": done}
    print(json.dumps(report), flush=True)


async def _run_one(
    provider: FakeProvider,
    url: str,
    mode: str,
    processes: int,
    seconds: float,
    agents: int,
    delays: Sequence[float] = (),
    name: str = "",
) -> Result:
    model = f"bench-{name or mode}-{processes}"
    args = [
        (
            "-m",
            __name__,
            "worker",
            url,
            mode,
            model,
            str(seconds),
            str(agents),
            str(seed),
            str(delays[seed] if seed < len(delays) else 0.0),
        )
        for seed in range(processes)
    ]
    provider.compress = mode in COMPRESSED
    provider.limit(
        model,
        Quota(PER_MINUTE["requests"], PER_MINUTE["tokens"], window=WINDOW),
    )
    async with running(*args) as children:
        for child in children:
            assert (await child.read())["ready"]
        start = time.monotonic()
        for child in children:
            child.send("go")
        reports = [await child.read() for child in children]
    seen = [s for s in provider.seen(model) if start <= s.at <= start + seconds]
    capacity = PER_MINUTE["tokens"] * WINDOW / 60
    return Result(
        mode=mode,
        processes=processes,
        seconds=seconds,
        calls=len(seen),
        refused=sum(s.status == 429 for s in seen),
        served_tokens=sum(s.input_tokens + s.output_tokens for s in seen if s.status == 200),
        allowed_tokens=capacity + PER_MINUTE["tokens"] / 60 * seconds,
        lost=sum(r["lost"] for r in reports),
        timeline=_timeline(seen, start, seconds),
        done=[[t - start for t in r["done"]] for r in reports],
    )


def _timeline(seen: Sequence[Seen], start: float, seconds: float) -> list[tuple[int, int, int]]:
    refused: Counter[int] = Counter()
    served: Counter[int] = Counter()
    for s in seen:
        second = int(s.at - start)
        if s.status == 429:
            refused[second] += 1
        elif s.status == 200:
            served[second] += s.input_tokens + s.output_tokens
    return [(t, refused[t], served[t]) for t in range(int(seconds))]


async def measure(
    quick: bool, modes: Sequence[str] = tuple(CONFIGURATIONS)
) -> tuple[list[Result], list[Result], float]:
    """Run every configuration with one and with three processes, then the shares."""
    seconds, agents = (4.0, 8) if quick else (SECONDS, AGENTS)
    provider = FakeProvider(reply=None, latency=LATENCY)
    results = []
    with serve(provider) as url:
        for processes in (1, 3):
            for mode in modes:
                results.append(await _run_one(provider, url, mode, processes, seconds, agents))
        scale = 0.4 if quick else 1.0
        shares = [
            await _run_one(
                provider, url, "compressed", 4, SHARE_SECONDS * scale, agents, (), "equal"
            ),
            await _run_one(
                provider,
                url,
                "compressed",
                2,
                (JOIN_AFTER + 10.0) * scale,
                agents,
                (0.0, JOIN_AFTER * scale),
                "join",
            ),
        ]
    return results, shares, JOIN_AFTER * scale


def _calls_between(done: Sequence[float], start: float, end: float) -> int:
    return sum(start <= t < end for t in done)


def share_figures(equal: Result, join: Result, joined_at: float) -> list[Figure]:
    """Jain's index of four equal processes' calls at the end, and the joiner's share."""
    end = equal.seconds
    tail = min(SHARE_TAIL, end / 5)
    calls = [_calls_between(d, end - tail, end) for d in equal.done]
    jain = sum(calls) ** 2 / (len(calls) * sum(c * c for c in calls)) if any(calls) else 0.0
    total = sum(calls) or 1
    first, joiner = (_calls_between(d, join.seconds - 2.0, join.seconds) for d in join.done)
    series = []
    for second in range(int(joined_at), int(join.seconds), 2):
        a, b = (_calls_between(d, second, second + 2) for d in join.done)
        series.append(f"{100 * b / (a + b) if a + b else 0:.0f}%")
    joiner_share = 100.0 * joiner / (first + joiner) if first + joiner else 0.0
    return [
        Figure(
            "4 processes, equal demand: 1 - Jain's index",
            1.0 - jain,
            "",
            0.1,
            note="shares of calls " + "/".join(f"{c / total:.2f}" for c in calls),
        ),
        Figure(
            "a process joining a busy one: the first's share of calls",
            100.0 - joiner_share,
            "%",
            70.0,
            note="joiner's share per 2 s since it joined: " + " ".join(series),
        ),
    ]


def table(results: Sequence[Result]) -> str:
    """The results as a Markdown table, for the README."""
    lines = [
        "| configuration | processes | HTTP calls | 429s | goodput | calls lost |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {CONFIGURATIONS[r.mode]} | {r.processes} | {r.calls} | "
            f"{r.refused_percent:.1f}% | {r.goodput_percent:.0f}% | {r.lost} |"
        )
    return "\n".join(lines)


def plot(results: Sequence[Result], path: Path) -> bool:
    """Draw 429s and goodput over time into ``path``; ``False`` without matplotlib."""
    try:
        # By name: matplotlib is an optional extra (``bench``).
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return False
    figure, axes = plt.subplots(2, 2, figsize=(11, 6), sharex=True)
    rate = PER_MINUTE["tokens"] / 60
    for column, processes in enumerate((1, 3)):
        for r in (r for r in results if r.processes == processes):
            seconds = [t for t, _, _ in r.timeline]
            axes[0][column].plot(
                seconds, [x for _, x, _ in r.timeline], label=CONFIGURATIONS[r.mode]
            )
            goodput = [100 * served / rate for _, _, served in r.timeline]
            axes[1][column].plot(seconds, goodput, label=CONFIGURATIONS[r.mode])
        axes[0][column].set_title(f"{processes} process{'es' if processes > 1 else ''}")
        axes[0][column].set_ylabel("429s per second")
        axes[0][column].set_yscale("symlog", linthresh=1)
        axes[1][column].set_ylabel("tokens served, % of refill")
        axes[1][column].set_xlabel("second of the run")
    axes[0][0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def run(quick: bool) -> list[Figure]:
    results, shares, joined_at = asyncio.run(measure(quick))
    figures: list[Figure] = []
    for r in results:
        most_refused, least_goodput = TARGETS[r.processes]
        full = r.mode in ("budget", "compressed", "sync")
        name = f"{r.mode}, {r.processes} process{'es' if r.processes > 1 else ''}"
        figures += [
            Figure(f"{name}: 429s", r.refused_percent, "%", most_refused if full else None),
            Figure(
                f"{name}: quota unused",
                100.0 - r.goodput_percent,
                "%",
                100.0 - least_goodput if full else None,
                note=f"goodput {r.goodput_percent:.1f}%, {r.calls} calls",
            ),
            Figure(f"{name}: calls lost", r.lost, "", 0.0 if full else None),
        ]
    figures += share_figures(shares[0], shares[1], joined_at)
    print("\n" + table(results))
    if plot(results, PLOT):
        print(f"\nplot written to {PLOT}")
    return figures


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="one agent process (started by the benchmark)")
    worker.add_argument("url")
    worker.add_argument("mode", choices=sorted(CONFIGURATIONS))
    worker.add_argument("model")
    worker.add_argument("seconds", type=float)
    worker.add_argument("agents", type=int)
    worker.add_argument("seed", type=int)
    worker.add_argument("delay", type=float, nargs="?", default=0.0)
    args = parser.parse_args(argv)
    if args.mode == "sync":
        _sync_worker(args)
    else:
        asyncio.run(_worker(args))
    return 0


if __name__ == "__main__":
    sys.exit(_main())

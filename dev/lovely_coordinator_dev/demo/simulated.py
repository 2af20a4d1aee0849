"""``python -m lovely_coordinator demo``: a small simulated agent fleet, no network.

Three parent agents, one per model tuple, each run a model turn, hand work to two children
and wait for them, then run a closing turn. The coordinator allows three model calls at
once, so the three parents alone fill it: without *permit lending* their children could
never start. The Anthropic "provider" answers the first call with a 429 and a
Retry-After; the caller closes that tuple's gate until then and queues again, and work
for the other two tuples keeps flowing meanwhile.

Everything printed is measured while the fleet runs: the order of grants, how long each
run waited, the peak number of model calls in flight, and the gate's state as published
by ``subscribe``. It uses the public API only.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import anyio

from lovely_coordinator import (
    AgentCoordinator,
    CoordinatorStatistics,
    ModelTuple,
    create_agent_coordinator,
    current_permit,
)
from lovely_coordinator._cli.top import NEEDS_RICH, watch

__all__ = ["Event", "Report", "format_report", "main", "simulate"]

T = TypeVar("T")

GPT = ModelTuple("openai", "gpt-4o")
CLAUDE = ModelTuple("anthropic", "claude-sonnet-4")
GEMINI = ModelTuple("google", "gemini-2.5-pro")
MAX_CONCURRENCY = 3

# Durations in seconds at scale 1 (the default run takes about three seconds).
PARENT_TURN = 0.4
CHILD_TURN = 0.5
RETRY_AFTER = 1.0

# Each parent's tuple and its children's tuples. The first Anthropic call (the Anthropic
# parent's first turn) gets the 429.
FLEET: tuple[tuple[ModelTuple, tuple[ModelTuple, ...]], ...] = (
    (GPT, (CLAUDE, GEMINI)),
    (CLAUDE, (CLAUDE, CLAUDE)),
    (GEMINI, (GPT, GEMINI)),
)

Kind = Literal["queued", "start", "end", "429", "lend", "back", "closed", "reopened"]


@dataclass(frozen=True)
class Event:
    """One thing that happened, at ``time`` seconds (scale 1) after the start."""

    time: float
    kind: Kind
    who: str
    tuple: ModelTuple
    note: str = ""
    order: int | None = None  # the acceptance order of a run that started


@dataclass
class Report:
    """What the fleet did: the events in order, and figures measured during the run."""

    max_concurrency: int
    events: list[Event] = field(default_factory=list)
    peak_in_flight: int = 0  # model calls running at once, counted around each call
    peak_active: int = 0  # the coordinator's active slots, as delivered to subscribe()
    reopens_at: float | None = None  # when the 429'd gate was due to reopen
    elapsed: float = 0.0


class RateLimited(Exception):
    """The fake provider's 429."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"429 Too Many Requests (Retry-After: {retry_after:g})")
        self.retry_after = retry_after


async def simulate(scale: float = 1.0, coordinator: AgentCoordinator | None = None) -> Report:
    """Run the fleet on the current event loop; durations are multiplied by ``scale``.

    ``coordinator``: the one to run it on (a fresh one by default), e.g. one whose
    statistics are being served (``demo --top``).
    """
    coord = create_agent_coordinator(MAX_CONCURRENCY) if coordinator is None else coordinator
    report = Report(MAX_CONCURRENCY)
    start = anyio.current_time()
    in_flight = 0
    claude_calls = 0

    def now() -> float:
        return (anyio.current_time() - start) / scale

    def log(kind: Kind, who: str, t: ModelTuple, note: str = "") -> None:
        report.events.append(Event(now(), kind, who, t, note))

    def log_start(who: str, t: ModelTuple) -> None:
        permit = current_permit()
        assert permit is not None
        order = permit.acceptance_order
        report.events.append(Event(now(), "start", who, t, f"acceptance order {order}", order))

    gate_open = {t: True for t, _ in FLEET}

    def on_update(statistics: CoordinatorStatistics) -> None:
        # Deliveries are coalesced, so this sees states, not every step between them.
        report.peak_active = max(report.peak_active, statistics.active)
        for t in gate_open:
            is_open = next((s.open for s in statistics.tuples if s.tuple == t), True)
            if is_open != gate_open[t]:
                gate_open[t] = is_open
                log("reopened" if is_open else "closed", "gate", t)

    async def model_call(who: str, t: ModelTuple, seconds: float) -> None:
        """A call to the fake provider, made while holding a permit on ``t``."""
        nonlocal in_flight, claude_calls
        in_flight += 1
        report.peak_in_flight = max(report.peak_in_flight, in_flight)
        try:
            if t == CLAUDE:
                claude_calls += 1
                if claude_calls == 1:
                    await anyio.sleep(seconds * scale / 4)
                    limited = RateLimited(RETRY_AFTER)
                    log("429", who, t, str(limited))
                    # Close the gate while still holding the permit, so the slot this
                    # run gives back cannot go to another call on the limited model.
                    coord.close_tuple(t, reopen_after=limited.retry_after * scale)
                    reopens_at = coord.tuple_reopens_at(t)
                    assert reopens_at is not None
                    report.reopens_at = (reopens_at - start) / scale
                    raise limited
            await anyio.sleep(seconds * scale)
        finally:
            in_flight -= 1

    async def run_on(who: str, t: ModelTuple, work: Callable[[], Awaitable[T]]) -> T:
        """``coord.run`` with the demo's bookkeeping; after a 429, queue again."""
        while True:
            log("queued", who, t)
            try:
                return await coord.run(t, work)
            except RateLimited:
                pass

    async def child(who: str, t: ModelTuple) -> None:
        async def work() -> None:
            log_start(who, t)
            await model_call(who, t, CHILD_TURN)
            log("end", who, t)

        await run_on(who, t, work)

    async def parent(index: int, t: ModelTuple, children: tuple[ModelTuple, ...]) -> None:
        who = f"parent-{index}"

        async def work() -> None:
            log_start(who, t)
            await model_call(who, t, PARENT_TURN)

            async def wait_for_children() -> None:
                async with anyio.create_task_group() as tg:
                    for number, child_tuple in enumerate(children, 1):
                        tg.start_soon(child, f"child-{index}.{number}", child_tuple)

            log("lend", who, t, f"gives its slot back while {len(children)} children run")
            await coord.with_lent_permit(wait_for_children)
            log("back", who, t, "has a slot again")
            await model_call(who, t, PARENT_TURN / 2)
            log("end", who, t)

        await run_on(who, t, work)

    unsubscribe = coord.subscribe(on_update)
    try:
        async with anyio.create_task_group() as tg:
            for index, (t, children) in enumerate(FLEET, 1):
                tg.start_soon(parent, index, t, children)
    finally:
        unsubscribe()
    report.elapsed = now()
    return report


def format_report(report: Report) -> str:
    """What the demo prints: the events, then a summary."""
    lines = [
        f"A simulated fleet: {len(FLEET)} parents, "
        f"{sum(len(c) for _, c in FLEET)} children, {len(FLEET)} model tuples, "
        f"max_concurrency={report.max_concurrency}.",
        "",
    ]
    for e in report.events:
        if e.kind == "queued":
            continue  # shown as waits below
        lines.append(f"{e.time:6.2f}s  {e.who:<10} {e.kind:<9} {e.tuple!s:<26} {e.note}".rstrip())

    queued: dict[str, float] = {}
    waits: list[tuple[float, str]] = []
    started: list[str] = []
    for e in report.events:
        if e.kind == "queued":
            queued[e.who] = e.time
        elif e.kind == "start":
            started.append(f"{e.who} (#{e.order})")
            waits.append((e.time - queued.pop(e.who), e.who))
    longest, who = max(waits)
    lines += [
        "",
        "Summary",
        textwrap.fill(
            ", ".join(started),
            width=100,
            initial_indent="  runs started:      ",
            subsequent_indent=" " * 21,
        ),
        f"  waits:             longest {longest:.2f}s ({who}), "
        f"mean {sum(w for w, _ in waits) / len(waits):.2f}s",
        f"  peak concurrency:  {report.peak_in_flight} model calls in flight "
        f"(cap {report.max_concurrency}); peak active slots published: {report.peak_active}",
    ]
    if report.reopens_at is not None:
        lines.append(
            f"  rate limit:        {CLAUDE} closed until {report.reopens_at:.2f}s; "
            "the other tuples kept running"
        )
    lines.append(f"  finished in {report.elapsed:.2f}s (simulated seconds)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the demo and print what happened. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m lovely_coordinator demo")
    parser.add_argument(
        "--scale",
        type=float,
        default=None,
        help="multiply every simulated duration by this (default 1: about three seconds; "
        "3 with --top)",
    )
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument(
        "--top",
        action="store_true",
        help="watch the fleet live (python -m lovely_coordinator top), slowed down 3x "
        "unless --scale is given; needs lovely-coordinator[top]",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        help="run it across this many processes on a throwaway Valkey (see demo/replicas.py)",
    )
    args = parser.parse_args(argv)
    scale = args.scale if args.scale is not None else 3.0 if args.top else 1.0
    if not scale > 0:
        parser.error("--scale must be positive")
    if args.replicas is not None:
        if not 2 <= args.replicas <= 8:
            parser.error("--replicas must be from 2 to 8")
        if args.top:
            parser.error("--top watches one process: it does not combine with --replicas")
        from .replicas import main as across_replicas

        return across_replicas(args.replicas, scale)
    if args.top:
        return demo_top(scale, args.backend)
    report = anyio.run(simulate, scale, backend=args.backend)
    print(format_report(report))
    return 0


def demo_top(scale: float, backend: str) -> int:
    """``demo --top``: the demo's fleet, served and watched live; the report at the end."""
    try:
        import rich  # noqa: F401
    except ImportError:
        print(NEEDS_RICH, file=sys.stderr)
        return 2
    from anyio.from_thread import start_blocking_portal

    coordinator = create_agent_coordinator(MAX_CONCURRENCY)
    with start_blocking_portal(backend) as portal:
        with portal.wrap_async_context_manager(coordinator.serve_statistics()) as (host, port):
            run = portal.start_task_soon(simulate, scale, coordinator)
            finished_at: list[float] = []

            def done() -> bool:
                # Keep the last screen up for a moment after the fleet finished.
                if run.done() and not finished_at:
                    finished_at.append(time.monotonic())
                return bool(finished_at) and time.monotonic() - finished_at[0] > 1.5

            watch(f"http://{host}:{port}", interval=0.25, done=done)
            if not run.done():
                run.cancel()  # left early: stop the fleet
                return 0
        print(format_report(run.result()))
    return 0

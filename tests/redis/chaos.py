"""Chaos runs: replica processes, real servers, faults, and an oracle that would notice.

A run starts three throwaway servers: the *lock* server, which holds leases, permits and
gates and is killed and restarted without persistence, its *standby* (a replica of it, to
fail over to), and the *store*, which holds the fenced counter log and stays up (the store
that receives the writes). It starts replica
processes (``chaos_replica.py``), each talking to the lock server through its own
fault proxy (``lovely_coordinator_dev.testing.faults``), asks one of them to close a gate for
longer than the run, and injects faults one after another, at seeded random times:

=================  =========================================================================
``stall``          SIGSTOP a replica right after a turn of it has *read* (its model call is
                   pending), until another replica has taken over and read too, then
                   SIGCONT: the old holder writes while the new one waits on its model
``stop``           SIGSTOP a replica at a random moment, past the ttl
``kill``           SIGKILL a replica and start a new one
``restart``        SIGKILL the lock server and start it again, empty
``flush``          ``FLUSHALL`` on the lock server (its boot was vouched for as fresh)
``snapshot``       snapshot the lock server, let work go on, then SIGKILL it and start it
                   from that snapshot: the grants made since are forgotten
``failover``       SIGKILL the lock server and promote its standby (the replicas' proxies
                   now lead there); the old server comes back empty as the new standby
``delay``          the replies to one replica arrive later than the ttl, for a while
``cut``            the replies to one replica are lost, for a while
``drop``           nothing reaches one replica or the server from it, for a while
``partition``      one replica's connections are reset and refused, for a while
=================  =========================================================================

With ``cluster=True`` the lock server is a 3-node Redis Cluster instead
(``lovely_coordinator_dev.testing.redis_cluster``), which the replicas reach directly (a
cluster client follows the nodes' own addresses, so there are no proxies and no standby):
the faults are then those of :data:`CLUSTER_FAULTS`, where ``restart`` and ``flush`` hit
one node at random (its slots lose their state; the others' keep theirs).

The oracle (:func:`check`) then reads what the replicas reported and what the store holds:

* **lost updates**: every turn appends (entries it read) + 1, so the log must read
  1, 2, 3, ...; a repeated value is an update that was lost;
* **superseded writes accepted**: a turn that read under fence ``f`` and saw ``n`` entries
  raised the mark to ``f``, so every entry from index ``n`` on must carry a fence >= ``f``;
* **pool holders**: at no instant more than ``limit`` holds whose permit could still be
  shown held (a stalled holder past its deadline is not counted: that is what fencing is
  for);
* **shortened closures**: no replica that knew the closure ever sees the gate open before
  its reopen time; one started after a server restart must see it closed within 5 s;
* **fleet in flight**: at no instant more than ``limit`` fleet calls whose units could
  still be shown held (as for the pool);
* **fleet budget**: the tokens admitted in any window of the server's clock never exceed
  what the bucket allowed: its capacity (the per-minute amount) plus its refill over the
  window (every call is charged the same and settles at its charge, so nothing is refunded).

Nothing here changes what it checks: the store is only read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import redis.asyncio
from lovely_coordinator_dev.testing.child import Child
from lovely_coordinator_dev.testing.faults import FaultProxy
from lovely_coordinator_dev.testing.redis_cluster import ThrowawayCluster
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator.redis import FencedLog

__all__ = [
    "CLUSTER_FAULTS",
    "FAULTS",
    "ChaosConfig",
    "ChaosReport",
    "Findings",
    "GateView",
    "Observations",
    "check",
    "format_table",
    "run_chaos",
]

REPLICA = str(Path(__file__).with_name("chaos_replica.py"))
FAULTS = (
    "stall", "stop", "kill", "restart", "flush", "snapshot", "failover", "delay", "cut", "drop",
    "partition",
)  # fmt: skip
CLUSTER_FAULTS = ("stall", "stop", "kill", "restart", "flush")
RESTORE_BOUND = 5.0  # seconds within which a restart's closures are known again (§4, §6)
PROPAGATION = 1.0  # seconds within which a replica up at the closure learns of it


@dataclasses.dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    duration: float = 30.0  # seconds of faults
    replicas: int = 3
    ttl: float = 0.6
    limit: int = 2
    faults: Sequence[str] = FAULTS
    unfenced: bool = False  # plain reads: the oracle must then see lost updates
    tokens_per_minute: float = 6000.0  # the fleet's budget (each call charges 50)
    gap: tuple[float, float] = (0.6, 1.6)  # seconds between the end of a fault and the next
    cluster: bool = False  # the lock server is a 3-node cluster (faults: CLUSTER_FAULTS)


@dataclasses.dataclass
class GateView:
    """What one replica process saw of the gate: each change of its state, with the time."""

    started: float
    changes: list[tuple[float, bool]] = dataclasses.field(default_factory=list)
    ended: float | None = None  # when the process was gone (None: alive at the end)

    def intervals(self, until: float) -> list[tuple[float, float, bool]]:
        """``(from, to, open)``: the state between changes, the last one until the end."""
        ends = [time for time, _ in self.changes[1:]]
        ends.append(self.ended if self.ended is not None else until)
        return [(a, b, is_open) for (a, is_open), b in zip(self.changes, ends, strict=True)]


@dataclasses.dataclass
class Observations:
    """Everything the replicas reported, merged."""

    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    holds: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)
    gates: list[GateView] = dataclasses.field(default_factory=list)  # one per replica process
    closed: tuple[float, float] | None = None  # (time, seconds)
    restarts: list[float] = dataclasses.field(default_factory=list)
    faults: Counter[str] = dataclasses.field(default_factory=Counter)
    units: list[tuple[float, float, int, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Findings:
    """What the oracle found (every count must be 0 but the totals)."""

    entries: int
    lost_updates: int
    superseded_accepted: int
    max_pool_holders: int
    pool_over_limit: int
    shortened_closures: int
    unrestored_closures: int
    max_fleet_in_flight: int = 0
    fleet_over_limit: int = 0
    fleet_over_budget: int = 0


@dataclasses.dataclass(frozen=True)
class ChaosReport:
    config: ChaosConfig
    findings: Findings
    outcomes: Counter[str]
    holds: int
    faults: Counter[str]
    seconds: float
    gate_samples: int = 0  # changes of the gate's state seen, after the closure
    units: int = 0  # fleet calls made

    @property
    def clean(self) -> bool:
        f = self.findings
        return not (
            f.lost_updates
            or f.superseded_accepted
            or f.pool_over_limit
            or f.shortened_closures
            or f.unrestored_closures
            or f.fleet_over_limit
            or f.fleet_over_budget
        )


# --- the oracle ---------------------------------------------------------------------------


def _overlaps(intervals: Sequence[tuple[float, float]], limit: int) -> tuple[int, int]:
    """The most intervals open at once, and how many times more than ``limit`` were."""
    events = sorted(
        [(start, 1) for start, end in intervals if end > start]
        + [(end, -1) for start, end in intervals if end > start]
    )  # at equal times ends (-1) sort first: a hand-off is not an overlap
    current = peak = over = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
        over += step > 0 and current > limit
    return peak, over


def over_budget(admissions: Sequence[tuple[int, int]], per_minute: float) -> int:
    """Windows of admissions ``(server ms, tokens)`` that took more than a token bucket of
    ``per_minute`` (capacity ``per_minute``, refilled at ``per_minute / 60`` a second)
    allowed: for each admission, whether some window ending with it exceeds the bound."""
    rate = per_minute / 60_000  # tokens a millisecond
    over = 0
    best = -float("inf")  # max over window starts i of (rate * t_i - tokens before i)
    taken = 0.0
    for at, tokens in sorted(admissions):
        best = max(best, rate * at - taken)
        taken += tokens
        # tokens in [i, now] = taken - before_i; allowed = capacity + rate * (now - t_i)
        if taken - rate * at + best > per_minute + 1e-6:
            over += 1
    return over


def check(
    entries: Sequence[tuple[int, str]],
    seen: Observations,
    limit: int,
    until: float,
    tokens_per_minute: float | None = None,
) -> Findings:
    """The oracle over the store's final log and the replicas' reports (a pure function)."""
    values = [int(entry) for _, entry in entries]
    lost = sum(1 for index, value in enumerate(values) if value != index + 1)
    superseded = 0
    for turn in seen.turns:
        if turn.get("seen") is None or turn.get("fence") is None:
            continue
        superseded += sum(1 for fence, _ in entries[turn["seen"] :] if fence < turn["fence"])
    peak, over = _overlaps([(start, end) for start, end, _ in seen.holds], limit)
    fleet_peak, fleet_over = _overlaps([(start, end) for start, end, _, _ in seen.units], limit)
    budget_over = 0
    if tokens_per_minute is not None:
        budget_over = over_budget(
            [(at, tokens) for _, _, at, tokens in seen.units], tokens_per_minute
        )
    shortened = unrestored = 0
    if seen.closed is not None:
        closed_at, seconds = seen.closed
        window_end = min(closed_at + seconds, until) - 0.05
        for view in seen.gates:
            knew = False  # it has seen the closure
            for start, end, is_open in view.intervals(until):
                if start >= window_end or end <= closed_at:
                    continue
                if not is_open:
                    knew = knew or end > closed_at
                    continue
                if knew:
                    shortened += 1  # it knew of the closure, and reopened early
                elif end > _learn_by(view.started, closed_at, seen.restarts, end):
                    unrestored += 1  # it should have learned of the closure by then
    return Findings(
        len(values),
        lost,
        superseded,
        peak,
        over,
        shortened,
        unrestored,
        fleet_peak,
        fleet_over,
        budget_over,
    )


def _learn_by(started: float, closed_at: float, restarts: Sequence[float], time: float) -> float:
    """By when a replica started at ``started`` must know of a closure made at ``closed_at``.

    One that was up learns it from the message (or its next resync); one started later
    reads it when it starts, unless a restart had emptied the server since, and the
    replicas that knew had not yet put it back: they must have, within the bound.
    """
    if started <= closed_at:
        return closed_at + PROPAGATION
    restart = max((r for r in restarts if closed_at < r <= max(started, time)), default=None)
    if restart is None:
        return started + PROPAGATION
    return max(started, restart + RESTORE_BOUND)


# --- the run ------------------------------------------------------------------------------


class _Replica:
    def __init__(self, child: Child, started: float, run: _Run) -> None:
        self.child = child
        self.run = run
        self.view = GateView(started)
        self.reads = 0  # turns of this replica that have read so far
        run.seen.gates.append(self.view)

    async def pump(self, seen: Observations) -> None:
        with contextlib.suppress(EOFError, ValueError):
            while True:
                report = await self.child.read()
                if "turn" in report:
                    seen.turns.append(report["turn"])
                elif "read" in report:
                    self.reads += 1
                    self.run.read_happened.set()
                elif "hold" in report:
                    start, end, fence = report["hold"]
                    seen.holds.append((start, end, fence))
                elif "gate" in report:
                    time, is_open = report["gate"]
                    self.view.changes.append((time, is_open))
                elif "unit" in report:
                    start, end, at, tokens = report["unit"]
                    seen.units.append((start, end, at, tokens))
                elif "closed" in report:
                    time, seconds = report["closed"]
                    seen.closed = (time, seconds)
        self.view.ended = anyio.current_time()


class _Run:
    def __init__(
        self,
        config: ChaosConfig,
        lock: ThrowawayServer,
        standby: ThrowawayServer,
        store: ThrowawayServer,
        stderr: int | IO[Any] | None,
        cluster: ThrowawayCluster | None = None,
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.stderr = stderr
        self.lock = lock
        self.standby = standby
        self.store = store
        self.rng = random.Random(config.seed)
        self.seen = Observations()
        self.proxies: list[FaultProxy] = []
        self.replicas: list[_Replica] = []
        self.read_happened = anyio.Event()
        self.tg: anyio.abc.TaskGroup | None = None

    async def next_read(self, among: Sequence[_Replica], timeout: float) -> _Replica | None:
        """The first of ``among`` to report a read from now on (None after ``timeout``)."""
        before = [replica.reads for replica in among]
        with anyio.move_on_after(timeout):
            while True:
                self.read_happened = anyio.Event()
                for replica, count in zip(among, before, strict=True):
                    if replica.reads > count:
                        return replica
                await self.read_happened.wait()
        return None

    async def start_replica(self, index: int) -> _Replica:
        if self.cluster is not None:
            lock_url = f"redis://{self.cluster.host}:{self.cluster.port}/0"
        else:
            lock_url = self.proxies[index].url
        argv = [REPLICA, lock_url, self.store.url, f"r{index}"]
        argv += [str(self.config.ttl), str(self.config.limit), str(self.config.tokens_per_minute)]
        if self.config.unfenced:
            argv.append("--unfenced")
        if self.cluster is not None:
            argv.append("--cluster")
        child = await Child.start(*argv, stderr=self.stderr)
        assert (await child.read())["ready"]
        replica = _Replica(child, anyio.current_time(), self)
        assert self.tg is not None
        self.tg.start_soon(replica.pump, self.seen)
        return replica

    async def fault(self, kind: str) -> None:
        ttl = self.config.ttl
        index = self.rng.randrange(len(self.replicas))
        replica = self.replicas[index]
        self.seen.faults[kind] += 1
        if self.cluster is not None and kind in ("restart", "flush"):
            node = self.rng.choice(self.cluster.nodes)
            if kind == "restart":
                node.kill()
                await anyio.sleep(self.rng.uniform(0.05, 0.5))
                node.start()  # empty, with its slots (its cluster config file is kept)
            else:
                self.cluster.flush_node(node)
            self.seen.restarts.append(anyio.current_time())
            return
        proxy = self.proxies[index] if self.proxies else None
        if kind == "stall":
            stalled = await self.next_read(self.replicas, 3 * ttl + 2)
            if stalled is None:
                return
            stalled.child.signal(signal.SIGSTOP)  # its model call is pending
            others = [r for r in self.replicas if r is not stalled]
            await self.next_read(others, 3 * ttl + 2)  # another took over and read
            stalled.child.signal(signal.SIGCONT)
        elif kind == "stop":
            replica.child.signal(signal.SIGSTOP)
            await anyio.sleep(ttl * self.rng.uniform(1.2, 3.0))
            replica.child.signal(signal.SIGCONT)
        elif kind == "kill":
            await replica.child.kill()
            await anyio.sleep(0.2)
            self.replicas[index] = await self.start_replica(index)
        elif kind == "restart":
            self.lock.kill()
            await anyio.sleep(self.rng.uniform(0.05, 0.5))
            self.lock.start()
            self.seen.restarts.append(anyio.current_time())
        elif kind == "flush":
            self.lock.command("FLUSHALL")
            self.seen.restarts.append(anyio.current_time())
        elif kind == "snapshot":
            self.lock.save()
            await anyio.sleep(self.rng.uniform(0.3, 1.2))  # grants made now are not in it
            self.lock.kill()
            self.lock.start()
            self.lock.forget_snapshot()  # a later restart is empty again
            self.seen.restarts.append(anyio.current_time())
        elif kind == "failover":
            old, new = self.lock, self.standby
            old.kill()  # what the replication had not sent yet is lost
            new.promote()
            for each in self.proxies:
                each.upstream_port = new.port
                each.partition()  # every connection to the old server is gone
            self.seen.restarts.append(anyio.current_time())
            await anyio.sleep(self.rng.uniform(0.05, 0.3))
            for each in self.proxies:
                each.heal()
            old.start()
            old.replicate(new)
            self.lock, self.standby = new, old
        else:
            assert proxy is not None, f"{kind} needs the replicas' proxies"
            if kind == "delay":
                proxy.delay(ttl * self.rng.uniform(1.2, 2.0))
            elif kind == "cut":
                proxy.cut_replies()
            elif kind == "drop":
                proxy.drop()
            else:
                proxy.partition()
            await anyio.sleep(self.rng.uniform(0.5, 1.5))
            proxy.heal()

    async def chaos(self) -> None:
        stop_at = anyio.current_time() + self.config.duration
        deck: list[str] = []
        while anyio.current_time() < stop_at:
            if not deck:  # every kind once, in a new order, before any comes again
                deck = list(self.config.faults)
                self.rng.shuffle(deck)
            await anyio.sleep(self.rng.uniform(*self.config.gap))
            await self.fault(deck.pop())


@contextlib.asynccontextmanager
async def _servers() -> AsyncIterator[tuple[ThrowawayServer, ThrowawayServer, ThrowawayServer]]:
    with ThrowawayServer() as lock, ThrowawayServer() as standby, ThrowawayServer() as store:
        standby.replicate(lock)
        yield lock, standby, store


@contextlib.asynccontextmanager
async def _cluster(wanted: bool) -> AsyncIterator[ThrowawayCluster | None]:
    if not wanted:
        yield None
        return
    with ThrowawayCluster() as cluster:
        yield cluster


async def run_chaos(config: ChaosConfig, *, stderr: int | IO[Any] | None = None) -> ChaosReport:
    """One chaos run (asyncio only); returns what happened and what the oracle found.

    ``stderr`` receives the replicas' logs (default: this process's stderr).
    """
    began = anyio.current_time()
    async with (
        _servers() as (lock, standby, store),
        _cluster(config.cluster) as cluster,
        anyio.create_task_group() as tg,
    ):
        run = _Run(config, lock, standby, store, stderr, cluster)
        run.tg = tg
        try:
            for _ in range(0 if cluster else config.replicas):
                run.proxies.append(await FaultProxy(lock.port).start())
            for index in range(config.replicas):
                run.replicas.append(await run.start_replica(index))
            run.replicas[0].child.send(f"close {config.duration + 60}")
            await run.chaos()
            await anyio.sleep(2 * config.ttl + 1.5)  # let the last fault's effects settle
            until = anyio.current_time()
        finally:
            with anyio.CancelScope(shield=True):
                for replica in run.replicas:
                    replica.child.signal(signal.SIGCONT)
                    replica.child.send("stop")
                with anyio.move_on_after(5):
                    for replica in run.replicas:
                        await replica.child.wait()
                for replica in run.replicas:
                    await replica.child.kill()
                for proxy in run.proxies:
                    await proxy.close()
        async with redis.asyncio.Redis.from_url(store.url) as client:
            entries = await FencedLog(client, "counter").entries()
    findings = check(entries, run.seen, config.limit, until, config.tokens_per_minute)
    outcomes = Counter(turn["outcome"] for turn in run.seen.turns)
    closed_at = run.seen.closed[0] if run.seen.closed is not None else float("inf")
    samples = sum(1 for view in run.seen.gates for time, _ in view.changes if time >= closed_at)
    return ChaosReport(
        config,
        findings,
        outcomes,
        len(run.seen.holds),
        run.seen.faults,
        anyio.current_time() - began,
        samples,
        len(run.seen.units),
    )


def format_table(reports: Sequence[ChaosReport]) -> str:
    """A summary table, one row per run."""
    header = [
        "seed", "secs", "faults", "turns ok", "turns failed", "writes", "lost upd",
        "superseded", "holds", "max holders", "over limit", "shortened", "unrestored",
        "fleet calls", "fleet max", "fleet over", "over budget",
    ]  # fmt: skip
    rows = [header]
    for r in reports:
        f = r.findings
        failed = sum(r.outcomes.values()) - r.outcomes["ok"]
        cells = [
            r.config.seed, f"{r.seconds:.0f}", sum(r.faults.values()), r.outcomes["ok"], failed,
            f.entries, f.lost_updates, f.superseded_accepted, r.holds,
            f"{f.max_pool_holders}/{r.config.limit}", f.pool_over_limit, f.shortened_closures,
            f.unrestored_closures, r.units, f"{f.max_fleet_in_flight}/{r.config.limit}",
            f.fleet_over_limit, f.fleet_over_budget,
        ]  # fmt: skip
        rows.append([str(cell) for cell in cells])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run scripts/chaos.py")

"""The fault-injection suite: replica processes, real servers, faults, and the oracle.

The oracle is first shown to notice each kind of violation in a history made up for the
purpose; then a chaos run with every kind of fault must keep every promise, and a run
with plain (unfenced) reads must show the lost updates that fenced reads prevent, so the
run is known to produce the situations the oracle checks. Longer runs, by hand:
``python scripts/chaos.py --help``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from .chaos import (
    CLUSTER_FAULTS,
    FAULTS,
    ChaosConfig,
    GateView,
    Observations,
    check,
    format_table,
    run_chaos,
)
from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio


def test_the_oracle_sees_a_lost_update() -> None:
    # Two turns read 1 entry and both wrote "2": one of the updates was lost (the next
    # turn read 3 entries and wrote "4").
    entries = [(10, "1"), (20, "2"), (30, "2"), (40, "4")]
    findings = check(entries, Observations(), limit=1, until=100)
    assert (findings.entries, findings.lost_updates) == (4, 1)


def test_the_oracle_sees_a_write_accepted_after_a_newer_holder_read() -> None:
    seen = Observations(turns=[{"fence": 30, "seen": 2, "index": None, "outcome": "ok"}])
    # Fence 20 wrote at index 2, after fence 30 had read 2 entries (and so claimed the log).
    entries = [(10, "1"), (20, "2"), (20, "3"), (30, "4")]
    assert check(entries, seen, limit=1, until=100).superseded_accepted == 1
    clean = [(10, "1"), (20, "2"), (30, "3")]
    assert check(clean, seen, limit=1, until=100).superseded_accepted == 0


def test_the_oracle_counts_holders_only_while_they_could_be_shown_held() -> None:
    seen = Observations(holds=[(0.0, 1.0, 1), (0.5, 2.0, 2), (1.0, 3.0, 3)])
    findings = check([], seen, limit=2, until=100)
    assert (findings.max_pool_holders, findings.pool_over_limit) == (2, 0)  # 1.0: a hand-off
    seen.holds.append((1.5, 1.6, 4))
    findings = check([], seen, limit=2, until=100)
    assert (findings.max_pool_holders, findings.pool_over_limit) == (3, 1)


def test_the_oracle_sees_a_shortened_closure() -> None:
    seen = Observations(closed=(10.0, 100.0), restarts=[10.5])
    # A replica that knew the closure saw the gate open at 10.6, after a restart.
    seen.gates.append(GateView(0.0, [(1.0, True), (10.2, False), (10.6, True)]))
    assert check([], seen, limit=1, until=60).shortened_closures == 1
    seen = Observations(closed=(10.0, 100.0))
    seen.gates.append(GateView(0.0, [(1.0, True), (10.2, False)]))  # kept, until the end
    assert check([], seen, limit=1, until=60).shortened_closures == 0


def test_the_oracle_sees_a_closure_not_learned_in_time() -> None:
    # Up at the closure: must learn it within the propagation bound.
    seen = Observations(closed=(10.0, 100.0))
    seen.gates.append(GateView(0.0, [(1.0, True), (10.5, False)]))
    assert check([], seen, limit=1, until=60).unrestored_closures == 0
    seen.gates.append(GateView(0.0, [(1.0, True)]))  # never learned it
    assert check([], seen, limit=1, until=60).unrestored_closures == 1
    # Started after a restart emptied the server: the others must restore it in time.
    seen = Observations(closed=(10.0, 100.0), restarts=[20.0])
    seen.gates.append(GateView(21.0, [(21.5, True), (23.0, False)]))
    assert check([], seen, limit=1, until=60).unrestored_closures == 0
    seen.gates.append(GateView(21.0, [(21.5, True), (26.0, False)]))
    assert check([], seen, limit=1, until=60).unrestored_closures == 1
    # A process that was killed while it did not know yet is judged until it died.
    seen = Observations(closed=(10.0, 100.0))
    seen.gates.append(GateView(0.0, [(1.0, True)], ended=10.5))
    assert check([], seen, limit=1, until=60).unrestored_closures == 0


def test_the_oracle_sees_fleet_calls_over_the_limit_and_the_budget() -> None:
    seen = Observations(units=[(0.0, 1.0, 0, 50), (0.5, 2.0, 10, 50), (1.0, 3.0, 20, 50)])
    findings = check([], seen, limit=2, until=100, tokens_per_minute=6000)
    assert (findings.max_fleet_in_flight, findings.fleet_over_limit) == (2, 0)
    assert findings.fleet_over_budget == 0  # 150 tokens: within the full bucket of 6000
    seen.units.append((1.5, 1.6, 30, 50))
    findings = check([], seen, limit=2, until=100, tokens_per_minute=6000)
    assert (findings.max_fleet_in_flight, findings.fleet_over_limit) == (3, 1)
    # A full bucket (6000), then 100 a second: 130 calls of 50 in the first second is 500
    # too many; the same spread over 6 s is within the bucket.
    burst = [(0.0, 0.0, i, 50) for i in range(130)]
    assert check([], Observations(units=burst), 200, 100, 6000).fleet_over_budget > 0
    spread = [(0.0, 0.0, i * 50, 50) for i in range(130)]
    assert check([], Observations(units=spread), 200, 100, 6000).fleet_over_budget == 0


def test_the_table_has_a_row_per_run() -> None:
    findings = check([(1, "1")], Observations(), limit=2, until=1)
    from .chaos import ChaosReport

    report = ChaosReport(ChaosConfig(seed=7), findings, Counter(ok=1), 3, Counter(kill=2), 9.5)
    table = format_table([report, report]).splitlines()
    assert len(table) == 4
    assert table[0].split()[0] == "seed"
    assert table[2].split()[:3] == ["7", "10", "2"]


async def test_a_chaos_run_keeps_every_promise() -> None:
    report = await run_chaos(ChaosConfig(seed=12, duration=40.0))
    print(format_table([report]))
    assert report.clean, report.findings
    assert set(report.faults) == set(FAULTS)  # every kind of fault happened
    assert report.outcomes["ok"] >= 20  # and work went on between them
    assert report.holds >= 50
    assert report.findings.max_pool_holders == 2  # the cap was reached, never passed
    assert report.findings.entries >= report.outcomes["ok"]
    assert report.gate_samples >= 3  # the replicas saw the gate close
    assert report.units >= 50  # fleet calls went on between the faults
    assert report.findings.max_fleet_in_flight == 2  # the fleet's limit reached, never passed


async def test_a_chaos_run_on_a_cluster_keeps_every_promise() -> None:
    config = ChaosConfig(seed=5, duration=20.0, faults=CLUSTER_FAULTS, cluster=True)
    report = await run_chaos(config)
    print(format_table([report]))
    assert report.clean, report.findings
    assert set(report.faults) == set(CLUSTER_FAULTS)
    assert report.outcomes["ok"] >= 10
    assert report.findings.max_pool_holders == 2
    assert report.units >= 20
    assert report.findings.max_fleet_in_flight == 2


async def test_without_fenced_reads_the_same_faults_lose_updates() -> None:
    # The control experiment: the stalled old holder writes while the new one waits on
    # its model. With plain reads the store cannot know, and updates are lost.
    report = await run_chaos(ChaosConfig(seed=3, duration=6.0, faults=("stall",), unfenced=True))
    print(format_table([report]))
    assert report.findings.lost_updates >= 1
    assert report.findings.superseded_accepted >= 1

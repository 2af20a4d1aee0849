"""The demo: it runs, and what it reports is what a coordinator must guarantee."""

from __future__ import annotations

import anyio
import pytest
from lovely_coordinator_dev.demo.simulated import (
    CLAUDE,
    FLEET,
    MAX_CONCURRENCY,
    Report,
    main,
    simulate,
)
from trio.testing import MockClock

# Deterministic time on trio; a short real-time run on asyncio.
BACKENDS = [
    pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), 1.0, id="trio-mock"),
    pytest.param("asyncio", 0.05, id="asyncio"),
]


def _check(report: Report) -> None:
    events = report.events
    runs = len(FLEET) + sum(len(children) for _, children in FLEET)

    # Every run finished, and at no moment did more than the cap run at once.
    assert sum(e.kind == "end" for e in events) == runs
    assert 1 <= report.peak_in_flight <= MAX_CONCURRENCY
    assert report.peak_active <= MAX_CONCURRENCY

    # The parents alone fill the cap; their children ran only because they lent.
    for index in range(1, len(FLEET) + 1):
        parent = f"parent-{index}"
        lent = next(e.time for e in events if e.who == parent and e.kind == "lend")
        back = next(e.time for e in events if e.who == parent and e.kind == "back")
        children = [e for e in events if e.who.startswith(f"child-{index}.")]
        assert all(lent <= e.time <= back for e in children)
        assert sum(e.kind == "end" for e in children) == len(FLEET[index - 1][1])

    # The 429 closed the limited tuple; nothing started on it until the reopen time,
    # while the other tuples kept starting work; subscribe() saw the gate close and reopen.
    limited_at = next(e.time for e in events if e.kind == "429")
    assert report.reopens_at is not None
    assert report.reopens_at > limited_at
    later = [e for e in events if e.kind == "start" and e.time > limited_at]
    assert [e for e in later if e.tuple == CLAUDE]
    assert all(e.time >= report.reopens_at - 1e-6 for e in later if e.tuple == CLAUDE)
    assert [e for e in later if e.tuple != CLAUDE and e.time < report.reopens_at]
    gate = [e.kind for e in events if e.who == "gate"]
    assert gate == ["closed", "reopened"]

    # Every start carries the acceptance order of its permit, each order used once.
    orders = [e.order for e in events if e.kind == "start"]
    assert len(orders) == runs + 1  # the limited run started twice
    assert len(set(orders)) == len(orders)


@pytest.mark.anyio
@pytest.mark.parametrize(("anyio_backend", "scale"), BACKENDS)
async def test_the_simulated_fleet_keeps_its_promises(scale: float) -> None:
    with anyio.fail_after(30):
        _check(await simulate(scale))


def test_main_prints_the_timeline_and_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scale", "0.02", "--backend", "trio"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("A simulated fleet: 3 parents, 6 children, 3 model tuples")
    assert "429 Too Many Requests (Retry-After: 1)" in out
    assert f"gate       closed    {CLAUDE}" in out
    assert f"gate       reopened  {CLAUDE}" in out
    summary = out[out.index("\nSummary\n") :]
    assert f"model calls in flight (cap {MAX_CONCURRENCY})" in summary
    peak = int(summary.split("peak concurrency:")[1].split()[0])
    assert 1 <= peak <= MAX_CONCURRENCY
    assert "finished in" in summary


def test_main_rejects_a_bad_scale(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--scale", "0"])
    assert exited.value.code == 2
    assert "--scale must be positive" in capsys.readouterr().err

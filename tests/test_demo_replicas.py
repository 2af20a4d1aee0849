"""``python -m lovely_coordinator demo --replicas N``: it runs, and its checks can fail."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lovely_coordinator._demo import main as demo
from lovely_coordinator._demo_replicas import CLAUDE, GPT, RETRY_AFTER, _problems, _Seen


def test_three_replicas_share_the_gate_and_take_turns() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lovely_coordinator", "demo", "--replicas", "3", "--scale", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "3 replica processes on a throwaway" in out
    assert "r1 got a 429" in out
    for replica in ("r0", "r1", "r2"):
        assert f"closed on {replica}'s coordinator" in out
    assert "reopened by itself on every replica" in out
    assert "fences strictly increase from turn to turn" in out
    assert "FAILED" not in out
    table = out.split("one at a time across the processes:")[1].split("Gate ")[0]
    rows = [line.split() for line in table.splitlines()[2:] if line.strip()]
    assert len(rows) == 9
    assert {row[1] for row in rows} == {"r0", "r1", "r2"}  # the turns hopped between processes


@pytest.mark.parametrize("replicas", ["1", "9"])
def test_the_number_of_replicas_is_bounded(replicas: str) -> None:
    with pytest.raises(SystemExit):
        demo(["--replicas", replicas])


def test_the_checks_notice_what_they_check() -> None:
    seen = _Seen(
        turns=[["r0", 5, 0, 1.0, 1.1], ["r1", 4, 1, 2.0, 2.1]],  # a fence went back
        gate=[["r0", True, 0.5]],  # r1 never saw the closure
        calls=[["r1", str(CLAUDE), 0.6], ["r0", str(GPT), 0.6]],  # during the closure
        limited=["r1", 0.5, RETRY_AFTER],
    )
    problems = _problems(seen, ["r0", "r1"], 1.0)
    assert problems == [
        "the fences did not strictly increase from turn to turn",
        "the gate was not seen closed on ['r1']",
        f"1 call(s) started on {CLAUDE} while it was closed",
    ]
    assert "the provider's 429 never happened" in _problems(_Seen(), [], 1.0)

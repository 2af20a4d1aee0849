"""``python -m lovely_coordinator demo --replicas N``: it runs, and its checks can fail."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.demo.replicas import (
    CLAUDE,
    GPT,
    RETRY_AFTER,
    _problems,
    _Seen,
    main,
    replica,
)
from lovely_coordinator_dev.demo.simulated import main as demo
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from ...redis.helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio


def test_three_replica_processes_share_the_gate_and_take_turns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(3, scale=0.5) == 0
    out = capsys.readouterr().out
    assert "3 replica processes on a throwaway" in out
    assert "r1 got a 429" in out
    for name in ("r0", "r1", "r2"):
        assert f"closed on {name}'s coordinator" in out
    assert "reopened by itself on every replica" in out
    assert "fences strictly increase from turn to turn" in out
    assert "FAILED" not in out
    table = out.split("one at a time across the processes:")[1].split("Gate ")[0]
    rows = [line.split() for line in table.splitlines()[2:] if line.strip()]
    assert len(rows) == 9
    assert {row[1] for row in rows} == {"r0", "r1", "r2"}  # the turns hopped between processes


async def test_the_replicas_keep_every_check_in_one_process_too(
    redis_client: Any, redis_server: ThrowawayServer
) -> None:
    # The replica's code itself, as tasks of this process (each its own client and
    # coordinator), so that every line of it is measured.
    with anyio.fail_after(30):
        names = ["r0", "r1", "r2"]
        seen = _Seen()
        go, stop = anyio.Event(), anyio.Event()
        ready: set[str] = set()
        done: set[str] = set()
        orders = {name: [go, stop] for name in names}

        def reporter(name: str) -> Any:
            def report(**observation: Any) -> None:
                if observation.get("ready"):
                    ready.add(name)
                elif observation.get("done"):
                    done.add(name)
                else:
                    seen.record(observation)

            return report

        def orderer(name: str) -> Any:
            async def order() -> None:
                await orders[name].pop(0).wait()

            return order

        async def run(name: str) -> None:
            await replica(redis_server.url, name, 0.3, order=orderer(name), report=reporter(name))

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(run, name)
            while ready != set(names):  # noqa: ASYNC110  (reports are plain callbacks)
                await anyio.sleep(0.01)
            go.set()
            while done != set(names):  # noqa: ASYNC110
                await anyio.sleep(0.01)
            stop.set()
        assert _problems(seen, names, 0.3) == []
        assert len(seen.turns) == 9


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
    seen = _Seen(turns=[["r0", 5, 1, 1.0, 1.1]])  # an index the log cannot have had
    assert "the log does not hold every turn, in turn order" in _problems(seen, [], 1.0)

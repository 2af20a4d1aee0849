"""The demo's fleet part (``demo --replicas N``): one budget shared by the replicas."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.demo.fleet import MODEL, _report, member
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from ...redis.helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio


async def test_members_share_the_budget_in_one_process(
    redis_client: Any, redis_server: ThrowawayServer
) -> None:
    # The replica's code itself, as tasks of this process, so that every line is measured.
    from lovely_coordinator import create_agent_coordinator
    from lovely_coordinator.redis import RedisFleet

    names = ["r0", "r1", "r2"]
    calls: list[tuple[str, float]] = []
    ready: set[str] = set()
    go = anyio.Event()
    with anyio.fail_after(30):
        async with RedisFleet(redis_client, create_agent_coordinator(1), name="demo") as fleet:
            await fleet.set_budget(MODEL, tokens_per_minute=300_000)

            def reporter(name: str) -> Any:
                def report(**observation: Any) -> None:
                    if observation.get("ready"):
                        ready.add(name)
                    elif "call" in observation:
                        calls.append(tuple(observation["call"]))

                return report

            async def run(name: str) -> None:
                await member(redis_server.url, name, 0.1, order=go.wait, report=reporter(name))

            async with anyio.create_task_group() as tg:
                for name in names:
                    tg.start_soon(run, name)
                while len(ready) < 3:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                async with fleet.coordinator.request(MODEL, tokens=300_000):
                    pass
                began = time.monotonic()
                go.set()
    lines, problems = _report(calls, names, began, began, 0.1, 4)
    assert problems == []
    assert {who for who, _ in calls} == set(names)
    assert "together they stayed within the budget" in "\n".join(lines)


def test_the_checks_can_fail() -> None:
    now = time.monotonic()
    too_many = [("r0", now + i * 0.001) for i in range(40)]
    lines, problems = _report(too_many, ["r0", "r1"], now, now, 1.0, 3)
    assert any("the budget allowed" in p for p in problems)
    assert "a replica got no call at all" in problems
    assert any(line.startswith("  FAILED") for line in lines)

"""The README's examples run as written (the Redis one against a throwaway server)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _blocks() -> list[str]:
    return _BLOCK.findall(README.read_text(encoding="utf-8"))


# What each example prints, as its comments say: (a line the block contains, the printed
# lines as patterns). Every runnable example has an entry, so none drifts unnoticed.
_PRINTS: list[tuple[str, list[str]]] = [
    ("permit.acceptance_order", [r"running with order \d+"]),
    ("tokens_available < 30_000", ["True"]),
    ("coord.statistics().lent", ["1", r"\['B called claude', 'A called gpt-4o'\]"]),
    ("lanes.wake(room)", ["started", "coalesced", "started"]),
    (
        'multitask="replace_queued"',
        [
            "0",
            "1",
            r"TurnStatistics\(conversations=1, running=1, waiting=1, draining=False\)",
            "done",
            "done None",
        ],
    ),
    ("serve_statistics", [r"python -m lovely_coordinator top http://127\.0\.0\.1:\d+"]),
]


def _runnable() -> list[Any]:
    params = []
    for i, block in enumerate(_blocks()):
        if "anyio.run(main)" not in block:
            continue
        (prints,) = [lines for marker, lines in _PRINTS if marker in block]
        params.append(pytest.param(block, prints, id=f"example-{i}"))
    return params


def test_readme_has_the_two_setup_commands() -> None:
    commands = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert len(commands) == 2
    assert "lovely_coordinator demo" in commands[0]
    assert "pytest" in commands[1]
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1].strip() in ci, ".ci/run must run the README's test command verbatim"


@pytest.mark.parametrize(("source", "prints"), _runnable())
def test_example_runs(source: str, prints: list[str]) -> None:
    # Each example calls anyio.run itself, so it runs in a fresh interpreter.
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", source],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    assert len(printed) == len(prints), printed
    for line, pattern in zip(printed, prints, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_redis_example_runs() -> None:
    (source,) = [block for block in _blocks() if "RedisLocker" in block]
    namespace: dict[str, Any] = {}
    exec(compile(source, "README.md", "exec"), namespace)

    async def main(url: str) -> None:
        with anyio.fail_after(30):
            await namespace["serve"](url)
            client = namespace["redis"].asyncio.Redis.from_url(url)
            try:
                entries = await namespace["FencedLog"](client, "conv-1:messages").entries()
            finally:
                await client.aclose()
        assert len(entries) == 1
        assert entries[0][0] > 0  # written under a real fencing token

    with ThrowawayServer() as server:
        asyncio.run(main(server.url))


def test_fleet_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    (source,) = [block for block in _blocks() if "RedisFleet(" in block]
    namespace: dict[str, Any] = {}
    exec(compile(source, "README.md", "exec"), namespace)

    async def main(url: str) -> None:
        with anyio.fail_after(30):
            await namespace["worker"](url)

    with ThrowawayServer() as server:
        asyncio.run(main(server.url))
    assert capsys.readouterr().out == "0\n"

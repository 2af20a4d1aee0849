"""Helpers shared by the Redis tests (imported, never collected)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis.exceptions
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer, faketime_library

from lovely_coordinator._redis.generation import MARKER_KEY
from lovely_coordinator._redis.keys import object_base

# Options of a client that retries a command once its pooled connection died with the server
# (Redis.from_url() clients do not retry at all by default in redis-py 8).
RECONNECTING: dict[str, Any] = {"retry_on_error": [redis.exceptions.ConnectionError]}


@pytest.fixture
def anyio_backend() -> str:
    """``lovely_coordinator.redis`` is asyncio-only: a Redis test module that imports this
    runs its anyio tests on asyncio alone (conftest's fixture runs them on trio too)."""
    return "asyncio"


@pytest.fixture
def own_server() -> Iterator[ThrowawayServer]:
    """A private server this test may kill, pause or restart."""
    with ThrowawayServer() as server:
        yield server


def lock_keys(conversation_id: str, prefix: str = "lovely:") -> dict[str, str]:
    base = object_base(prefix, "conv", conversation_id)
    keys = {part: f"{base}:{part}" for part in ("lock", "fence", "waiting", "beats", "ticket")}
    return keys | {"marker": MARKER_KEY}


def pool_key(name: str, part: str, prefix: str = "lovely:") -> str:
    return f"{object_base(prefix, 'pool', name)}:{part}"


def pool_keys(name: str, prefix: str = "lovely:") -> list[str]:
    """The KEYS of the pool scripts, without the tombstone."""
    parts = ("holders", "queue", "waiters", "ticket", "fence", "grants")
    return [*(pool_key(name, part, prefix) for part in parts), MARKER_KEY]


async def run_id(client: Any) -> str:
    info = await client.info("server")
    return str(info["run_id"])


async def uptime_at_least(client: Any, seconds: int) -> None:
    """Wait until the server reports at least ``seconds`` of uptime (whole seconds)."""
    while (await client.info("server"))["uptime_in_seconds"] < seconds:  # noqa: ASYNC110
        await anyio.sleep(0.05)  # (server-side state: nothing to wait on locally)


async def server_time_us(client: Any) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1_000_000 + int(micros)


def require_faketime() -> None:
    """Skip a test that sets a server's clock when faketime is missing; never under CI."""
    if faketime_library() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("faketime is not installed (CI installs Debian's package faketime)")
        pytest.skip("needs faketime (Debian's package faketime) to set a server's clock off")

"""Shared test configuration: every async test runs on asyncio and on trio; Redis fixtures."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


# --- Redis (lovely_coordinator.redis, asyncio-only) ---------------------------------------
# One throwaway server for the whole run (never a mock); tests that kill, pause or restart a
# server start their own. A missing server binary is an error, never a skip. The async
# fixtures are run by anyio's plugin, on the test's own event loop: the Redis modules import
# an asyncio-only ``anyio_backend`` (tests/redis/helpers.py) in place of the one above. They ask for
# ``anyio_backend`` themselves because anyio runs an async fixture only for a test that has
# it, and the argument checks are synchronous tests that need a client too.


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ThrowawayServer]:
    with ThrowawayServer() as server:
        yield server


@pytest.fixture
async def redis_client(redis_server: ThrowawayServer, anyio_backend: str) -> AsyncIterator[Any]:
    """A client on the shared server, which is flushed (and declared fresh) first."""
    redis_server.flush()
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
async def redis_connect(anyio_backend: str) -> AsyncIterator[Callable[..., Any]]:
    """Makes more clients: ``redis_connect(url, **options)`` (``Redis.from_url`` options).

    Every client made is closed after the test, whether it passed or failed.
    """
    clients: list[Any] = []

    def connect(url: str, **options: Any) -> Any:
        client = redis.asyncio.Redis.from_url(url, **options)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        await client.aclose()

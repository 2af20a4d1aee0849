"""Shared test configuration: every async test runs on asyncio and on trio; Redis fixtures."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio

from lovely_coordinator._redis.server import ThrowawayServer


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


# --- Redis (lovely_coordinator.redis, asyncio-only) ---------------------------------------
# One throwaway server for the whole run (never a mock); tests that kill, pause or restart a
# server start their own. A missing server binary is an error, never a skip.


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ThrowawayServer]:
    with ThrowawayServer() as server:
        yield server


@pytest_asyncio.fixture
async def redis_client(redis_server: ThrowawayServer) -> AsyncIterator[Any]:
    """A client on the shared server, which is flushed (and declared fresh) first."""
    redis_server.flush()
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest_asyncio.fixture
async def redis_connect() -> AsyncIterator[Callable[..., Any]]:
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

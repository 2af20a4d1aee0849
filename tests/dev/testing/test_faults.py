"""The fault proxy itself: each fault does what the fault tests rely on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
import redis.exceptions
from lovely_coordinator_dev.testing.faults import proxy_to
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ...redis.helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio

NO_RETRY: dict[str, Any] = {"retry": Retry(NoBackoff(), 0), "socket_timeout": 0.3}


async def test_healthy_and_delayed(
    redis_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with proxy_to(redis_server.port) as proxy:
            client = redis_connect(proxy.url)
            assert await client.ping()
            proxy.delay(0.2)
            start = anyio.current_time()
            assert await client.ping()
            assert anyio.current_time() - start >= 0.2
            proxy.heal()
            start = anyio.current_time()
            await client.ping()
            assert anyio.current_time() - start < 0.2


async def test_cut_replies_lets_the_request_through(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with proxy_to(redis_server.port) as proxy:
            client = redis_connect(proxy.url, **NO_RETRY)
            await client.ping()
            proxy.cut_replies(only_open=True)
            with pytest.raises(redis.exceptions.TimeoutError):
                await client.set("k", "done")
            assert await redis_client.get("k") == b"done"  # the server did it
            assert await client.ping()  # a new connection is not affected


async def test_drop_and_partition_and_heal(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with proxy_to(redis_server.port) as proxy:
            client = redis_connect(proxy.url, **NO_RETRY)
            await client.ping()
            proxy.drop()
            with pytest.raises(redis.exceptions.TimeoutError):
                await client.set("k", "lost")
            assert await redis_client.get("k") is None  # nothing went through
            proxy.partition()
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.ping()
            proxy.heal()
            assert await client.ping()


async def test_replies_can_be_rewritten(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with proxy_to(redis_server.port) as proxy:
            await redis_client.set("k", "original")
            proxy.replace_in_replies(b"original", b"replaced")
            assert await redis_connect(proxy.url).get("k") == b"replaced"
            with pytest.raises(ValueError, match="keep the length"):
                proxy.replace_in_replies(b"a", b"bb")

"""``min_replicas``: grants and renewals confirmed by replicas (``WAIT``), on real servers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    create_agent_coordinator,
)
from lovely_coordinator.redis import RedisFleet, RedisLocker, RedisPermitPool

from .helpers import anyio_backend, lock_keys, pool_key

__all__ = ["anyio_backend"]  # a fixture

GPT = ModelTuple("openai", "gpt-4o")

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def replicated() -> Iterator[tuple[ThrowawayServer, ThrowawayServer]]:
    with ThrowawayServer() as primary, ThrowawayServer() as replica:
        replica.replicate(primary)
        yield primary, replica


async def test_a_confirmed_grant_is_on_the_replica_when_acquire_returns(
    replicated: tuple[ThrowawayServer, ThrowawayServer], redis_connect: Callable[..., Any]
) -> None:
    primary, replica = replicated
    with anyio.fail_after(10):
        client = redis_connect(primary.url)
        on_replica = redis_connect(replica.url)
        for _ in range(20):
            lease = await RedisLocker(client, ttl=5, min_replicas=1).acquire("c")
            assert await on_replica.exists(lock_keys("c")["lock"]) == 1
            await lease.release()
        permit = await RedisPermitPool(client, name="p", limit=1, min_replicas=1).acquire()
        assert await on_replica.zcard(pool_key("p", "holders")) == 1
        await permit.release()


async def test_nothing_is_granted_while_the_replicas_cannot_confirm(
    replicated: tuple[ThrowawayServer, ThrowawayServer], redis_connect: Callable[..., Any]
) -> None:
    primary, replica = replicated
    with anyio.fail_after(20):
        client = redis_connect(primary.url)
        locker = RedisLocker(client, ttl=1, min_replicas=1)
        pool = RedisPermitPool(client, name="p", limit=1, ttl=1, min_replicas=1)
        replica.pause()
        try:
            with anyio.move_on_after(1.5) as scope:
                await locker.acquire("c")
            assert scope.cancelled_caught
            with anyio.move_on_after(1.5) as scope:
                await pool.acquire()
            assert scope.cancelled_caught
            # Given back, not held: nothing left on the primary.
            assert await client.exists(lock_keys("c")["lock"]) == 0
            assert await client.zcard(pool_key("p", "holders")) == 0
        finally:
            replica.resume()
        async with await locker.acquire("c"), pool.permit():
            pass


async def test_a_holder_whose_renewals_cannot_be_confirmed_is_lost(
    replicated: tuple[ThrowawayServer, ThrowawayServer], redis_connect: Callable[..., Any]
) -> None:
    primary, replica = replicated
    with anyio.fail_after(20):
        client = redis_connect(primary.url)
        lease = await RedisLocker(client, ttl=1, min_replicas=1).acquire("c")
        permit = await RedisPermitPool(client, name="p", limit=1, ttl=1, min_replicas=1).acquire()
        replica.pause()
        try:
            with anyio.fail_after(1.0):  # before its ttl has passed
                await lease.lost.wait()
                await permit.lost.wait()
        finally:
            replica.resume()
        await lease.release()
        await permit.release()


async def test_renewals_confirmed_keep_the_grant(
    replicated: tuple[ThrowawayServer, ThrowawayServer], redis_connect: Callable[..., Any]
) -> None:
    primary, _ = replicated
    with anyio.fail_after(20):
        client = redis_connect(primary.url)
        lease = await RedisLocker(client, ttl=0.3, min_replicas=1).acquire("c")
        with anyio.move_on_after(1.2):  # four ttls: a dozen renewals
            await lease.lost.wait()
        assert not lease.lost.is_set()
        await lease.release()


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, InvalidArgumentError), (1001, InvalidArgumentError), (1.0, InvalidArgumentTypeError)],
)
def test_bad_min_replicas_is_refused(value: Any, error: type[Exception]) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1")
    message = r"^min_replicas must be an integer from 0 to 1000$"
    with pytest.raises(error, match=message):
        RedisLocker(client, min_replicas=value)
    with pytest.raises(error, match=message):
        RedisPermitPool(client, name="p", limit=1, min_replicas=value)
    with pytest.raises(error, match=message):
        RedisFleet(client, create_agent_coordinator(), name="f", min_replicas=value)


async def fleet_holders(client: Any) -> int:
    """Units held in fleet "f" (every governed tuple's holders)."""
    keys = await client.keys("*fleet:f*:holders")
    return sum([int(await client.zcard(key)) for key in keys])


async def test_a_confirmed_fleet_admission_is_on_the_replica_when_it_is_admitted(
    replicated: tuple[ThrowawayServer, ThrowawayServer], redis_connect: Callable[..., Any]
) -> None:
    primary, replica = replicated
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(4)
        fleet = RedisFleet(redis_connect(primary.url), coordinator, name="f", min_replicas=1)
        on_replica = redis_connect(replica.url)
        async with fleet:
            # Limit 1: the previous unit's release (sent in the background) came first.
            await fleet.set_tuple_limit(GPT, 1)
            for _ in range(10):
                async with coordinator.request(GPT, tokens=1):
                    assert await fleet_holders(on_replica) == 1


async def test_no_fleet_admission_while_the_replicas_cannot_confirm(
    replicated: tuple[ThrowawayServer, ThrowawayServer], redis_connect: Callable[..., Any]
) -> None:
    primary, replica = replicated
    with anyio.fail_after(20):
        coordinator = create_agent_coordinator(4)
        client = redis_connect(primary.url)
        fleet = RedisFleet(
            client, coordinator, name="f", ttl=1, on_unavailable="wait", min_replicas=1
        )
        async with fleet:
            await fleet.set_tuple_limit(GPT, 2)
            replica.pause()
            try:
                with anyio.move_on_after(1.5) as scope:
                    async with coordinator.request(GPT, tokens=1):
                        pass
                assert scope.cancelled_caught
                assert await fleet_holders(client) == 0  # given back, or never admitted
            finally:
                replica.resume()
            async with coordinator.request(GPT, tokens=1):
                assert await fleet_holders(client) == 1

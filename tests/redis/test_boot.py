"""The server version check and the fresh-boot declaration."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator._base.errors import UnsupportedServerError
from lovely_coordinator._redis import boot
from lovely_coordinator._redis.keys import FRESH_BOOT_KEY
from lovely_coordinator.redis import RedisLocker

from .helpers import anyio_backend, own_server, run_id

__all__ = ["anyio_backend", "own_server"]  # fixtures

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("info", "refused"),
    [
        ({"redis_version": "6.2.14"}, ("Redis", "6.2.14")),
        ({"redis_version": "7.0.0"}, None),
        ({"redis_version": "8.2.1", "server_name": "redis"}, None),
        ({"redis_version": 6.0}, ("Redis", "6.0")),  # redis-py may parse a number
        ({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.1.8"}, None),
        ({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "7.2.5"}, None),
        # A Valkey is judged by its own version (its redis_version is always 7.2.4).
        (
            {"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "7.1.0"},
            ("Valkey", "7.1.0"),
        ),
        ({"redis_version": "7.0.0-rc1"}, None),
        ({}, ("Redis", "0")),
    ],
)
def test_which_servers_are_too_old(info: dict[str, Any], refused: tuple[str, str] | None) -> None:
    assert boot.too_old(info) == refused


def test_the_refusal_names_the_version() -> None:
    error = UnsupportedServerError("Redis", "6.2.14")
    assert str(error) == (
        "Redis 6.2.14 is not supported: "
        "lovely_coordinator.redis needs Redis >= 7.0 or Valkey >= 7.2"
    )


async def test_the_running_server_is_supported_and_asked_once(
    redis_client: Any, redis_connect: Callable[..., Any], redis_server: ThrowawayServer
) -> None:
    with anyio.fail_after(5):
        client = redis_connect(redis_server.url)
        await boot.ensure_supported(client)
        await client.aclose()  # a second check must not need the server
        await boot.ensure_supported(client)


async def test_a_declaration_names_one_boot(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        client = redis_connect(own_server.url)
        current = await run_id(client)
        assert await client.get(FRESH_BOOT_KEY) == current.encode()  # declared at start
        assert await boot.declared_fresh(client, current)
        assert await boot.on_quiet(client, "marker", "c", 100, f"{current}:1")
        assert boot.vouch(client, "marker") == f"{current}:1"  # passed with the next calls
        own_server.restart()  # a new boot nobody vouched for
        again = redis_connect(own_server.url)
        assert not await boot.on_quiet(again, "marker", "c", 100, f"{await run_id(again)}:1")
        assert boot.vouch(again, "marker") == ""


async def test_a_flush_of_a_vouched_boot_still_gets_its_quiet_period(
    own_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        client = redis_connect(own_server.url)
        locker = RedisLocker(client, ttl=0.5)
        with anyio.fail_after(0.5):  # the boot is vouched for: no quiet period
            async with await locker.acquire("c"):
                pass
        holder = await locker.acquire("d")
        await client.flushall()  # forgets d's grant (and the declaration) mid-boot
        started = anyio.current_time()
        async with await locker.acquire("d") as lease:  # the same client, that had vouched
            assert anyio.current_time() - started >= 0.5 + 1.0 - 0.05  # ttl and a tick
            assert lease.fence > holder.fence
            assert holder.lost.is_set()  # its renewals found the lease gone meanwhile


def test_quiet_periods_are_told_once_per_boot_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1")
    with caplog.at_level(logging.DEBUG, "lovely_coordinator.redis"):
        boot.tell_quiet(client, "run-1", "conversation 'c'", 4200)
        boot.tell_quiet(client, "run-1", "conversation 'd'", 4000)
        boot.tell_quiet(client, "run-2", "conversation 'c'", 900)
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.WARNING, logging.DEBUG, logging.WARNING]
    assert "nothing is granted for 4.2 s (quiet period)" in caplog.records[0].getMessage()

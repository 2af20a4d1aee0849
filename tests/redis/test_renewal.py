"""The renewal watchdog and the bounded clean-up, with plain callables (no server needed).

The renew callables here stand in for a script call: they answer, refuse, fail or hang,
which is all the watchdog can observe of Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from lovely_coordinator._redis.renewal import Renewer, best_effort, local_deadline

from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio


def test_local_deadline_comes_before_the_ttl() -> None:
    assert local_deadline(10.0, 30.0) == pytest.approx(10.0 + 30.0 - 0.302)
    assert local_deadline(0.0, 0.5) < 0.5


async def set_by(event: anyio.Event, when: float) -> bool:
    """Whether ``event`` was set by loop time ``when``, however late this task runs.

    asyncio fires timers in deadline order, so a task woken at ``when`` runs after every
    task whose wake-up was due earlier, even when the loop is late (on a loaded machine):
    the answer does not depend on scheduling lag, unlike reading the clock after the fact.
    """
    await anyio.sleep_until(when)
    return event.is_set()


async def test_renews_every_third_of_the_ttl_and_stays_held() -> None:
    with anyio.fail_after(5):
        calls: list[float] = []

        async def renew() -> bool:
            calls.append(anyio.current_time())
            return True

        ttl = 0.9
        start = anyio.current_time()
        renewer = Renewer(ttl, start, renew, "test grant")
        await anyio.sleep(1.0)
        await renewer.stop()
        assert not renewer.lost.is_set()
        assert len(calls) >= 2
        gaps = [b - a for a, b in zip([start, *calls], calls, strict=False)]
        # Never early; late only by scheduling lag, which must stay below the deadline.
        assert all(ttl / 3 - 0.001 <= gap < 2 * ttl / 3 for gap in gaps)


async def test_refused_renewal_sets_lost_at_once() -> None:
    with anyio.fail_after(5):
        start = anyio.current_time()

        async def renew() -> bool:
            return False

        renewer = Renewer(1.5, start, renew, "test grant")
        # At the first renewal (ttl / 3), not at the deadline (~ttl).
        assert await set_by(renewer.lost, start + 1.0)
        await renewer.stop()


@pytest.mark.parametrize(
    "error",
    [
        RedisConnectionError("down"),
        # Not a connection error: the watchdog must neither die of it nor give up early.
        ValueError("a reply the client could not parse"),
    ],
    ids=["connection", "unexpected"],
)
async def test_failing_renewals_are_retried_then_lost_before_the_ttl(
    caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    with anyio.fail_after(5):
        calls = 0

        async def renew() -> bool:
            nonlocal calls
            calls += 1
            raise error

        start = anyio.current_time()
        renewer = Renewer(0.3, start, renew, "test grant")
        with caplog.at_level(logging.WARNING, "lovely_coordinator.redis"):
            assert await set_by(renewer.lost, start + 0.3)
        assert calls >= 3  # first at ttl/3, then every ttl/10
        assert f"{type(error).__name__}: {error}" in caplog.text  # class and message
        assert "test grant is lost" in caplog.text
        await renewer.stop()


async def test_hanging_renewal_is_lost_at_the_deadline() -> None:
    with anyio.fail_after(5):

        async def renew() -> bool:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        start = anyio.current_time()
        renewer = Renewer(0.3, start, renew, "test grant")
        assert not await set_by(renewer.lost, local_deadline(start, 0.3) - 0.001)
        assert await set_by(renewer.lost, start + 0.3)
        await renewer.stop()


async def test_stop_before_the_first_renewal_never_renews() -> None:
    with anyio.fail_after(5):
        calls = 0

        async def renew() -> bool:
            nonlocal calls
            calls += 1
            return True

        renewer = Renewer(0.15, anyio.current_time(), renew, "test grant")
        await renewer.stop()
        await renewer.stop()  # idempotent
        await anyio.sleep(0.2)
        assert calls == 0
        assert not renewer.lost.is_set()


async def test_best_effort_is_shielded_bounded_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        finished = anyio.Event()

        async def slow_clean_up() -> None:
            await anyio.sleep(0.05)
            finished.set()

        with anyio.CancelScope() as scope:
            scope.cancel()  # the caller is being cancelled: the clean-up still runs
            await best_effort(slow_clean_up, 1.0, "cleaning")
        assert finished.is_set()

        async def hang() -> None:
            await anyio.sleep_forever()

        async def fail() -> None:
            raise RedisConnectionError("down")

        async def misbehave() -> None:
            raise ValueError("a reply the client could not parse")

        with caplog.at_level(logging.WARNING, "lovely_coordinator.redis"):
            start = anyio.current_time()
            await best_effort(hang, 0.05, "hanging")
            assert anyio.current_time() - start < 0.5
            await best_effort(fail, 1.0, "failing")
            await best_effort(misbehave, 1.0, "misbehaving")
        assert "hanging got no answer" in caplog.text
        assert "failing failed" in caplog.text
        assert "misbehaving failed" in caplog.text


async def test_a_cancellation_swallowed_by_the_client_still_stops_the_watchdog() -> None:
    # What asyncio.run() does at shutdown: cancel the task once. redis-py on Python 3.11
    # may swallow that cancellation (asyncio.wait_for) and return normally; the watchdog
    # must end anyway, or the loop never closes.
    inside = asyncio.Event()

    async def renew() -> bool:
        inside.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(5)
        return True

    renewer = Renewer(0.3, anyio.current_time(), renew, "test grant")
    await inside.wait()
    task = renewer._task
    assert task is not None
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    assert done, "the watchdog outlived its cancellation"
    assert task.cancelled()

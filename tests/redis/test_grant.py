"""wait_for_grant and Grant, driven by plain callables standing in for the script calls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from lovely_coordinator._redis import scripts
from lovely_coordinator._redis.grant import Grant, wait_for_grant
from lovely_coordinator._redis.subscriber import Watch

from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio

GRANTED, WAITING, QUIET = scripts.GRANTED, scripts.WAITING, scripts.QUIET


class Script:
    """Answers attempts from a list of replies and records what the waiter did."""

    def __init__(self, *replies: Sequence[Any], delays: Sequence[float] = ()) -> None:
        self.replies = list(replies)
        self.delays = list(delays)  # how long each reply takes to arrive
        self.attempts: list[float] = []
        self.watch: Watch | None = None
        self.subscribed = 0
        self.cleaned_up = 0
        self.given_back: list[Sequence[Any]] = []
        self.quiet: list[tuple[int, str]] = []
        self.declared_fresh = False
        self.parked = anyio.Event()

    async def attempt(self) -> Sequence[Any]:
        self.attempts.append(anyio.current_time())
        if len(self.attempts) > 2:
            self.parked.set()
        reply = self.replies.pop(0)
        if self.delays:
            await anyio.sleep(self.delays.pop(0))
        return reply

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[Watch]:
        self.watch = Watch()
        self.subscribed += 1
        try:
            yield self.watch
        finally:
            self.subscribed -= 1

    async def clean_up(self) -> None:
        self.cleaned_up += 1

    async def give_back(self, reply: Sequence[Any]) -> None:
        self.given_back.append(reply)

    async def on_quiet(self, remaining_ms: int, run_id: str) -> bool:
        self.quiet.append((remaining_ms, run_id))
        return self.declared_fresh

    async def run(
        self, recheck: float = 5.0, subscribed: bool = False, ttl: float = 1.0
    ) -> tuple[Sequence[Any], float]:
        return await wait_for_grant(
            self.attempt,
            self.watching,
            self.clean_up,
            give_back=self.give_back,
            on_quiet=self.on_quiet,
            subscribed=lambda: subscribed,
            ttl=ttl,
            recheck=recheck,
            what="test",
        )


async def test_granted_at_once_needs_no_subscription() -> None:
    with anyio.fail_after(5):
        script = Script((GRANTED, 42))
        reply, sent = await script.run()
        assert list(reply) == [GRANTED, 42]
        assert sent <= script.attempts[0]  # measured before the request is sent
        assert script.watch is None
        assert script.cleaned_up == 0


async def test_first_refusal_subscribes_and_retries_at_once_then_waits_for_a_wake_up() -> None:
    with anyio.fail_after(5):
        script = Script((WAITING, -1), (WAITING, -1), (GRANTED, 7))
        async with anyio.create_task_group() as tg:
            result: list[Sequence[Any]] = []

            async def waiter() -> None:
                result.append((await script.run())[0])

            tg.start_soon(waiter)
            while len(script.attempts) < 2:  # noqa: ASYNC110  (attempts are counted)
                await anyio.sleep(0.001)
            await anyio.sleep(0.05)
            assert len(script.attempts) == 2  # parked: no polling
            assert script.watch is not None
            script.watch.event.set()
        assert list(result[0]) == [GRANTED, 7]
        assert script.subscribed == 0  # the subscription is left once granted


async def test_waiter_retries_when_the_holder_is_due_to_expire() -> None:
    with anyio.fail_after(5):
        script = Script((WAITING, 100), (WAITING, 100), (GRANTED, 1))
        await script.run()
        assert 0.1 <= script.attempts[2] - script.attempts[1] < 0.5


async def test_recheck_bounds_every_wait() -> None:
    with anyio.fail_after(5):
        script = Script((WAITING, 60_000), (WAITING, -1), (GRANTED, 1))
        await script.run(recheck=0.05)
        assert script.attempts[2] - script.attempts[1] < 0.5


async def test_cancelled_wait_cleans_up_and_leaves_the_subscription() -> None:
    with anyio.fail_after(5):
        script = Script((WAITING, -1), (WAITING, -1), (WAITING, -1))
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(script.run)
                while len(script.attempts) < 2:  # noqa: ASYNC110  (attempts are counted)
                    await anyio.sleep(0.001)
                scope.cancel()
        assert script.cleaned_up == 1
        assert script.subscribed == 0


async def test_failed_attempt_cleans_up_and_raises() -> None:
    with anyio.fail_after(5):
        script = Script()  # popping from no replies: IndexError, as any failure
        with pytest.raises(IndexError):
            await script.run()
        assert script.cleaned_up == 1


class Counting:
    def __init__(self, fail: bool = False) -> None:
        self.renewals = 0
        self.give_backs = 0
        self.fail = fail

    async def renew(self) -> bool:
        self.renewals += 1
        return True

    async def give_back(self) -> None:
        self.give_backs += 1
        await anyio.sleep(0.01)
        if self.fail:
            raise RedisConnectionError("down")


async def test_release_is_idempotent_and_concurrent_callers_wait_for_it() -> None:
    with anyio.fail_after(5):
        calls = Counting()
        grant = Grant(
            ttl=5, sent_at=anyio.current_time(), renew=calls.renew, give_back=calls.give_back,
            name="g",
        )  # fmt: skip
        assert repr(grant) == "<Grant g held>"
        async with anyio.create_task_group() as tg:
            tg.start_soon(grant.release)
            tg.start_soon(grant.release)
        assert grant.released
        await grant.release()
        assert calls.give_backs == 1
        assert repr(grant) == "<Grant g released>"


async def test_release_never_raises_and_context_manager_releases() -> None:
    with anyio.fail_after(5):
        calls = Counting(fail=True)
        async with Grant(
            ttl=5, sent_at=anyio.current_time(), renew=calls.renew, give_back=calls.give_back,
            name="g",
        ) as grant:  # fmt: skip
            assert repr(grant) == "<Grant g held>"
        assert grant.released
        assert calls.give_backs == 1
        assert not grant.lost.is_set()


async def test_already_subscribed_waiter_parks_after_one_refusal_and_learns_its_ticket() -> None:
    with anyio.fail_after(5):
        script = Script((WAITING, -1, 9), (GRANTED, 7, 9))
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: script.run(subscribed=True))
            while not script.attempts:  # noqa: ASYNC110  (attempts are counted)
                await anyio.sleep(0.001)
            await anyio.sleep(0.05)
            assert len(script.attempts) == 1  # no re-try: it was listening all along
            assert script.watch is not None
            assert script.watch.ticket == 9
            script.watch.event.set()
        assert len(script.attempts) == 2


async def test_a_grant_whose_ttl_ran_out_in_transit_is_given_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        # The first reply takes longer than the ttl to arrive: the server may have given
        # the grant to someone else by then. It must never be returned.
        script = Script((GRANTED, 1, 1), (GRANTED, 2, 1), delays=[0.06, 0])
        with caplog.at_level(logging.WARNING, "lovely_coordinator.redis"):
            reply, sent = await script.run(ttl=0.05)
        assert list(reply) == [GRANTED, 2, 1]
        assert script.given_back == [(GRANTED, 1, 1)]
        assert script.attempts[0] < sent <= script.attempts[1]  # the valid one's send
        assert script.cleaned_up == 0
        assert "after its ttl had run out; given back" in caplog.text


async def test_a_grant_in_time_is_kept_however_slow() -> None:
    with anyio.fail_after(5):
        # Slow, but well within the ttl counted from the send: a valid grant.
        script = Script((GRANTED, 1), delays=[0.02])
        reply, _ = await script.run(ttl=1.0)
        assert list(reply) == [GRANTED, 1]
        assert script.given_back == []


async def test_a_quiet_period_is_waited_out_without_subscribing() -> None:
    with anyio.fail_after(5):
        script = Script((QUIET, 30, b"run-1"), (GRANTED, 5))
        reply, _ = await script.run(recheck=5.0)
        assert list(reply) == [GRANTED, 5]
        assert script.quiet == [(30, "run-1")]
        assert 0.03 <= script.attempts[1] - script.attempts[0] < 0.5  # at the period's end
        assert script.watch is None  # nobody will publish: no subscription needed


async def test_a_quiet_period_of_a_boot_declared_fresh_is_retried_at_once() -> None:
    with anyio.fail_after(5):
        script = Script((QUIET, 60_000, "run-1"), (GRANTED, 5))
        script.declared_fresh = True
        await script.run()
        assert len(script.attempts) == 2


async def test_a_cancellation_swallowed_by_the_client_is_delivered_anyway() -> None:
    # redis-py on Python 3.11 can swallow a native cancellation (asyncio.wait_for): the
    # waiter must not carry on waiting as if nothing happened.
    inside = asyncio.Event()
    cleaned_up = 0

    async def swallowing_attempt() -> Sequence[Any]:
        inside.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(5)
        return (WAITING, -1)

    async def clean_up() -> None:
        nonlocal cleaned_up
        cleaned_up += 1

    async def no_quiet(remaining_ms: int, run_id: str) -> bool:
        raise AssertionError("unreachable")

    async def nothing(reply: Sequence[Any]) -> None:
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def watching() -> AsyncIterator[Watch]:
        yield Watch()

    task = asyncio.ensure_future(
        wait_for_grant(
            swallowing_attempt,
            watching,
            clean_up,
            give_back=nothing,
            on_quiet=no_quiet,
            subscribed=lambda: True,
            ttl=1.0,
            recheck=60.0,
            what="test",
        )
    )
    await inside.wait()
    task.cancel()  # once, as asyncio.run() does at shutdown
    done, _ = await asyncio.wait([task], timeout=5)
    assert done, "the waiter outlived its cancellation"
    assert task.cancelled()
    assert cleaned_up == 1

"""wait_for_grant and Grant, driven by plain callables standing in for the script calls."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from lovely_coordinator._redis import scripts
from lovely_coordinator._redis.grant import Grant, wait_for_grant
from lovely_coordinator._redis.subscriber import Watch

GRANTED, WAITING = scripts.GRANTED, scripts.WAITING


class Script:
    """Answers attempts from a list of replies and records what the waiter did."""

    def __init__(self, *replies: Sequence[int]) -> None:
        self.replies = list(replies)
        self.attempts: list[float] = []
        self.watch: Watch | None = None
        self.subscribed = 0
        self.cleaned_up = 0
        self.parked = anyio.Event()

    async def attempt(self) -> Sequence[int]:
        self.attempts.append(anyio.current_time())
        if len(self.attempts) > 2:
            self.parked.set()
        return self.replies.pop(0)

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

    async def run(
        self, recheck: float = 5.0, subscribed: bool = False
    ) -> tuple[Sequence[Any], float]:
        return await wait_for_grant(
            self.attempt,
            self.watching,
            self.clean_up,
            subscribed=lambda: subscribed,
            bound=1.0,
            recheck=recheck,
            what="test",
        )


@pytest.mark.asyncio
async def test_granted_at_once_needs_no_subscription() -> None:
    with anyio.fail_after(5):
        script = Script((GRANTED, 42))
        reply, sent = await script.run()
        assert list(reply) == [GRANTED, 42]
        assert sent <= script.attempts[0]  # measured before the request is sent
        assert script.watch is None
        assert script.cleaned_up == 0


@pytest.mark.asyncio
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


@pytest.mark.asyncio
async def test_waiter_retries_when_the_holder_is_due_to_expire() -> None:
    with anyio.fail_after(5):
        script = Script((WAITING, 100), (WAITING, 100), (GRANTED, 1))
        await script.run()
        assert 0.1 <= script.attempts[2] - script.attempts[1] < 0.5


@pytest.mark.asyncio
async def test_recheck_bounds_every_wait() -> None:
    with anyio.fail_after(5):
        script = Script((WAITING, 60_000), (WAITING, -1), (GRANTED, 1))
        await script.run(recheck=0.05)
        assert script.attempts[2] - script.attempts[1] < 0.5


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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

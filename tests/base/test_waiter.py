"""Parker: the one-shot rendezvous every blocking operation of the library parks on."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest
import trio.testing
from anyio import wait_all_tasks_blocked

from lovely_coordinator._base.waiter import Parker, checkpoint

pytestmark = pytest.mark.anyio
# asyncio-only behaviour (native task.cancel()); the module is marked for anyio.
ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])


class Calls:
    """Records what a parker tells its owner."""

    def __init__(self) -> None:
        self.aborted = 0
        self.undone: list[object] = []

    def _parker_abort(self, key: str) -> None:
        assert key == "key"
        self.aborted += 1

    def _parker_undo(self, key: str, value: object) -> None:
        assert key == "key"
        self.undone.append(value)


async def test_grant_while_waiting_returns_the_value() -> None:
    with anyio.fail_after(5):
        parker: Parker[int] = Parker()
        calls = Calls()
        result: list[int] = []

        async def wait() -> None:
            result.append(await parker.wait(calls, "key"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await wait_all_tasks_blocked()
            assert parker.pending
            parker.grant(7)
            assert not parker.pending
        assert result == [7]
        assert (calls.aborted, calls.undone) == (0, [])


async def test_grant_before_wait_still_checkpoints(anyio_backend: str) -> None:
    with anyio.fail_after(5):
        parker: Parker[str] = Parker()
        parker.grant("early")
        calls = Calls()
        if anyio_backend == "trio":
            with trio.testing.assert_checkpoints():
                assert await parker.wait(calls, "key") == "early"
            return
        other_ran = anyio.Event()

        async def other() -> None:
            other_ran.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            # asyncio runs ready tasks in order: `other` runs only if the wait yields.
            assert await parker.wait(calls, "key") == "early"
            assert other_ran.is_set()


async def test_checkpoint_yields_and_is_a_cancel_point(anyio_backend: str) -> None:
    with anyio.fail_after(5):
        if anyio_backend == "trio":
            with trio.testing.assert_checkpoints():
                await checkpoint()
        else:
            other_ran = anyio.Event()

            async def other() -> None:
                other_ran.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                await checkpoint()  # asyncio runs ready tasks in order: `other` ran
                assert other_ran.is_set()
        reached = False
        with anyio.CancelScope() as scope:
            scope.cancel()
            await checkpoint()
            reached = True
        assert scope.cancelled_caught
        assert not reached


async def test_fail_raises_the_error() -> None:
    with anyio.fail_after(5):
        parker: Parker[int] = Parker()
        calls = Calls()
        error = LookupError("no")

        async def wait() -> None:
            with pytest.raises(LookupError) as info:
                await parker.wait(calls, "key")
            assert info.value is error

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await wait_all_tasks_blocked()
            parker.fail(error)
        assert (calls.aborted, calls.undone) == (0, [])


async def test_fail_before_wait_raises_too() -> None:
    with anyio.fail_after(5):
        parker: Parker[int] = Parker()
        parker.fail(KeyError("k"))
        with pytest.raises(KeyError):
            await parker.wait(Calls(), "key")


async def test_cancel_while_pending_calls_on_abort_only() -> None:
    with anyio.fail_after(5):
        parker: Parker[int] = Parker()
        calls = Calls()
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                await parker.wait(calls, "key")

            tg.start_soon(wait)
            await wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert (calls.aborted, calls.undone) == (1, [])
        assert not parker.pending  # the waiter left: it can no longer be granted


async def test_cancel_then_grant_in_one_tick_calls_on_undo() -> None:
    with anyio.fail_after(5):
        parker: Parker[int] = Parker()
        calls = Calls()
        scope = anyio.CancelScope()

        async def wait() -> None:
            with scope:
                await parker.wait(calls, "key")

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await wait_all_tasks_blocked()
            scope.cancel()  # the cancellation is on its way ...
            parker.grant(3)  # ... when the grant lands
        assert scope.cancelled_caught
        assert (calls.aborted, calls.undone) == (0, [3])


async def test_cancel_then_fail_calls_neither() -> None:
    with anyio.fail_after(5):
        parker: Parker[int] = Parker()
        calls = Calls()
        scope = anyio.CancelScope()

        async def wait() -> None:
            with scope:
                await parker.wait(calls, "key")

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await wait_all_tasks_blocked()
            scope.cancel()
            parker.fail(RuntimeError("failed"))  # holds nothing: nothing to undo
        assert scope.cancelled_caught
        assert (calls.aborted, calls.undone) == (0, [])


async def test_granted_wait_in_cancelled_scope_undoes() -> None:
    with anyio.fail_after(5):
        parker: Parker[int] = Parker()
        parker.grant(9)
        calls = Calls()
        with anyio.CancelScope() as scope:
            scope.cancel()
            await parker.wait(calls, "key")
        assert (calls.aborted, calls.undone) == (0, [9])


def test_grant_and_fail_only_once() -> None:
    parker: Parker[int] = Parker()
    parker.grant(1)
    with pytest.raises(AssertionError):
        parker.grant(2)
    with pytest.raises(AssertionError):
        parker.fail(RuntimeError())


@ASYNCIO_ONLY
async def test_native_cancel_after_grant_calls_on_undo() -> None:
    """asyncio delivers a cancellation to a task whose wait was already granted."""
    async with asyncio.timeout(5):
        parker: Parker[int] = Parker()
        calls = Calls()
        task = asyncio.ensure_future(parker.wait(calls, "key"))
        await asyncio.sleep(0)
        parker.grant(5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (calls.aborted, calls.undone) == (0, [5])

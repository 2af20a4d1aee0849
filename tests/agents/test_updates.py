"""UpdateHub: asynchronous, coalesced delivery of statistics to subscribers and watchers."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked

from lovely_coordinator import CoordinatorStatistics
from lovely_coordinator._agents.updates import UpdateHub, bind_to_snapshot


class State:
    """A stand-in for the coordinator: one number, published as ``max_concurrency``."""

    def __init__(self) -> None:
        self.value = 0
        self.snapshots = 0
        self.hub = UpdateHub(self.snapshot, threading.RLock())

    def snapshot(self) -> CoordinatorStatistics:
        self.snapshots += 1
        return CoordinatorStatistics(self.value, 0, 0, 0, 0, ())

    def change(self, value: int) -> None:
        self.value = value
        self.hub.notify()


class Recorder:
    """A subscriber callback that records values and lets a test await the next delivery."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self._seen = 0
        self._event: anyio.Event | None = None

    def __call__(self, statistics: CoordinatorStatistics) -> None:
        self.values.append(statistics.max_concurrency)
        if self._event is not None:
            self._event.set()

    async def next(self) -> None:
        """Wait until a delivery has come since the last ``next()``."""
        while len(self.values) == self._seen:
            self._event = anyio.Event()
            await self._event.wait()
        self._seen = len(self.values)


def test_notify_without_listeners_or_loop_is_cheap_and_safe() -> None:
    state = State()
    state.change(1)
    state.hub.subscribe(Recorder())
    state.change(2)  # no event loop: nothing can be delivered, nothing breaks
    assert state.snapshots == 0


@pytest.mark.anyio
async def test_a_burst_is_delivered_later_once_with_the_latest_state() -> None:
    with anyio.fail_after(5):
        state = State()
        recorder = Recorder()
        state.hub.subscribe(recorder)
        for value in range(1, 6):
            state.change(value)
        assert recorder.values == []  # never inside the scheduling call
        await recorder.next()
        await wait_all_tasks_blocked()
        assert recorder.values == [5]
        assert state.snapshots == 1
        state.change(6)
        await recorder.next()
        assert recorder.values == [5, 6]


_who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


@pytest.mark.anyio
async def test_a_callback_runs_in_a_fresh_copy_of_its_subscribe_context() -> None:
    with anyio.fail_after(5):
        state = State()
        seen: list[tuple[str, str, int]] = []
        delivered = anyio.Event()

        def make_callback(name: str) -> Callable[[CoordinatorStatistics], None]:
            def callback(statistics: CoordinatorStatistics) -> None:
                seen.append((name, _who.get(), statistics.max_concurrency))
                _who.set("changed by the callback")  # gone by the next delivery
                if len(seen) % 2 == 0:
                    delivered.set()

            return callback

        async def subscribe_as(name: str) -> None:
            _who.set(name)  # this task's own context
            state.hub.subscribe(make_callback(name))

        async with anyio.create_task_group() as tg:
            tg.start_soon(subscribe_as, "first")
            tg.start_soon(subscribe_as, "second")
        _who.set("notifier")
        state.change(1)  # delivered from the loop, where the notifier's context is not
        await delivered.wait()
        delivered = anyio.Event()
        state.change(2)
        await delivered.wait()
        assert sorted(seen) == [
            ("first", "first", 1),
            ("first", "first", 2),
            ("second", "second", 1),
            ("second", "second", 2),
        ]
        assert _who.get() == "notifier"


@pytest.mark.anyio
async def test_the_same_callback_twice_is_two_subscriptions() -> None:
    with anyio.fail_after(5):
        state = State()
        recorder = Recorder()
        unsubscribe_first = state.hub.subscribe(recorder)
        unsubscribe_second = state.hub.subscribe(recorder)
        state.change(1)
        await recorder.next()
        assert recorder.values == [1, 1]
        unsubscribe_first()
        unsubscribe_first()  # idempotent, and it does not touch the second subscription
        state.change(2)
        await recorder.next()
        assert recorder.values == [1, 1, 2]
        unsubscribe_second()
        state.change(3)
        await wait_all_tasks_blocked()
        await anyio.lowlevel.checkpoint()
        assert recorder.values == [1, 1, 2]


@pytest.mark.anyio
async def test_callback_errors_are_logged_and_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(5):
        state = State()

        def broken(statistics: CoordinatorStatistics) -> None:
            raise RuntimeError("ui is broken")

        async def wrongly_async(statistics: CoordinatorStatistics) -> None:
            pass  # pragma: no cover - never awaited

        recorder = Recorder()
        state.hub.subscribe(broken)
        state.hub.subscribe(wrongly_async)
        state.hub.subscribe(recorder)
        with caplog.at_level(logging.ERROR, logger="lovely_coordinator"):
            state.change(1)
            await recorder.next()
        assert recorder.values == [1]
        failed = [r for r in caplog.records if r.exc_info is not None]
        assert len(failed) == 1
        assert failed[0].exc_info is not None
        assert str(failed[0].exc_info[1]) == "ui is broken"
        assert any("is async" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_a_callback_may_unsubscribe_a_later_one() -> None:
    with anyio.fail_after(5):
        state = State()
        later = Recorder()
        unsubscribe_later: list[object] = []

        def first(statistics: CoordinatorStatistics) -> None:
            for unsubscribe in unsubscribe_later:
                assert callable(unsubscribe)
                unsubscribe()

        state.hub.subscribe(first)
        unsubscribe_later.append(state.hub.subscribe(later))
        witness = Recorder()
        state.hub.subscribe(witness)
        state.change(1)
        await witness.next()
        assert later.values == []


def test_a_delivery_stranded_on_an_ended_loop_does_not_block_the_next_loop() -> None:
    state = State()
    recorder = Recorder()
    state.hub.subscribe(recorder)

    # Notify on a loop that stops before it runs the scheduled delivery.
    loop = asyncio.new_event_loop()
    loop.call_soon(state.change, 1)
    loop.call_soon(loop.stop)
    loop.run_forever()
    loop.close()
    assert recorder.values == []

    async def on_a_new_loop() -> None:
        with anyio.fail_after(5):
            state.change(2)
            await recorder.next()

    anyio.run(on_a_new_loop, backend="trio")
    assert recorder.values == [2]


async def _pull(watch: AsyncGenerator[CoordinatorStatistics]) -> int:
    return (await anext(watch)).max_concurrency


@pytest.mark.anyio
async def test_watch_yields_the_current_state_then_coalesced_changes() -> None:
    with anyio.fail_after(5):
        state = State()
        state.change(7)
        watch = state.hub.watch()
        assert isinstance(watch, AsyncGenerator)
        assert await _pull(watch) == 7
        state.change(8)
        state.change(9)
        assert await _pull(watch) == 9  # both changes, one item

        got: list[int] = []

        async def pull_one() -> None:
            got.append(await _pull(watch))

        async with anyio.create_task_group() as tg:
            tg.start_soon(pull_one)
            await wait_all_tasks_blocked()
            assert got == []  # nothing changed: it waits
            state.change(10)
        assert got == [10]
        await watch.aclose()


@pytest.mark.anyio
async def test_many_watchers_each_see_the_latest_state() -> None:
    with anyio.fail_after(5):
        state = State()
        seen: dict[int, list[int]] = {0: [], 1: [], 2: []}

        async def consume(index: int) -> None:
            async with aclosing(state.hub.watch()) as watch:
                async for statistics in watch:
                    seen[index].append(statistics.max_concurrency)
                    if statistics.max_concurrency == 3:
                        return

        async with anyio.create_task_group() as tg:
            for index in seen:
                tg.start_soon(consume, index)
            await wait_all_tasks_blocked()
            state.change(1)
            await wait_all_tasks_blocked()
            state.change(2)
            state.change(3)
        for values in seen.values():
            assert values == [0, 1, 3]


@pytest.mark.anyio
async def test_a_cancelled_watch_leaves_nothing_behind() -> None:
    with anyio.fail_after(5):
        state = State()
        started = anyio.Event()

        async def consume() -> None:
            async for _ in state.hub.watch():
                started.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await started.wait()
            await wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        snapshots = state.snapshots
        state.change(1)
        await wait_all_tasks_blocked()
        assert state.snapshots == snapshots  # no watcher left to take a snapshot
        watch = state.hub.watch()
        assert await _pull(watch) == 1
        await watch.aclose()


def test_watch_works_on_a_later_loop_after_a_watch_was_abandoned() -> None:
    state = State()

    async def consume() -> None:
        async for _ in state.hub.watch():
            pass

    async def abandon() -> None:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await wait_all_tasks_blocked()
                tg.cancel_scope.cancel()

    async def watch_again() -> None:
        with anyio.fail_after(5):
            watch = state.hub.watch()
            assert await _pull(watch) == 0
            async with anyio.create_task_group() as tg:
                tg.start_soon(_pull, watch)
                await wait_all_tasks_blocked()
                state.change(1)
            await watch.aclose()

    anyio.run(abandon, backend="asyncio")
    anyio.run(watch_again, backend="trio")


def stats(value: int) -> CoordinatorStatistics:
    return CoordinatorStatistics(value, 0, 0, 0, 0, ())


_value: contextvars.ContextVar[int] = contextvars.ContextVar("value", default=0)


def test_bind_to_snapshot_runs_each_call_in_a_fresh_copy_of_the_snapshot() -> None:
    def bump(statistics: CoordinatorStatistics) -> int:
        _value.set(_value.get() + statistics.max_concurrency)
        return _value.get()

    token = _value.set(10)
    bound = bind_to_snapshot(bump)
    _value.reset(token)  # later changes of the caller's context are not seen
    assert bound(stats(1)) == 11
    assert bound(stats(2)) == 12  # not 13: the first call's change did not outlive it
    assert _value.get() == 0  # and never leaks into the calling context
    assert contextvars.Context().run(bound, stats(5)) == 15  # whatever context it is called from

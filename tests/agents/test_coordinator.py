"""AgentCoordinator, AgentPermit, AgentReservation: every scheduling rule of CONTRACT §1.

Each async test runs on asyncio and trio. Tasks are ordered with events and
``wait_all_tasks_blocked()``, never with sleeps; time-dependent tests use trio's
``MockClock`` (plus a short real-time asyncio variant).
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import functools
import logging
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import pytest
from anyio import wait_all_tasks_blocked
from trio.testing import MockClock

from lovely_coordinator import (
    AGENT_COORDINATOR_VERSION,
    AgentCoordinator,
    AgentPermit,
    CoordinatorConfig,
    CoordinatorError,
    CoordinatorStatistics,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    PermitReleasedError,
    ReservationCancelledError,
    ReservationUsedError,
    TupleStatistics,
    TupleSuspendedError,
    create_agent_coordinator,
    current_permit,
)

pytestmark = pytest.mark.anyio
# asyncio-only behaviour (native task.cancel()); the module is marked for anyio.
ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])

T = ModelTuple("openai", "gpt")
U = ("anthropic", "claude")  # a plain pair works wherever a tuple does
SUSPENDED = (
    r"^Provider/model is suspended by a provider limit; foreground work cannot wait for recovery$"
)
MOCK_TRIO = pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock")],
)


def assert_idle(coord: AgentCoordinator, limit: int | None = None) -> None:
    """Nothing granted, queued or lent: no slot leaked."""
    stats = coord.statistics()
    assert (stats.active, stats.queued, stats.lent) == (0, 0, 0), stats
    # An idle tuple is listed only for its settings: closed, capped or budgeted.
    others = (t for t in stats.tuples if t.open and t.limit is None)
    assert all(
        t.requests_available is not None or t.tokens_available is not None for t in others
    ), stats
    if limit is not None:
        assert stats.max_concurrency == limit


class Holder:
    """A task that acquires a permit, records the grant and holds it until told to stop."""

    def __init__(
        self, coord: AgentCoordinator, name: str, log: list[str], t: Any = T, **kwargs: Any
    ) -> None:
        self.coord = coord
        self.name = name
        self.log = log
        self.t = t
        self.kwargs = kwargs
        self.done = anyio.Event()
        self.granted = anyio.Event()
        self.queued = anyio.Event()
        self.scope = anyio.CancelScope()
        self.permit: AgentPermit | None = None
        self.error: BaseException | None = None

    async def __call__(self) -> None:
        with self.scope:
            self.queued.set()  # enqueued before this task next yields
            try:
                async with self.coord.permit(self.t, **self.kwargs) as permit:
                    self.permit = permit
                    self.log.append(self.name)
                    self.granted.set()
                    await self.done.wait()
            except CoordinatorError as exc:
                self.error = exc
                self.log.append(f"{self.name}!")


async def start(tg: anyio.abc.TaskGroup, holder: Holder) -> Holder:
    """Start ``holder`` and return once every task is blocked (it is granted or queued)."""
    tg.start_soon(holder)
    await wait_all_tasks_blocked()
    return holder


async def spawn(tg: anyio.abc.TaskGroup, holder: Holder, *, granted: bool = False) -> None:
    """Start ``holder`` from inside another task; return once it is queued (or granted)."""
    tg.start_soon(holder)
    await (holder.granted if granted else holder.queued).wait()


# -- construction and knobs ------------------------------------------------------------------------


def test_factory_defaults_and_version() -> None:
    coord = create_agent_coordinator()
    assert coord.version == AGENT_COORDINATOR_VERSION == 1
    assert coord.max_concurrency == 4
    assert (coord.active_count, coord.queued_count, coord.resident_count) == (0, 0, 0)
    assert create_agent_coordinator(7).max_concurrency == 7


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "2", None])
def test_factory_rejects_bad_limit(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^max_concurrency must be a positive integer$"):
        create_agent_coordinator(bad)


def test_factory_with_config() -> None:
    config = CoordinatorConfig(max_concurrency=3, tuple_limits={T: 1}, reacquire="original")
    coord = create_agent_coordinator(config=config)
    assert coord.max_concurrency == 3
    assert coord.statistics().tuples == (TupleStatistics(T, 0, 0, 1, True, None),)
    assert create_agent_coordinator(3, config=config).max_concurrency == 3
    with pytest.raises(InvalidArgumentError):
        create_agent_coordinator(4, config=config)  # an explicit 4 differs from 3
    with pytest.raises(InvalidArgumentError):
        create_agent_coordinator(config={"max_concurrency": 3})  # type: ignore[arg-type]


def test_next_acceptance_order_counts_and_is_raised_by_explicit_orders() -> None:
    coord = create_agent_coordinator()
    assert [coord.next_acceptance_order() for _ in range(3)] == [1, 2, 3]
    coord.reserve(T, acceptance_order=10)
    assert coord.next_acceptance_order() == 11
    coord.reserve(T, acceptance_order=5)  # a lower explicit order never lowers the counter
    assert coord.next_acceptance_order() == 12


@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "1"])
def test_bad_limit_leaves_state_unchanged(bad: Any) -> None:
    coord = create_agent_coordinator(2)
    with pytest.raises(InvalidArgumentError, match=r"^max_concurrency must be a positive integer$"):
        coord.set_max_concurrency(bad)
    assert coord.max_concurrency == 2
    with pytest.raises(InvalidArgumentError):
        coord.set_tuple_limit(T, bad)
    assert coord.statistics().tuples == ()


@pytest.mark.parametrize("bad", [("", "m"), ("p", ""), ("p\0", "m"), ("p",), "pm", None])
def test_bad_tuple_everywhere(bad: Any) -> None:
    coord = create_agent_coordinator()
    message = r"^Model tuple provider and model must be nonempty and contain no NUL bytes$"
    for call in (
        lambda: coord.reserve(bad),
        lambda: coord.close_tuple(bad),
        lambda: coord.open_tuple(bad),
        lambda: coord.is_tuple_open(bad),
        lambda: coord.tuple_reopens_at(bad),
        lambda: coord.set_tuple_limit(bad, 1),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            call()
    assert coord.statistics() == CoordinatorStatistics(4, 0, 0, 0, 0, ())
    assert coord.next_acceptance_order() == 1


async def test_bad_acquire_arguments_raise_and_take_no_order() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator()
        message = r"^acceptance_order must be a positive integer$"
        bad: Any
        for bad in (0, -1, True, 1.5):
            with pytest.raises(InvalidArgumentError, match=message):
                await coord.acquire(T, acceptance_order=bad)
            with pytest.raises(InvalidArgumentError, match=message):
                coord.reserve(T, acceptance_order=bad)
        with pytest.raises(InvalidArgumentError):
            await coord.acquire(("", "x"))
        with pytest.raises(InvalidArgumentError):
            await coord.acquire(T, reject_on_closed_tuple=1)  # type: ignore[arg-type]
        assert coord.next_acceptance_order() == 1
        assert_idle(coord)


# -- acquire, release, hand-off -------------------------------------------------------------


async def test_uncontended_acquire_and_release() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(2)
        permit = await coord.acquire(T)
        assert (permit.held, permit.state, permit.tuple, permit.acceptance_order) == (
            True,
            "held",
            T,
            1,
        )
        assert coord.active_count == 1
        permit.release()
        permit.release()  # idempotent
        assert (permit.held, permit.state) == (False, "released")
        assert_idle(coord)


async def test_release_hands_the_slot_directly_to_the_next_waiter() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            a = await start(tg, Holder(coord, "a", log))
            b = await start(tg, Holder(coord, "b", log))
            assert (coord.active_count, coord.queued_count) == (1, 1)
            assert a.permit is not None
            a.permit.release()
            # Granted inside release(): b owns the slot before it even runs, so a
            # newcomer cannot barge in.
            assert (coord.active_count, coord.queued_count) == (1, 0)
            late = await start(tg, Holder(coord, "late", log))
            assert log == ["a", "b"]
            assert coord.queued_count == 1  # the newcomer waits behind b's slot
            for h in (a, b, late):
                h.done.set()
        assert log == ["a", "b", "late"]
        assert_idle(coord)


async def test_waiters_are_served_by_acceptance_order_then_arrival() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            holders = {
                h.name: await start(tg, h)
                for h in (
                    Holder(coord, "first", log),
                    Holder(coord, "b5", log, acceptance_order=5),
                    Holder(coord, "c3", log, acceptance_order=3),
                    Holder(coord, "d3", log, acceptance_order=3),
                    Holder(coord, "auto", log),  # order 6: after every order seen
                )
            }
            assert coord.queued_count == 4
            for _ in range(5):
                holders[log[-1]].done.set()
                await wait_all_tasks_blocked()
        assert log == ["first", "c3", "d3", "b5", "auto"]
        assert_idle(coord)


async def test_cancelled_while_queued_is_removed() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            a = await start(tg, Holder(coord, "a", log))
            b = await start(tg, Holder(coord, "b", log))
            c = await start(tg, Holder(coord, "c", log))
            b.scope.cancel()
            await wait_all_tasks_blocked()
            assert coord.queued_count == 1
            a.done.set()
            await wait_all_tasks_blocked()
            assert log == ["a", "c"]
            c.done.set()
        assert_idle(coord)


async def test_cancel_in_the_tick_of_the_grant_hands_the_slot_on() -> None:
    """Regression shape of asyncio's test_acquire_hang: cancelled, then granted, same tick."""
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            a = await start(tg, Holder(coord, "a", log))
            b = await start(tg, Holder(coord, "b", log))
            c = await start(tg, Holder(coord, "c", log))
            assert a.permit is not None
            b.scope.cancel()  # the cancellation is on its way to b ...
            a.permit.release()  # ... when the release grants b the slot
            assert (coord.active_count, coord.queued_count) == (1, 1)
            await wait_all_tasks_blocked()
            assert b.scope.cancelled_caught
            assert log == ["a", "c"]  # b handed the slot on to c
            assert (coord.active_count, coord.queued_count) == (1, 0)
            a.done.set()
            c.done.set()
        assert_idle(coord)


async def test_cancel_right_after_the_grant_never_leaks() -> None:
    """Granted first, cancelled in the same tick: b holds the slot until its next
    checkpoint (where the cancellation lands) and then hands it on."""
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            a = await start(tg, Holder(coord, "a", log))
            b = await start(tg, Holder(coord, "b", log))
            c = await start(tg, Holder(coord, "c", log))
            assert a.permit is not None
            a.permit.release()
            b.scope.cancel()
            await wait_all_tasks_blocked()
            assert b.scope.cancelled_caught
            assert log[-1] == "c"
            assert (coord.active_count, coord.queued_count) == (1, 0)
            a.done.set()
            c.done.set()
        assert_idle(coord)


@ASYNCIO_ONLY
async def test_native_cancel_after_uncontended_grant_returns_the_slot() -> None:
    """asyncio can cancel a task after its grant, at acquire's final checkpoint."""
    async with asyncio.timeout(5):
        coord = create_agent_coordinator(1)
        task = asyncio.ensure_future(coord.acquire(T))
        await asyncio.sleep(0)  # the task runs: granted at once, then yields
        assert coord.active_count == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert_idle(coord)
        assert coord.next_acceptance_order() == 2  # it had enqueued, so it took order 1


@ASYNCIO_ONLY
async def test_native_cancel_after_contended_grant_hands_the_slot_on() -> None:
    async with asyncio.timeout(5):
        coord = create_agent_coordinator(1)
        first = await coord.acquire(T)
        second = asyncio.ensure_future(coord.acquire(T))
        third = asyncio.ensure_future(coord.acquire(T))
        await asyncio.sleep(0)
        assert coord.queued_count == 2
        first.release()  # grants `second` ...
        second.cancel()  # ... which is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await second
        permit = await third
        assert permit.acceptance_order == 3
        permit.release()
        assert_idle(coord)


async def test_cancelled_before_enqueue_takes_no_order() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await coord.acquire(T)
        assert coord.next_acceptance_order() == 1
        assert_idle(coord)


@pytest.mark.parametrize("held", [False, True], ids=["free", "contended"])
async def test_permit_cancelled_at_its_checkpoint_takes_nothing(held: bool) -> None:
    """``permit()`` passes its checkpoint before it takes a place (a yield where it
    expects a slot of its own, else a check): cancelled there, it took nothing."""
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        holder = await coord.acquire(T) if held else None
        entered = False
        with anyio.CancelScope() as scope:
            scope.cancel()
            async with coord.permit(T):
                entered = True
        assert scope.cancelled_caught
        assert not entered
        assert coord.next_acceptance_order() == (2 if held else 1)
        assert coord._core._arriving == 0
        if holder is not None:
            holder.release()
        assert_idle(coord)


async def test_permit_callers_arriving_together_are_granted_in_order() -> None:
    """Callers that arrive together, each expecting a free slot, count against the free
    slots; whatever each guessed, they are granted in acceptance order, none is lost."""
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)  # one at a time: resumed in the order granted
        granted: list[int] = []
        go = anyio.Event()

        async def worker() -> None:
            async with coord.permit(T) as permit:
                granted.append(permit.acceptance_order)
                await go.wait()

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(worker)
            await wait_all_tasks_blocked()
            assert (coord.active_count, coord.queued_count) == (1, 4)
            assert coord._core._arriving == 0
            go.set()
        assert granted == [1, 2, 3, 4, 5]
        assert_idle(coord)


# -- permit(), run(), current_permit() -------------------------------------------------------------


async def test_permit_is_current_in_body_and_child_tasks() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator()
        assert current_permit() is None
        seen: list[AgentPermit | None] = []

        async def child() -> None:
            seen.append(current_permit())

        async with coord.permit(T) as permit:
            assert current_permit() is permit
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
        assert seen == [permit]
        assert current_permit() is None
        assert permit.state == "released"
        assert_idle(coord)


async def test_permit_entered_in_one_task_and_exited_in_another() -> None:
    """A stream's context manager entered in one task and closed in another (pydantic-ai
    does this): the permit is released and no ``ContextVar.reset`` error escapes."""
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        stack = contextlib.AsyncExitStack()
        entered = anyio.Event()
        in_entering_task: list[AgentPermit | None] = []

        async def enter() -> None:
            permit = await stack.enter_async_context(coord.permit(T))
            in_entering_task.append(current_permit())
            assert permit.held
            entered.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(enter)
            await entered.wait()
        assert coord.active_count == 1
        assert current_permit() is None  # this task never saw the permit
        await stack.aclose()  # exited here, in another task's context
        assert current_permit() is None
        [permit] = in_entering_task
        assert permit is not None
        assert permit.state == "released"
        assert_idle(coord, 1)


async def test_permit_exited_in_a_child_task_restores_the_enclosing_permit() -> None:
    with anyio.fail_after(5):
        agents, bash = create_agent_coordinator(1), create_agent_coordinator(1)
        stack = contextlib.AsyncExitStack()
        after_exit: list[AgentPermit | None] = []
        async with agents.permit(T) as outer:
            inner = await stack.enter_async_context(bash.permit(T))
            assert current_permit() is inner

            async def close_it() -> None:  # its context is a copy taken inside the body
                await stack.aclose()
                after_exit.append(current_permit())

            async with anyio.create_task_group() as tg:
                tg.start_soon(close_it)
            assert inner.state == "released"
            assert after_exit == [outer]  # the child's context is restored
            assert outer.held
        assert_idle(agents, 1)
        assert_idle(bash, 1)


async def test_run_returns_and_reraises() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator()

        async def work() -> int:
            permit = current_permit()
            assert permit is not None
            assert permit.held
            return 42

        assert await coord.run(T, work) == 42

        async def boom() -> None:
            raise KeyError("x")

        with pytest.raises(KeyError):
            await coord.run(T, boom)
        assert_idle(coord)


async def test_run_does_not_start_work_when_acquire_fails() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator()
        coord.close_tuple(T)
        started: list[int] = []

        async def work() -> None:
            started.append(1)

        with pytest.raises(TupleSuspendedError, match=SUSPENDED):
            await coord.run(T, work, reject_on_closed_tuple=True)
        assert started == []
        # A refused call took no acceptance order.
        assert coord.next_acceptance_order() == 1


async def test_nested_coordinators_lend_their_own_permit() -> None:
    with anyio.fail_after(5):
        agents = create_agent_coordinator(1)
        bash = create_agent_coordinator(1)
        async with agents.permit(T) as agent_permit, bash.permit(T) as bash_permit:
            assert current_permit() is bash_permit

            async def wait() -> str:
                assert agent_permit.state == "lent"
                assert bash_permit.state == "held"
                return "ok"

            assert await agents.with_lent_permit(wait) == "ok"
            assert agent_permit.held
        assert_idle(agents)
        assert_idle(bash)


async def test_current_permit_of_a_coordinator_is_its_own_innermost() -> None:
    with anyio.fail_after(5):
        agents = create_agent_coordinator(2)
        bash = create_agent_coordinator(1)
        assert agents.current_permit() is None
        async with agents.permit(T) as outer:
            async with bash.permit(T) as bash_permit:
                assert current_permit() is bash_permit  # the innermost of any coordinator
                assert agents.current_permit() is outer  # skips the Bash pool's
                assert bash.current_permit() is bash_permit
                async with agents.permit(U) as inner:
                    assert agents.current_permit() is inner
                    assert bash.current_permit() is bash_permit
            assert bash.current_permit() is None
        assert agents.current_permit() is None
        assert_idle(agents, 2)
        assert_idle(bash, 1)


# -- tuple gates and caps --------------------------------------------------------------------------


async def test_closed_tuple_is_skipped_without_blocking_others() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            a = await start(tg, Holder(coord, "a", log))
            coord.close_tuple(T)
            assert not coord.is_tuple_open(T)
            assert coord.tuple_reopens_at(T) is None
            await start(tg, Holder(coord, "gated", log))
            u = await start(tg, Holder(coord, "other", log, t=U))
            assert a.permit is not None
            assert a.permit.held  # running permits are untouched
            a.done.set()
            await wait_all_tasks_blocked()
            assert log == ["a", "other"]
            assert coord.statistics().tuples[1] == TupleStatistics(T, 0, 1, None, False, None)
            coord.open_tuple(T)  # nothing is free yet: the gated waiter keeps its place
            assert coord.queued_count == 1
            u.done.set()
            await wait_all_tasks_blocked()
            assert log == ["a", "other", "gated"]
            coord.open_tuple(T)  # opening an open tuple is fine
            tg.cancel_scope.cancel()
        assert_idle(coord)


async def test_reject_on_closed_tuple() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            a = await start(tg, Holder(coord, "a", log))
            fg = await start(tg, Holder(coord, "fg", log, reject_on_closed_tuple=True))
            bg = await start(tg, Holder(coord, "bg", log))
            fg_res = coord.reserve(T, reject_on_closed_tuple=True)
            bg_res = coord.reserve(T)
            assert coord.queued_count == 4
            coord.close_tuple(T)
            await wait_all_tasks_blocked()
            assert log == ["a", "fg!"]
            assert isinstance(fg.error, TupleSuspendedError)
            assert coord.queued_count == 2  # bg and bg_res keep waiting
            with pytest.raises(TupleSuspendedError, match=SUSPENDED):
                await fg_res.run(_noop)
            with pytest.raises(TupleSuspendedError, match=SUSPENDED):
                await coord.acquire(T, reject_on_closed_tuple=True)
            with pytest.raises(TupleSuspendedError, match=SUSPENDED):
                coord.reserve(T, reject_on_closed_tuple=True)
            assert a.permit is not None
            assert a.permit.held
            coord.open_tuple(T)
            a.done.set()
            await wait_all_tasks_blocked()
            assert log == ["a", "fg!", "bg"]
            bg.done.set()
            bg_res.cancel()
        assert_idle(coord)


async def _noop() -> None:
    pass


async def test_tuple_cap_skips_without_blocking_other_tuples() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(3)
        coord.set_tuple_limit(T, 1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            a = await start(tg, Holder(coord, "a", log))
            b = await start(tg, Holder(coord, "b", log))
            c = await start(tg, Holder(coord, "c", log, t=U))
            assert log == ["a", "c"]
            assert coord.statistics().tuples == (
                TupleStatistics(ModelTuple(*U), 1, 0, None, True, None),
                TupleStatistics(T, 1, 1, 1, True, None),
            )
            coord.set_tuple_limit(T, 2)  # raising the cap grants at once
            assert coord.active_count == 3
            await wait_all_tasks_blocked()
            assert log == ["a", "c", "b"]
            coord.set_tuple_limit(T, None)
            for h in (a, b, c):
                h.done.set()
        assert_idle(coord)


async def test_set_max_concurrency_grows_in_order_and_never_revokes() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            holders = [await start(tg, Holder(coord, f"h{i}", log)) for i in range(4)]
            assert log == ["h0"]
            coord.set_max_concurrency(3)
            assert (coord.active_count, coord.queued_count) == (3, 1)
            await wait_all_tasks_blocked()
            assert sorted(log) == ["h0", "h1", "h2"]  # resumption order is the backend's
            assert not holders[3].granted.is_set()
            coord.set_max_concurrency(1)
            assert coord.active_count == 3  # shrinking revokes nothing
            holders[0].done.set()
            holders[1].done.set()
            await wait_all_tasks_blocked()
            assert not holders[3].granted.is_set()  # still 1 active ≥ the new cap of 1
            holders[2].done.set()
            await wait_all_tasks_blocked()
            assert log[-1] == "h3"
            holders[3].done.set()
        assert_idle(coord)


# -- timed reopen ----------------------------------------------------------------------------------


@MOCK_TRIO
async def test_close_tuple_reopens_after_delay_on_mock_clock() -> None:
    with anyio.fail_after(100):
        coord = create_agent_coordinator(1)
        start_time = anyio.current_time()
        coord.close_tuple(T, reopen_after=10)
        assert coord.tuple_reopens_at(T) == pytest.approx(start_time + 10)
        coord.close_tuple(T, reopen_after=5)  # never shortens
        assert coord.tuple_reopens_at(T) == pytest.approx(start_time + 10)
        coord.close_tuple(T, reopen_after=20)  # a later time replaces it
        assert coord.tuple_reopens_at(T) == pytest.approx(start_time + 20)
        permit = await coord.acquire(T)  # waits for the reopen
        assert anyio.current_time() == pytest.approx(start_time + 20)
        assert coord.is_tuple_open(T)
        assert coord.tuple_reopens_at(T) is None
        permit.release()
        assert_idle(coord)


@MOCK_TRIO
async def test_close_without_delay_cancels_the_timer() -> None:
    with anyio.fail_after(100):
        coord = create_agent_coordinator(1)
        coord.close_tuple(T, reopen_after=1)
        coord.close_tuple(T)
        assert coord.tuple_reopens_at(T) is None
        coord.close_tuple(T, reopen_after=1)  # would shorten an indefinite closure: ignored
        assert coord.tuple_reopens_at(T) is None
        await anyio.sleep(5)
        assert not coord.is_tuple_open(T)
        coord.open_tuple(T)
        coord.close_tuple(T, reopen_after=1)
        coord.open_tuple(T)  # cancels the timer
        coord.close_tuple(T)
        await anyio.sleep(5)
        assert not coord.is_tuple_open(T)


async def test_close_tuple_reopens_after_short_real_delay() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        coord.close_tuple(T, reopen_after=0.01)
        permit = await coord.acquire(T)
        assert coord.is_tuple_open(T)
        permit.release()
        assert_idle(coord)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_timed_closure_outside_any_loop_reopens_on_the_next_loop(backend: str) -> None:
    coord = create_agent_coordinator()
    coord.close_tuple(T, reopen_after=0.05)  # no event loop: time is real time
    assert not coord.is_tuple_open(T)
    remaining = coord.tuple_reopens_at(T)
    assert remaining is not None

    async def main() -> float:
        with anyio.fail_after(5):
            start = anyio.current_time()
            async with coord.permit(T):  # the loop adopts the closure and its timer
                return anyio.current_time() - start

    waited = anyio.run(main, backend=backend)
    assert 0 <= waited <= 0.05 + 1
    assert coord.is_tuple_open(T)
    coord.close_tuple(T)  # without a delay, no loop is needed either
    assert not coord.is_tuple_open(T)


@pytest.mark.parametrize("bad", [-1, math.inf, math.nan, True, "1"])
def test_close_tuple_rejects_bad_reopen_after(bad: Any) -> None:
    coord = create_agent_coordinator()
    with pytest.raises(InvalidArgumentError, match=r"^reopen_after must be"):
        coord.close_tuple(T, reopen_after=bad)
    assert coord.is_tuple_open(T)


# A timed reopen outlives its event loop: a process-global coordinator serves several runs.
SECOND_RUN = pytest.mark.parametrize("second_backend", ["asyncio", "trio"])


def _close_in_a_run(coord: AgentCoordinator, reopen_after: float) -> float:
    """Close ``T`` with a timed reopen inside an asyncio run that then ends; returns the
    earliest ``time.monotonic()`` the reopen may happen at."""

    async def close() -> None:
        coord.close_tuple(T, reopen_after=reopen_after)  # sync: nothing to time out

    earliest = time.monotonic() + reopen_after
    anyio.run(close, backend="asyncio")
    return earliest


@SECOND_RUN
def test_timed_reopen_is_rearmed_on_the_next_event_loop(second_backend: str) -> None:
    coord = create_agent_coordinator(1)
    delay = 0.3
    earliest = _close_in_a_run(coord, delay)

    async def wait_for_the_reopen() -> None:
        with anyio.fail_after(5):
            now = anyio.current_time()
            reopens_at = coord.tuple_reopens_at(T)
            # Restated on this run's clock (trio's starts at a random offset per run).
            assert reopens_at is not None
            assert now < reopens_at <= now + delay
            assert not coord.is_tuple_open(T)
            assert coord.statistics().tuples[0].reopens_at == reopens_at
            granted = anyio.Event()

            async def waiter() -> None:
                async with coord.permit(T):
                    granted.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await wait_all_tasks_blocked()
                assert coord.queued_count == 1
                await granted.wait()
            # asyncio may run a timer up to one clock resolution early.
            assert time.monotonic() >= earliest - 0.05
            assert coord.is_tuple_open(T)
            assert coord.tuple_reopens_at(T) is None
            assert_idle(coord, 1)

    anyio.run(wait_for_the_reopen, backend=second_backend)


@SECOND_RUN
def test_timed_reopen_that_elapsed_between_runs_is_open(second_backend: str) -> None:
    coord = create_agent_coordinator(1)
    earliest = _close_in_a_run(coord, 0.05)
    time.sleep(max(0.0, earliest - time.monotonic()) + 0.01)  # real time has to pass

    async def use_it() -> None:
        with anyio.fail_after(5):
            assert coord.is_tuple_open(T)
            assert coord.tuple_reopens_at(T) is None
            async with coord.permit(T, reject_on_closed_tuple=True):
                assert coord.active_count == 1
            assert_idle(coord, 1)

    anyio.run(use_it, backend=second_backend)


def test_timed_reopen_that_elapsed_is_seen_outside_any_loop() -> None:
    coord = create_agent_coordinator(1)
    earliest = _close_in_a_run(coord, 0.05)
    assert not coord.is_tuple_open(T)  # not yet due: stays closed with no loop to time it
    time.sleep(max(0.0, earliest - time.monotonic()) + 0.01)
    assert coord.is_tuple_open(T)
    assert coord.statistics().tuples == ()


@SECOND_RUN
def test_closing_again_on_the_next_loop_compares_on_its_clock(second_backend: str) -> None:
    coord = create_agent_coordinator(1)
    _close_in_a_run(coord, 60)

    async def close_again() -> None:  # all sync: nothing to time out
        now = anyio.current_time()
        coord.close_tuple(T, reopen_after=1)  # shorter than what remains: ignored
        reopens_at = coord.tuple_reopens_at(T)
        assert reopens_at is not None
        assert now + 59 < reopens_at <= now + 60
        coord.close_tuple(T, reopen_after=120)  # later: replaces it
        assert coord.tuple_reopens_at(T) == pytest.approx(anyio.current_time() + 120, abs=1)
        coord.open_tuple(T)
        assert coord.tuple_reopens_at(T) is None
        assert_idle(coord, 1)

    anyio.run(close_again, backend=second_backend)


# -- lending ---------------------------------------------------------------------------------------


async def test_lend_returns_the_slot_while_waiting() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            child_done = anyio.Event()

            async def parent() -> str:
                child = Holder(coord, "child", log)
                tg.start_soon(child)

                async def wait() -> str:
                    await wait_all_tasks_blocked()
                    permit = current_permit()
                    assert permit is not None
                    assert permit.state == "lent"
                    assert log == ["child"]  # the child got the lent slot
                    assert coord.statistics().lent == 1
                    child.done.set()
                    child_done.set()
                    return "result"

                return await coord.with_lent_permit(wait)

            assert await coord.run(T, parent) == "result"
            assert child_done.is_set()
        assert_idle(coord)


async def test_lend_without_permit_just_waits() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        assert await coord.with_lent_permit(_value(3)) == 3
        async with coord.lending():
            pass
        assert_idle(coord)


def _value(v: int) -> Callable[[], Awaitable[int]]:
    async def wait() -> int:
        return v

    return wait


async def test_lend_reraises_wait_error_after_reacquire() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        async with coord.permit(T) as permit:

            async def wait() -> None:
                raise ValueError("child failed")

            with pytest.raises(ValueError, match="child failed"):
                await permit.lend(wait)
            assert permit.held
        assert_idle(coord)


async def test_overlapping_lends_share_one_slot_and_last_reacquires() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        async with coord.permit(T) as permit:
            first_done = anyio.Event()
            release_second = anyio.Event()
            states: list[str] = []

            async def first() -> None:
                states.append(permit.state)

            async def second() -> None:
                await release_second.wait()

            async def lend_first() -> None:
                await permit.lend(first)
                states.append(permit.state)  # returns while the other lend runs
                first_done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(permit.lend, second)
                await wait_all_tasks_blocked()
                assert (coord.active_count, coord.statistics().lent) == (0, 1)
                tg.start_soon(lend_first)
                await first_done.wait()
                assert states == ["lent", "lent"]
                assert coord.active_count == 0
                release_second.set()
            assert permit.held
            assert coord.active_count == 1
        assert_idle(coord)


async def test_lend_starting_during_a_queued_reacquire_takes_over() -> None:
    """Only the last lend reacquires: a queued reacquire is withdrawn when a lend joins."""
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        permit = await coord.acquire(T)
        async with anyio.create_task_group() as tg:
            other = Holder(coord, "other", log)
            first_returned = anyio.Event()
            second_may_end = anyio.Event()

            async def first() -> None:
                await permit.lend(lambda: spawn(tg, other, granted=True))
                first_returned.set()

            tg.start_soon(first)
            await wait_all_tasks_blocked()
            assert (permit.state, coord.queued_count) == ("lent", 1)  # first reacquires
            tg.start_soon(permit.lend, second_may_end.wait)
            await first_returned.wait()  # withdrawn: it returns without the slot
            assert (permit.state, coord.queued_count, coord.statistics().lent) == ("lent", 0, 1)
            other.done.set()
            await wait_all_tasks_blocked()
            assert coord.active_count == 0  # the lent slot is free; nobody reacquires yet
            second_may_end.set()
        assert permit.held  # the last lend took it back
        permit.release()
        assert_idle(coord)


@ASYNCIO_ONLY
async def test_a_withdrawn_reacquire_cancelled_before_it_resumes_leaves_the_permit() -> None:
    """Found by review: the withdrawn lend's cleanup released what the next lend took back."""
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        permit = await coord.acquire(T)
        first_may_end = anyio.Event()
        first = asyncio.ensure_future(permit.lend(first_may_end.wait))
        await wait_all_tasks_blocked()  # lent: the slot is free ...
        other = await coord.acquire(T)  # ... and taken
        first_may_end.set()
        await wait_all_tasks_blocked()
        assert (permit.state, coord.queued_count) == ("lent", 1)  # first reacquires

        async def second() -> str:
            # This lend withdrew first's reacquire (first is woken without the slot), and
            # first is cancelled before it resumes.
            first.cancel()
            other.release()  # the slot is free: this lend takes it back at once
            return "second"

        assert await permit.lend(second) == "second"
        with pytest.raises(asyncio.CancelledError):
            await first
        assert permit.state == "held"
        permit.release()
        assert_idle(coord)


async def test_a_plain_pair_passed_again_is_the_tuple_already_known() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        async with coord.permit(("p", "pair")) as first:
            assert first.tuple == ModelTuple("p", "pair")
        async with coord.permit(("p", "pair")) as second:
            assert second.tuple is first.tuple  # no new ModelTuple per call
        assert_idle(coord)


async def test_permit_context_manager_is_single_use() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        cm = coord.permit(T)
        async with cm:
            pass
        with pytest.raises(CoordinatorError, match="can be entered only once"):
            await cm.__aenter__()
        assert_idle(coord)


async def test_release_while_wait_runs_returns_result_without_reacquire() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        permit = await coord.acquire(T)

        async def wait() -> str:
            permit.release()
            return "done"

        assert await permit.lend(wait) == "done"
        assert permit.state == "released"
        assert_idle(coord)


async def test_release_during_reacquire_fails_the_lend() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        permit = await coord.acquire(T)
        async with anyio.create_task_group() as tg:
            other = Holder(coord, "other", log)

            async def wait() -> None:
                await spawn(tg, other, granted=True)  # takes the lent slot

            result: list[BaseException] = []

            async def lend() -> None:
                try:
                    await permit.lend(wait)
                except PermitReleasedError as exc:
                    result.append(exc)

            tg.start_soon(lend)
            await wait_all_tasks_blocked()
            assert permit.state == "lent"
            assert coord.queued_count == 1  # the reacquire
            permit.release()
            await wait_all_tasks_blocked()
            assert [str(e) for e in result] == ["Agent permit released while waiting to reacquire"]
            other.done.set()
        assert_idle(coord)


async def test_release_after_reacquire_grant_before_resume_fails_the_lend() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        permit = await coord.acquire(T)
        async with anyio.create_task_group() as tg:
            other = Holder(coord, "other", log)

            async def wait() -> None:
                await spawn(tg, other, granted=True)

            outcome: list[object] = []

            async def lend() -> None:
                try:
                    await permit.lend(wait)
                    outcome.append("returned")
                except PermitReleasedError:
                    outcome.append("released")

            tg.start_soon(lend)
            await wait_all_tasks_blocked()
            assert other.permit is not None
            other.permit.release()  # grants the reacquire synchronously
            assert permit.state == "held"
            permit.release()  # ... and the permit is released before the lend resumed
            assert coord.active_count == 0
            await wait_all_tasks_blocked()
            assert outcome == ["released"]
            other.done.set()
        assert_idle(coord)


async def test_cancel_during_reacquire_releases_the_permit() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        permit = await coord.acquire(T)
        async with anyio.create_task_group() as tg:
            other = Holder(coord, "other", log)
            scope = anyio.CancelScope()
            cancelled: list[bool] = []

            async def lend() -> None:
                with scope:
                    await permit.lend(lambda: spawn(tg, other, granted=True))
                cancelled.append(scope.cancelled_caught)

            tg.start_soon(lend)
            await wait_all_tasks_blocked()
            assert coord.queued_count == 1
            scope.cancel()
            await wait_all_tasks_blocked()
            assert cancelled == [True]
            assert permit.state == "released"
            assert coord.statistics().lent == 0
            other.done.set()
        assert_idle(coord)


async def test_cancel_after_reacquire_grant_hands_the_slot_on() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        permit = await coord.acquire(T)
        async with anyio.create_task_group() as tg:
            other = Holder(coord, "other", log)
            scope = anyio.CancelScope()

            async def lend() -> None:
                with scope:
                    await permit.lend(lambda: spawn(tg, other, granted=True))

            tg.start_soon(lend)
            await wait_all_tasks_blocked()
            third = await start(tg, Holder(coord, "third", log))
            assert other.permit is not None
            scope.cancel()  # the cancellation is on its way to the reacquire ...
            other.permit.release()  # ... when it is granted (order 3 < third's 4)
            assert permit.held
            await wait_all_tasks_blocked()
            assert permit.state == "released"
            assert log == ["other", "third"]
            third.done.set()
            other.done.set()
        assert_idle(coord)


async def test_reacquire_bypasses_closed_gate_and_cap() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(2)
        coord.set_tuple_limit(T, 1)
        async with coord.permit(T) as permit:

            async def wait() -> None:
                coord.close_tuple(T)

            await permit.lend(wait)
            assert permit.held
            assert not coord.is_tuple_open(T)
        coord.open_tuple(T)
        coord.set_tuple_limit(T, None)
        assert_idle(coord)


@pytest.mark.parametrize(("mode", "expected"), [("fresh", ["w", "p"]), ("original", ["p", "w"])])
async def test_reacquire_order_follows_config(mode: str, expected: list[str]) -> None:
    with anyio.fail_after(5):
        config = CoordinatorConfig(max_concurrency=1, reacquire=mode)
        coord = create_agent_coordinator(config=config)
        log: list[str] = []
        permit = await coord.acquire(T)  # order 1
        async with anyio.create_task_group() as tg:
            blocker = Holder(coord, "blocker", log)
            waiter = Holder(coord, "w", log)

            async def wait() -> None:
                await spawn(tg, blocker, granted=True)  # order 2, takes the lent slot
                await spawn(tg, waiter)  # order 3, waits

            async def lend() -> None:
                await permit.lend(wait)  # reacquire: order 4 (fresh) or 1 (original)
                log.append("p")
                permit.release()

            tg.start_soon(lend)
            await wait_all_tasks_blocked()
            blocker.done.set()
            await wait_all_tasks_blocked()
            waiter.done.set()
        assert log[1:] == expected
        assert_idle(coord)


async def test_lending_context_manager() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        async with coord.permit(T) as permit:
            async with coord.lending():
                assert permit.state == "lent"
                assert coord.active_count == 0
            assert permit.held
            with pytest.raises(KeyError):
                async with coord.lending():
                    raise KeyError("x")
            assert permit.held
        assert_idle(coord)


async def test_lend_on_released_permit_just_waits() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        permit = await coord.acquire(T)
        permit.release()
        assert await permit.lend(_value(7)) == 7
        assert_idle(coord)


# -- reservations ----------------------------------------------------------------------------------


async def test_reservation_is_inactive_until_activated() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        reservation = coord.reserve(T)
        assert reservation.acceptance_order == 1
        assert (coord.active_count, coord.queued_count) == (0, 1)
        assert repr(reservation).endswith("order=1 inactive>")
        later = await coord.acquire(T)  # skips the inactive reservation
        later.release()
        reservation.activate()
        assert (coord.active_count, coord.queued_count) == (1, 0)  # granted, unrun
        reservation.activate()  # no-op now

        async def work() -> str:
            permit = current_permit()
            assert permit is not None
            assert permit.acceptance_order == 1
            assert repr(reservation).endswith("running>")
            assert repr(permit) == "<AgentPermit openai/gpt order=1 held>"
            return "ran"

        assert await reservation.run(work) == "ran"
        with pytest.raises(
            ReservationUsedError, match=r"^Agent reservation has already been used$"
        ):
            await reservation.run(work)
        assert_idle(coord)


async def test_activated_reservation_beats_later_work() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        log: list[str] = []
        async with anyio.create_task_group() as tg:
            a = await start(tg, Holder(coord, "a", log))
            reservation = coord.reserve(T)  # order 2
            await start(tg, Holder(coord, "b", log))  # order 3
            reservation.activate()
            a.done.set()
            await wait_all_tasks_blocked()
            assert log == ["a"]
            assert coord.active_count == 1  # the reservation holds it, unrun
            reservation.cancel()  # the unused slot goes on
            await wait_all_tasks_blocked()
            assert log == ["a", "b"]
            with pytest.raises(ReservationCancelledError, match=r"^Agent reservation cancelled$"):
                await reservation.run(_noop)
            tg.cancel_scope.cancel()
        assert_idle(coord)


async def test_reservation_cancel_while_queued_with_reason() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        blocker = await coord.acquire(T)
        reservation = coord.reserve(T)
        async with anyio.create_task_group() as tg:
            errors: list[BaseException] = []

            async def run() -> None:
                try:
                    await reservation.run(_noop)
                except LookupError as exc:
                    errors.append(exc)

            tg.start_soon(run)
            await wait_all_tasks_blocked()
            reason = LookupError("stopped")
            reservation.cancel(reason)
            reservation.cancel()  # no-op
            await wait_all_tasks_blocked()
            assert errors == [reason]
        blocker.release()
        assert_idle(coord)


async def test_reservation_cancelled_before_run_raises_default_error() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        reservation = coord.reserve(T)
        reservation.cancel()
        assert coord.queued_count == 0
        with pytest.raises(ReservationCancelledError):
            await reservation.run(_noop)
        with pytest.raises(ReservationUsedError):
            await reservation.run(_noop)


async def test_reservation_run_cancelled_while_queued_and_after_grant() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        blocker = await coord.acquire(T)
        queued = coord.reserve(T)
        granted = coord.reserve(T)
        after = coord.reserve(T)
        ran: list[str] = []
        async with anyio.create_task_group() as tg:
            s1, s2 = anyio.CancelScope(), anyio.CancelScope()

            async def run(scope: anyio.CancelScope, r: Any, name: str) -> None:
                async def work() -> None:
                    ran.append(name)

                with scope:
                    await r.run(work)

            tg.start_soon(run, s1, queued, "queued")
            await wait_all_tasks_blocked()
            s1.cancel()  # cancelled while queued: removed
            await wait_all_tasks_blocked()
            assert coord.queued_count == 2
            tg.start_soon(run, s2, granted, "granted")
            await wait_all_tasks_blocked()
            after.activate()
            s2.cancel()  # the cancellation is on its way to `granted` ...
            blocker.release()  # ... when it is granted: the slot goes on to `after`
            assert coord.active_count == 1
            await wait_all_tasks_blocked()
            assert s2.cancelled_caught
            assert ran == []
            assert coord.active_count == 1  # held by `after`, granted but unrun
            assert await after.run(_value(1)) == 1
        assert_idle(coord)


# -- observing -------------------------------------------------------------------------------------


async def test_statistics_and_subscribe() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(2)
        seen: list[CoordinatorStatistics] = []
        got = anyio.Event()

        def callback(stats: CoordinatorStatistics) -> None:
            seen.append(stats)
            got.set()

        unsubscribe = coord.subscribe(callback)
        coord.set_max_concurrency(3)
        coord.close_tuple(T)
        assert seen == []  # never inside the scheduling call
        await got.wait()
        assert seen[-1].max_concurrency == 3  # a burst: the latest state
        assert not seen[-1].tuples[0].open
        coord.open_tuple(T)
        unsubscribe()
        assert coord.statistics() == CoordinatorStatistics(3, 0, 0, 0, 0, ())
        assert "0/3 active" in repr(coord)


async def test_subscribe_callbacks_run_in_the_subscribers_context() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(2)
        seen: list[AgentPermit | None] = []
        got = anyio.Event()

        def callback(stats: CoordinatorStatistics) -> None:
            seen.append(current_permit())
            got.set()

        async with coord.permit(T) as permit:
            unsubscribe = coord.subscribe(callback)  # subscribed under the permit
        coord.set_max_concurrency(3)  # notified, and delivered, outside it
        await got.wait()
        assert seen[-1] is permit
        assert current_permit() is None
        unsubscribe()
        assert_idle(coord, 3)


async def test_watch_yields_current_then_changes() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(2)
        iterator = coord.watch()
        first = await iterator.__anext__()
        assert first.active == 0
        permit = await coord.acquire(T)
        assert (await iterator.__anext__()).active == 1
        permit.release()
        await iterator.aclose()


async def test_watch_is_an_async_generator_for_aclosing() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(2)
        seen: list[int] = []
        permit: AgentPermit | None = None
        async with contextlib.aclosing(coord.watch()) as updates:
            async for statistics in updates:
                seen.append(statistics.active)
                if statistics.active == 1:
                    break  # leaving early: aclosing closes the generator
                permit = await coord.acquire(T)
        assert seen == [0, 1]
        with pytest.raises(StopAsyncIteration):  # closed when the block was left
            await anext(updates)
        assert permit is not None
        permit.release()
        assert_idle(coord, 2)


def test_resident_count_is_published() -> None:
    coord = create_agent_coordinator()

    class Resident:
        def stop(self) -> None:
            pass

        def dispose(self) -> None:
            pass

    unbind = coord.bind_resident("task", Resident())
    assert coord.resident_count == 1
    assert coord.statistics().residents == 1
    unbind()
    assert coord.resident_count == 0


# -- cancellation injected everywhere -----------------------------------------------------------


async def _checkpoints(n: int = 2) -> None:
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


async def _op_acquire(coord: AgentCoordinator) -> None:
    permit = await coord.acquire(T)
    try:
        await _checkpoints()
    finally:
        permit.release()


async def _op_permit(coord: AgentCoordinator) -> None:
    async with coord.permit(T):
        await _checkpoints()


async def _op_run(coord: AgentCoordinator) -> None:
    await coord.run(T, _checkpoints)


async def _op_lend(coord: AgentCoordinator) -> None:
    async def work() -> None:
        await coord.with_lent_permit(lambda: _checkpoints(3))
        await _checkpoints()

    await coord.run(T, work)


async def _op_overlapping_lends(coord: AgentCoordinator) -> None:
    async def work() -> None:
        async with anyio.create_task_group() as tg:
            for n in (1, 3):
                tg.start_soon(coord.with_lent_permit, lambda n=n: _checkpoints(n))
        async with coord.lending():
            await _checkpoints()

    await coord.run(T, work)


async def _op_reservation(coord: AgentCoordinator) -> None:
    reservation = coord.reserve(T)
    try:
        await reservation.run(_checkpoints)
    finally:
        reservation.cancel()  # a no-op unless it never ran


OPS: dict[str, Callable[[AgentCoordinator], Awaitable[None]]] = {
    "acquire": _op_acquire,
    "permit": _op_permit,
    "run": _op_run,
    "lend": _op_lend,
    "overlapping-lends": _op_overlapping_lends,
    "reservation": _op_reservation,
}


async def _short_worker(coord: AgentCoordinator) -> None:
    async with coord.permit(T):
        await _checkpoints()


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("cancel_after", range(9))
async def test_cancellation_at_any_point_never_leaks(op: str, cancel_after: int) -> None:
    """Cancel the operation after ``cancel_after`` scheduling steps, wherever it is."""
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        blocker = await coord.acquire(T)
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def target() -> None:
                with scope:
                    await OPS[op](coord)

            tg.start_soon(target)
            tg.start_soon(_short_worker, coord)
            for step in range(cancel_after):
                await anyio.lowlevel.checkpoint()
                if step == 1:
                    blocker.release()
            scope.cancel()
            blocker.release()
        coord._scheduler.check_invariants()
        assert_idle(coord)


@ASYNCIO_ONLY
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("cancel_after", range(12))
async def test_native_cancellation_at_any_point_never_leaks(op: str, cancel_after: int) -> None:
    """asyncio's task.cancel() also lands between a grant and the waiter's resumption."""
    async with asyncio.timeout(5):
        coord = create_agent_coordinator(1)
        blocker = await coord.acquire(T)
        target = asyncio.ensure_future(OPS[op](coord))
        worker = asyncio.ensure_future(_short_worker(coord))
        for step in range(cancel_after):
            await asyncio.sleep(0)
            if step == 1:
                blocker.release()
        target.cancel()
        blocker.release()
        await asyncio.gather(target, worker, return_exceptions=True)
        assert worker.exception() is None
        coord._scheduler.check_invariants()
        assert_idle(coord)


@pytest.mark.parametrize("seed", range(6))
async def test_random_fleet_with_cancellations_and_knob_churn(seed: int) -> None:
    """Many tasks doing every operation, cancelled at random points, while the limits and
    gates change underneath: at the end nothing is leaked and the invariants hold."""
    rng = random.Random(seed)
    tuples = [T, ModelTuple(*U), ModelTuple("local", "llama")]
    with anyio.fail_after(20):
        coord = create_agent_coordinator(2)

        async def checkpoints() -> None:
            await _checkpoints(rng.randint(0, 3))

        async def op(t: ModelTuple, kind: int, reject: bool) -> None:
            if kind == 0:
                async with coord.permit(t, reject_on_closed_tuple=reject):
                    await checkpoints()
            elif kind == 1:

                async def work() -> None:
                    await coord.with_lent_permit(checkpoints)
                    async with coord.lending():
                        await checkpoints()

                await coord.run(t, work, reject_on_closed_tuple=reject)
            elif kind == 4:
                async with coord.request(
                    t, tokens=rng.randint(0, 50), reject_on_closed_tuple=reject
                ) as call:
                    await checkpoints()
                    call.settle(rng.randint(0, 50))
            elif kind == 5:  # an agent fanning out model calls, lending while it waits
                async with coord.permit(t, reject_on_closed_tuple=reject):

                    async def fanned(u: ModelTuple) -> None:
                        async with coord.request(u, tokens=rng.randint(0, 20)):
                            await checkpoints()

                    async with anyio.create_task_group() as calls:
                        for _ in range(rng.randint(1, 4)):
                            calls.start_soon(fanned, rng.choice(tuples))
                        await coord.with_lent_permit(checkpoints)
            else:
                reservation = coord.reserve(t, reject_on_closed_tuple=reject)
                try:
                    if kind == 3:
                        reservation.activate()
                        await checkpoints()
                    await reservation.run(checkpoints)
                finally:
                    reservation.cancel()

        async def agent() -> None:
            t, kind, reject = rng.choice(tuples), rng.randrange(6), rng.random() < 0.3
            steps = rng.randint(0, 12)
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as inner:

                    async def cancel_later() -> None:
                        await _checkpoints(steps)
                        scope.cancel()

                    inner.start_soon(cancel_later)
                    with contextlib.suppress(TupleSuspendedError):
                        await op(t, kind, reject)
                    inner.cancel_scope.cancel()

        async def chaos() -> None:
            for _ in range(60):
                await _checkpoints(rng.randint(1, 4))
                t = rng.choice(tuples)
                action = rng.randrange(6)
                if action == 4:
                    coord.set_budget(
                        t,
                        requests_per_minute=rng.choice([None, 60.0, 6000.0]),
                        tokens_per_minute=rng.choice([None, 600.0, 60000.0]),
                    )
                elif action == 5:
                    coord.learn_budget(
                        t, tokens_per_minute=6000.0, tokens_remaining=rng.randint(0, 40)
                    )
                elif action == 0:
                    coord.close_tuple(t)
                elif action == 1:
                    coord.open_tuple(t)
                elif action == 2:
                    coord.set_max_concurrency(rng.randint(1, 4))
                else:
                    coord.set_tuple_limit(t, rng.choice([None, 1, 2]))
                coord._scheduler.check_invariants()

        async with anyio.create_task_group() as tg:
            tg.start_soon(chaos)
            for _ in range(150):
                tg.start_soon(agent)
            await _checkpoints(400)
            for t in tuples:  # let every parked agent finish
                coord.open_tuple(t)
                coord.set_tuple_limit(t, None)
                coord.set_budget(t)
        coord._scheduler.check_invariants()
        assert_idle(coord)


# -- issue 9: every way users combine it holds ------------------------------------------------


async def test_cancel_of_a_reservation_whose_run_started_is_a_no_op() -> None:
    # Regression: cancel() during the run's lend failed the reacquire and released the
    # permit while the work ran on.
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        reservation = coord.reserve(T)
        lending = anyio.Event()
        resume = anyio.Event()

        async def work() -> str:
            async def wait_for_child() -> None:
                lending.set()
                await resume.wait()

            await coord.with_lent_permit(wait_for_child)
            permit = current_permit()
            assert permit is not None
            assert permit.held
            return "done"

        async with anyio.create_task_group() as tg:
            blocker_granted = anyio.Event()
            release_blocker = anyio.Event()

            async def blocker() -> None:
                await lending.wait()
                async with coord.permit(T):  # takes the lent slot
                    blocker_granted.set()
                    await release_blocker.wait()

            result: list[str] = []

            async def runner() -> None:
                result.append(await reservation.run(work))

            tg.start_soon(blocker)
            tg.start_soon(runner)
            await blocker_granted.wait()
            resume.set()
            await wait_all_tasks_blocked()  # the work waits to reacquire
            assert coord.queued_count == 1
            reservation.cancel()  # the run started: nothing happens
            reservation.cancel(RuntimeError("ignored"))
            assert coord.queued_count == 1
            release_blocker.set()
        assert result == ["done"]
        assert_idle(coord)


def test_huge_and_foreign_numbers_follow_one_rule() -> None:
    np = pytest.importorskip("numpy")
    coord = create_agent_coordinator(np.int64(2))
    assert coord.max_concurrency == 2
    assert type(coord.max_concurrency) is int
    coord.set_max_concurrency(np.int32(3))
    coord.set_tuple_limit(T, np.int64(1))
    assert coord.statistics().tuples[0].limit == 1
    with pytest.raises(InvalidArgumentError, match=r"^reopen_after must be"):
        coord.close_tuple(T, reopen_after=10**400)  # never a bare OverflowError
    with pytest.raises(InvalidArgumentError, match=r"^reopen_after must be"):
        coord.close_tuple(T, reopen_after=np.float64("nan"))
    assert coord.is_tuple_open(T)  # nothing changed
    coord.close_tuple(T, reopen_after=np.float64(30.0))
    coord.close_tuple(T, reopen_after=fractions.Fraction(1, 2))  # type: ignore[arg-type]
    assert not coord.is_tuple_open(T)
    with pytest.raises(InvalidArgumentError, match="max_concurrency must be a positive integer"):
        coord.set_max_concurrency(np.bool_(True))
    with pytest.raises(InvalidArgumentTypeError):
        coord.set_max_concurrency(True)
    assert coord.max_concurrency == 3
    for bad in (np.float64(2.0), 2.0, "2"):
        with pytest.raises(InvalidArgumentTypeError):
            coord.reserve(T, acceptance_order=bad)  # type: ignore[arg-type]
    reservation = coord.reserve(T, acceptance_order=np.int64(2**62))
    assert reservation.acceptance_order == 2**62
    assert type(reservation.acceptance_order) is int
    coord.reserve(T, acceptance_order=10**30)  # Python's ints have no bound
    assert coord.next_acceptance_order() == 10**30 + 1


async def test_callables_are_checked_before_anything_happens() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        order = coord.next_acceptance_order()
        with pytest.raises(InvalidArgumentTypeError, match=r"^work must be a callable"):
            await coord.run(T, None)  # type: ignore[arg-type]
        assert coord.next_acceptance_order() == order + 1  # no order drawn for the bad call
        with pytest.raises(InvalidArgumentTypeError, match=r"^callback must be callable$"):
            coord.subscribe(None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentTypeError, match=r"^wait must be a callable"):
            await coord.with_lent_permit(None)  # type: ignore[arg-type]
        reservation = coord.reserve(T)
        with pytest.raises(InvalidArgumentTypeError, match=r"^work must be a callable"):
            await reservation.run("work")  # type: ignore[arg-type]
        assert await reservation.run(_value(7)) == 7  # still usable
        async with coord.permit(T) as permit:
            with pytest.raises(InvalidArgumentTypeError, match=r"^wait must be a callable"):
                await permit.lend(42)  # type: ignore[arg-type]
            assert permit.held
        assert_idle(coord)


def test_configs_are_checked_by_every_entry_point_and_again_by_the_coordinator() -> None:
    with pytest.raises(InvalidArgumentError, match="greater than or equal to 1"):
        CoordinatorConfig().model_copy(update={"max_concurrency": 0})
    assert CoordinatorConfig().model_copy(update={"max_concurrency": 2}).max_concurrency == 2
    constructed = CoordinatorConfig.model_construct(max_concurrency=0)  # skips validation
    with pytest.raises(InvalidArgumentError, match="greater than or equal to 1"):
        create_agent_coordinator(config=constructed)
    config = CoordinatorConfig.model_validate_strings(
        {"max_concurrency": "3", "max_queued": "0", "reacquire": "original"}
    )
    assert (config.max_concurrency, config.max_queued, config.reacquire) == (3, 0, "original")
    with pytest.raises(InvalidArgumentError, match="max_concurrency"):
        CoordinatorConfig.model_validate_strings({"max_concurrency": "zero"})


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_subscriber_raising_a_base_exception_never_kills_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Regression: on trio, a BaseException from a callback crashed the run with
    # TrioInternalError.
    class Abort(BaseException):
        pass

    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        delivered = anyio.Event()

        def hostile(_: CoordinatorStatistics) -> None:
            delivered.set()
            raise Abort("a framework's abort")

        coord.subscribe(hostile)
        with caplog.at_level(logging.ERROR, logger="lovely_coordinator"):
            coord.set_max_concurrency(2)
            await delivered.wait()
            await wait_all_tasks_blocked()
        assert any(record.exc_info and record.exc_info[0] is Abort for record in caplog.records)


async def test_statistics_and_gate_reads_are_pure() -> None:
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        coord.close_tuple(T, reopen_after=0)  # due at once: reads see it open ...
        version = coord._scheduler.version
        armed = coord._core._timer.armed_at
        assert coord.is_tuple_open(T)
        assert coord.tuple_reopens_at(T) is None
        assert coord.statistics().tuples == ()
        assert coord._scheduler.version == version  # ... but changed nothing
        assert coord._core._timer.armed_at == armed
        async with coord.permit(T):  # the timer has run by now, or runs on the way
            pass
        assert_idle(coord)


# -- threads: the process-global coordinator serves event loops in several threads -----------


def _in_thread(fn: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("other_backend", ["asyncio", "trio"])
async def test_a_grant_crosses_to_a_waiter_on_another_threads_loop(other_backend: str) -> None:
    # Regression: a second thread's loop hung forever and leaked the slot.
    with anyio.fail_after(10):
        coord = create_agent_coordinator(1)
        holder = await coord.acquire(T)
        log: list[str] = []
        parked = threading.Event()

        async def other() -> None:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:

                    async def watch_it_park() -> None:
                        await wait_all_tasks_blocked()
                        parked.set()

                    tg.start_soon(watch_it_park)
                    async with coord.permit(T) as permit:
                        log.append(f"granted {permit.acceptance_order}")
                        assert coord.active_count == 1

        thread = _in_thread(lambda: anyio.run(other, backend=other_backend))
        await anyio.to_thread.run_sync(parked.wait, abandon_on_cancel=True)
        assert coord.queued_count == 1
        later = anyio.Event()

        async def after_it() -> None:  # queued behind the other thread's waiter
            async with coord.permit(T):
                log.append("main again")
                later.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(after_it)
            await wait_all_tasks_blocked()
            holder.release()  # granted to the other thread's waiter, in order
            await later.wait()
        await anyio.to_thread.run_sync(thread.join)
        assert log == ["granted 2", "main again"]
        assert_idle(coord)


@pytest.mark.parametrize("other_backend", ["asyncio", "trio"])
async def test_a_waiter_cancelled_on_another_thread_leaks_nothing(other_backend: str) -> None:
    with anyio.fail_after(10):
        coord = create_agent_coordinator(1)
        holder = await coord.acquire(T)
        done = threading.Event()

        async def other() -> None:
            with anyio.move_on_after(0.2):  # real time: the wait is cancelled
                async with coord.permit(T):
                    raise AssertionError("never granted")
            done.set()

        thread = _in_thread(lambda: anyio.run(other, backend=other_backend))
        await anyio.to_thread.run_sync(done.wait, 10.0)
        await anyio.to_thread.run_sync(thread.join)
        assert coord.queued_count == 0
        holder.release()
        assert_idle(coord)


def test_many_threads_share_the_cap_fairly() -> None:
    coord = create_agent_coordinator(2)
    peak = [0]
    inside = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    async def agent() -> None:
        for _ in range(20):
            async with coord.permit(T):
                with lock:
                    inside[0] += 1
                    peak[0] = max(peak[0], inside[0])
                await anyio.lowlevel.checkpoint()
                with lock:
                    inside[0] -= 1

    def run(backend: str) -> None:
        try:
            anyio.run(agent, backend=backend)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [_in_thread(functools.partial(run, ("asyncio", "trio")[i % 2])) for i in range(6)]
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert peak[0] <= 2
    assert_idle(coord)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_timed_reopen_armed_from_another_thread_runs_on_the_home_loop() -> None:
    with anyio.fail_after(10):
        coord = create_agent_coordinator(1)
        async with coord.permit(T):  # this loop is home
            pass

        def close_from_a_thread() -> None:
            async def close() -> None:
                coord.close_tuple(T, reopen_after=0.05)

            anyio.run(close)

        await anyio.to_thread.run_sync(close_from_a_thread)
        assert not coord.is_tuple_open(T)
        async with coord.permit(T):  # waits for the reopen, timed on this loop
            assert coord.is_tuple_open(T)
        assert_idle(coord)


@pytest.mark.parametrize("home_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("wakeup", ["reopen", "budget"])
async def test_a_wakeup_survives_the_end_of_a_home_loop_in_another_thread(
    home_backend: str, wakeup: str
) -> None:
    """Found by review: the timer died with its loop, and a waiter here waited forever."""
    with anyio.fail_after(10):
        coord = create_agent_coordinator(1)
        armed = threading.Event()
        may_end = threading.Event()

        async def home() -> None:  # this thread's loop becomes home and arms the timer
            if wakeup == "reopen":
                coord.close_tuple(T, reopen_after=0.3)
            else:
                coord.set_budget(T, requests_per_minute=300)  # one every 0.2 s
                while (entry := coord.tuple_statistics(T)) and entry.requests_available >= 1:  # type: ignore[operator]
                    async with coord.request(T):
                        pass
            armed.set()
            await anyio.to_thread.run_sync(may_end.wait)

        thread = _in_thread(lambda: anyio.run(home, backend=home_backend))
        await anyio.to_thread.run_sync(armed.wait)
        done = anyio.Event()

        async def waiter() -> None:
            async with coord.request(T):
                pass
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await wait_all_tasks_blocked()
            assert coord.queued_count == 1
            may_end.set()
            await anyio.to_thread.run_sync(thread.join)  # home ended with the timer pending
            await done.wait()  # this loop took the timer over
        assert_idle(coord)


@pytest.mark.parametrize("home_backend", ["asyncio", "trio"])
async def test_a_wakeup_armed_after_a_waiter_parked_survives_the_end_of_its_home_loop(
    home_backend: str,
) -> None:
    """Found by review: only a loop that used the coordinator while a wake-up existed
    took the timer over; a waiter parked before it (here: before the tuple closed with
    a reopen time) waited forever once the home loop ended."""
    with anyio.fail_after(10):
        coord = create_agent_coordinator(1)
        holding = threading.Event()
        may_end = threading.Event()

        async def home() -> None:
            async with coord.permit(T):  # this loop is home; the waiter queues for the slot
                holding.set()
                await anyio.to_thread.run_sync(may_end.wait)
                coord.close_tuple(T, reopen_after=0.05)  # the first wake-up: a timer here

        thread = _in_thread(lambda: anyio.run(home, backend=home_backend))
        await anyio.to_thread.run_sync(holding.wait)
        done = anyio.Event()

        async def waiter() -> None:
            async with coord.permit(T):
                pass
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await wait_all_tasks_blocked()
            assert coord.queued_count == 1
            may_end.set()
            await anyio.to_thread.run_sync(thread.join)  # home ended with the timer pending
            await done.wait()  # this loop took the timer over
        assert_idle(coord)


async def test_a_wakeup_armed_while_asyncio_run_cancels_its_tasks_survives() -> None:
    """Found by review: a timer armed by a task's cleanup while ``asyncio.run()`` cancels
    every task was never cancelled (it missed the cancel), so its loss went unseen: the
    waiter here waited forever (and asyncio logged "Task was destroyed but it is pending")."""
    with anyio.fail_after(10):
        coord = create_agent_coordinator(1)
        armed = threading.Event()
        may_end = threading.Event()

        async def home() -> None:
            coord.set_budget(T, tokens_per_minute=600)
            async with coord.request(T, tokens=600):  # empty now: refilled 10 a second
                pass
            coord.close_tuple(T)  # the waiter waits for the gate: no timer yet

            async def cleanup() -> None:
                try:
                    await asyncio.sleep(3600)
                finally:  # runs while asyncio.run() cancels the tasks left at its end
                    coord.open_tuple(T)  # the waiter now waits for the budget: a timer

            task = asyncio.get_running_loop().create_task(cleanup())
            armed.set()
            await asyncio.to_thread(may_end.wait)
            assert not task.done()

        thread = _in_thread(lambda: asyncio.run(home()))
        await anyio.to_thread.run_sync(armed.wait)
        done = anyio.Event()

        async def waiter() -> None:
            async with coord.request(T, tokens=1):
                pass
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await wait_all_tasks_blocked()
            assert coord.queued_count == 1
            may_end.set()
            await anyio.to_thread.run_sync(thread.join)
            await done.wait()  # this loop took the wake-up over
        assert_idle(coord)


async def test_a_timer_that_fires_before_its_instant_arms_again() -> None:
    """Found by review: a stale timer (its cancel, sent from another thread, had not
    arrived) firing before the instant left the wake-up with no timer at all."""
    with anyio.fail_after(10):
        coord = create_agent_coordinator(1)
        coord.close_tuple(T, reopen_after=0.05)
        done = anyio.Event()

        async def waiter() -> None:
            async with coord.permit(T):
                pass
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await wait_all_tasks_blocked()
            timer = coord._core._timer
            assert timer._handle is not None
            timer._handle.cancel()
            timer._due()  # fires early: nothing is due yet
            assert timer.armed_at is not None  # armed again for the reopen
            await done.wait()
        assert_idle(coord)


def test_tuple_statistics_is_one_entry_of_statistics() -> None:
    coord = create_agent_coordinator(2)
    assert coord.tuple_statistics(T) is None
    coord.set_tuple_limit(T, 1)
    coord.set_budget(U, tokens_per_minute=100)
    for t in (T, U):
        entry = coord.tuple_statistics(t)
        assert entry is not None
        assert entry == next(e for e in coord.statistics().tuples if e.tuple == t)
    with pytest.raises(InvalidArgumentError):
        coord.tuple_statistics(("", "x"))

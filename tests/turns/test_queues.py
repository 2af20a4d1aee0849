"""TurnRegistry: per-conversation turn queues on asyncio and trio (CONTRACT §3)."""

from __future__ import annotations

import contextvars
import dataclasses
import gc
import math
import random
import re
import tracemalloc
from collections.abc import Awaitable, Callable
from fractions import Fraction
from typing import get_args

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked
from trio.testing import MockClock

import lovely_coordinator._turns.types as turns_types
import lovely_coordinator.turns as turns_module
from lovely_coordinator import CoordinatorError, InvalidArgumentError, InvalidArgumentTypeError
from lovely_coordinator._base.errors import UsageError
from lovely_coordinator._turns.types import RELEASE_TIMEOUT
from lovely_coordinator.turns import (
    DEFAULT_MAX_QUEUED,
    ConversationBusyError,
    CoordinationUnavailableError,
    DrainingError,
    Job,
    Lease,
    LeaseLostError,
    Multitask,
    QueueFullError,
    TurnDropped,
    TurnInterrupted,
    TurnRegistry,
    TurnStatistics,
)

pytestmark = pytest.mark.anyio

Turn = Callable[[int], Awaitable[object]]


class Recorder:
    """Turn bodies that log what they do and assert that no two of them ever overlap."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.fences: dict[str, int] = {}
        self.active = 0

    def turn(
        self,
        name: str,
        gate: anyio.Event | None = None,
        *,
        result: object = None,
        error: Exception | None = None,
    ) -> Turn:
        async def run(fence: int) -> object:
            assert self.active == 0, f"{name} overlaps another turn"
            self.active += 1
            self.fences[name] = fence
            self.log.append(f"start {name}")
            try:
                if gate is None:
                    await anyio.lowlevel.checkpoint()
                else:
                    await gate.wait()
                if error is not None:
                    raise error
                return result
            finally:
                self.log.append(f"end {name}")
                self.active -= 1

        return run

    def dequeue(self, name: str) -> Callable[[], None]:
        return lambda: self.log.append(f"dequeue {name}")

    def refused(self, name: str) -> Callable[[BaseException], None]:
        return lambda error: self.log.append(f"refused {name} {type(error).__name__}")


async def forever(fence: int) -> None:
    await anyio.sleep_forever()


class FakeLease:
    def __init__(self, locker: GrantingLocker, conversation_id: str, fence: int) -> None:
        self.locker = locker
        self.conversation_id = conversation_id
        self.fence = fence
        self.lost = anyio.Event()
        self.released = False

    async def release(self) -> None:
        # A real release talks to a server: a checkpoint, which must not cancel it.
        await anyio.lowlevel.checkpoint()
        if not self.released:
            self.released = True
            self.locker.log.append(f"release {self.conversation_id} {self.fence}")
            self.locker.locks[self.conversation_id].release()


class GrantingLocker:
    """One holder per conversation at a time (waiters queue), fences 1, 2, 3, ..."""

    def __init__(self, log: list[str] | None = None) -> None:
        self.log: list[str] = [] if log is None else log
        self.locks: dict[str, anyio.Lock] = {}
        self.fences: dict[str, int] = {}
        self.leases: list[FakeLease] = []
        self.granted = anyio.Event()

    async def acquire(self, conversation_id: str) -> FakeLease:
        self.log.append(f"acquire {conversation_id}")
        lock = self.locks.setdefault(conversation_id, anyio.Lock())
        await lock.acquire()
        fence = self.fences[conversation_id] = self.fences.get(conversation_id, 0) + 1
        lease = FakeLease(self, conversation_id, fence)
        self.leases.append(lease)
        self.log.append(f"grant {conversation_id} {fence}")
        self.granted.set()
        return lease


class FailingLocker:
    def __init__(self) -> None:
        self.attempts = 0

    async def acquire(self, conversation_id: str) -> Lease:
        self.attempts += 1
        await anyio.lowlevel.checkpoint()
        raise ConnectionError("redis is down")


class BlockingLocker:
    """Never grants; records how many acquisitions were cancelled."""

    def __init__(self) -> None:
        self.waiting = 0
        self.cancelled = 0

    async def acquire(self, conversation_id: str) -> Lease:
        self.waiting += 1
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        finally:
            self.waiting -= 1
        raise AssertionError("unreachable")


# -- the public surface ------------------------------------------------------------------


def test_public_names() -> None:
    assert turns_module.__all__ == sorted(turns_module.__all__)
    assert set(turns_module.__all__) == {
        "ConversationBusyError",
        "CoordinationUnavailableError",
        "DEFAULT_MAX_QUEUED",
        "DrainingError",
        "Job",
        "Lease",
        "LeaseLostError",
        "LeaseSignal",
        "Locker",
        "Multitask",
        "QueueFullError",
        "TurnDropped",
        "TurnInterrupted",
        "TurnRegistry",
        "TurnStatistics",
    }
    assert get_args(Multitask) == ("enqueue", "reject", "interrupt", "replace_queued")


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (QueueFullError, "too many turns are already queued for this conversation"),
        (DrainingError, "this server is shutting down; retry the turn"),
        (
            CoordinationUnavailableError,
            "this conversation could not be locked across server replicas; retry the turn shortly",
        ),
        (ConversationBusyError, "a turn is already running or queued for this conversation"),
        (TurnInterrupted, "the turn was interrupted before it finished"),
        (TurnDropped, "the turn was dropped before it started"),
        (LeaseLostError, "the conversation's lease was lost while the turn was running"),
    ],
)
def test_errors_have_their_messages(error: type[CoordinatorError], message: str) -> None:
    assert issubclass(error, CoordinatorError)
    assert str(error()) == message


# -- submitting and running --------------------------------------------------------------


async def test_turns_of_a_conversation_run_one_at_a_time_in_order() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        async with TurnRegistry() as turns:
            gate = anyio.Event()
            jobs = [Job(rec.turn("a", gate))] + [Job(rec.turn(n)) for n in "bcd"]
            assert [turns.submit("conv", job) for job in jobs] == [0, 1, 2, 3]
            assert turns.waiting("conv") == 3
            assert turns.waiting("other") == 0
            await wait_all_tasks_blocked()
            assert rec.log == ["start a"]
            gate.set()
            assert await turns.wait()
        assert rec.log == [f"{what} {name}" for name in "abcd" for what in ("start", "end")]
        assert all(job.done and job.error is None and not job.dropped for job in jobs)
        assert set(rec.fences.values()) == {0}, "fence 0 means unfenced (no locker)"


async def test_conversations_run_concurrently() -> None:
    with anyio.fail_after(5):
        async with TurnRegistry(max_queued=0) as turns:
            both = anyio.Event()
            started: list[int] = []

            async def turn(fence: int) -> None:
                started.append(fence)
                if len(started) == 2:
                    both.set()
                await both.wait()

            assert turns.submit("one", Job(turn)) == 0
            assert turns.submit("two", Job(turn)) == 0
        assert len(started) == 2


async def test_run_returns_the_result() -> None:
    with anyio.fail_after(5):
        async with TurnRegistry() as turns:

            async def answer(fence: int) -> int:
                return 42 + fence

            assert await turns.run("conv", answer) == 42


async def test_job_wait_serves_many_waiters_and_is_a_checkpoint_when_done() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        woken: list[int] = []
        async with TurnRegistry() as turns:
            job = Job(rec.turn("a", gate))

            async def waiter(i: int) -> None:
                await job.wait()
                woken.append(i)

            turns.submit("conv", job)
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(waiter, i)
                await wait_all_tasks_blocked()
                assert woken == []
                gate.set()
            assert sorted(woken) == [0, 1, 2]
            with anyio.CancelScope() as scope:
                scope.cancel()
                await job.wait()  # done, yet still a checkpoint
                pytest.fail("a cancelled wait returned")
            assert scope.cancelled_caught


async def test_a_failing_turn_is_recorded_logged_and_the_queue_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        boom = ValueError("boom")
        async with TurnRegistry() as turns:
            failing = Job(rec.turn("a", error=boom))
            after = Job(rec.turn("b", result="fine"))
            turns.submit("conv", failing)
            turns.submit("conv", after)
            with pytest.raises(ValueError, match=r"^boom$"):
                await turns.run("conv", rec.turn("c", error=ValueError("boom")))
        assert failing.error is boom
        assert after.done
        assert after.error is None
        assert rec.log == ["start a", "end a", "start b", "end b", "start c", "end c"]
        failures = [r for r in caplog.records if r.name == "lovely_coordinator.turns"]
        assert len(failures) == 2
        assert failures[0].exc_info is not None
        assert failures[0].exc_info[1] is boom
        assert "'conv'" in failures[0].getMessage()


async def test_a_turn_that_is_not_a_coroutine_function_fails_as_a_turn() -> None:
    with anyio.fail_after(5):
        async with TurnRegistry() as turns:
            job: Job[object] = Job(lambda fence: fence)  # type: ignore[arg-type, return-value]
            turns.submit("conv", job)
            await job.wait()
            assert isinstance(job.error, TypeError)
            assert await turns.run("conv", Recorder().turn("next", result=1)) == 1


# -- contexts ----------------------------------------------------------------------------

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def test_each_turn_runs_in_the_context_of_its_own_submitter() -> None:
    """A busy conversation's later turns used to run in the first submitter's context."""
    with anyio.fail_after(5):
        seen: list[tuple[str, str]] = []
        gate = anyio.Event()

        def turn(name: str, wait: anyio.Event | None = None) -> Turn:
            async def run(fence: int) -> str:
                seen.append((name, request_id.get()))
                request_id.set(f"set by {name}")  # stays in this turn's own copy
                if wait is not None:
                    await wait.wait()
                await anyio.lowlevel.checkpoint()
                seen.append((f"{name} after", request_id.get()))
                return name

            return run

        async with TurnRegistry() as turns:

            async def submit_as(rid: str, name: str, wait: anyio.Event | None = None) -> None:
                request_id.set(rid)
                turns.submit("conv", Job(turn(name, wait)))

            async def run_as(rid: str, name: str) -> None:
                request_id.set(rid)
                assert await turns.run("conv", turn(name)) == name
                assert request_id.get() == rid, "a turn's own values never leak back"

            async with anyio.create_task_group() as tg:
                tg.start_soon(submit_as, "req-1", "first", gate)
                await wait_all_tasks_blocked()
                tg.start_soon(submit_as, "req-2", "second")
                await wait_all_tasks_blocked()
                tg.start_soon(run_as, "req-3", "third")
                await wait_all_tasks_blocked()
                assert turns.waiting("conv") == 2
                gate.set()
        assert request_id.get() == "-"
        assert seen == [
            ("first", "req-1"),
            ("first after", "set by first"),
            ("second", "req-2"),
            ("second after", "set by second"),
            ("third", "req-3"),
            ("third after", "set by third"),
        ]


async def test_a_turn_shares_the_task_before_it_only_while_the_values_are_the_very_same() -> None:
    with anyio.fail_after(5):
        ran: list[tuple[str, str, int]] = []

        def turn(name: str, sets: bool = False) -> Turn:
            async def run(fence: int) -> None:
                ran.append((name, request_id.get(), anyio.get_current_task().id))
                if sets:
                    request_id.set(f"set by {name}")
                await anyio.lowlevel.checkpoint()

            return run

        gate = anyio.Event()

        async def first(fence: int) -> None:
            await gate.wait()
            ran.append(("first", request_id.get(), anyio.get_current_task().id))

        request_id.set("req")
        async with TurnRegistry() as turns:
            turns.submit("conv", Job(first))
            for name, sets in [("plain", False), ("setter", True), ("after", False)]:
                turns.submit("conv", Job(turn(name, sets)))
            await wait_all_tasks_blocked()
            gate.set()
        assert [(name, rid) for name, rid, _ in ran] == [
            ("first", "req"),
            ("plain", "req"),
            ("setter", "req"),
            ("after", "req"),  # not "set by setter": it got a task of its own
        ]
        tasks = [task for _, _, task in ran]
        assert tasks[0] == tasks[1] == tasks[2], "same values: the turns share one task"
        assert tasks[3] != tasks[2]


async def test_equal_but_distinct_values_of_two_submitters_stay_apart() -> None:
    with anyio.fail_after(5):
        spans: contextvars.ContextVar[list[str]] = contextvars.ContextVar("spans")
        lists: list[list[str]] = []
        seen: list[list[str]] = []
        gate = anyio.Event()

        def turn(wait: anyio.Event | None) -> Turn:
            async def run(fence: int) -> None:
                if wait is not None:
                    await wait.wait()
                seen.append(spans.get())

            return run

        async with TurnRegistry() as turns:

            async def submit_as(wait: anyio.Event | None) -> None:
                lists.append([])
                spans.set(lists[-1])  # equal to the other submitter's list, not the same
                turns.submit("conv", Job(turn(wait)))

            await submit_as(gate)
            async with anyio.create_task_group() as tg:
                tg.start_soon(submit_as, None)
            gate.set()
        assert len(seen) == 2
        assert seen[0] is lists[0]
        assert seen[1] is lists[1]


SELF_WAIT = (
    "a turn cannot run() a later turn of its own conversation and wait for it: that turn"
    " starts only after this one has ended, so the wait would never return; submit() it"
    " instead"
)


async def test_a_turn_awaiting_run_on_its_own_conversation_fails_at_once() -> None:
    """It used to deadlock silently: the new turn could only start after the caller's."""
    with anyio.fail_after(5):
        rec = Recorder()
        refused: list[str] = []
        turn_over = anyio.Event()
        async with TurnRegistry() as turns, anyio.create_task_group() as outside:

            async def attempt(where: str) -> None:
                with pytest.raises(UsageError, match=f"^{re.escape(SELF_WAIT)}$") as info:
                    await turns.run("conv", rec.turn(f"never, from {where}"))
                assert isinstance(info.value, RuntimeError)
                assert isinstance(info.value, CoordinatorError)
                assert turns.waiting("conv") == 0, "nothing was submitted"
                refused.append(where)

            async def leftover() -> None:
                await turn_over.wait()  # its turn has ended: waiting is no deadlock any more
                assert await turns.run("conv", rec.turn("from a leftover task", result=1)) == 1

            async def turn(fence: int) -> str:
                await attempt("the body")
                async with anyio.create_task_group() as tg:
                    tg.start_soon(attempt, "a child task")
                assert await turns.run("other", rec.turn("other conversation", result=2)) == 2
                assert turns.submit("conv", Job(rec.turn("submitted"))) == 1, "still allowed"
                outside.start_soon(leftover)
                return "done"

            assert await turns.run("conv", turn) == "done"
            turn_over.set()
        assert refused == ["the body", "a child task"]
        assert rec.log == [
            "start other conversation",
            "end other conversation",
            "start submitted",
            "end submitted",
            "start from a leftover task",
            "end from a leftover task",
        ]


WAIT_BEHIND = (
    "a turn cannot wait for a later turn of its own conversation: that turn starts only"
    " after this one has ended, so the wait would never return; let it run after this one"
)


async def test_a_turn_waiting_for_a_job_queued_behind_it_fails_at_once() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        refused: list[str] = []
        async with TurnRegistry() as turns:
            later = Job(rec.turn("later"))
            elsewhere = Job(rec.turn("elsewhere"))

            async def attempt(where: str) -> None:
                with pytest.raises(UsageError, match=f"^{re.escape(WAIT_BEHIND)}$") as info:
                    await later.wait()
                assert isinstance(info.value, RuntimeError)
                refused.append(where)

            async def turn(fence: int) -> None:
                assert turns.submit("conv", later) == 1
                await attempt("the body")
                async with anyio.create_task_group() as tg:
                    tg.start_soon(attempt, "a child task")
                assert turns.waiting("conv") == 1, "the job stays queued"
                turns.submit("other", elsewhere)
                await elsewhere.wait()  # another conversation: no deadlock

            await turns.run("conv", turn)
            await later.wait()
        assert refused == ["the body", "a child task"]
        assert later.error is None
        assert rec.log == ["start elsewhere", "end elsewhere", "start later", "end later"]


# -- a cancellation beside errors --------------------------------------------------------


async def fails_while_cancelled(fence: int) -> None:
    """A body whose cleanup fails while it is cancelled, as a task group in it may report."""
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class() as cancelled:
        raise BaseExceptionGroup("cleanup", [cancelled, ValueError("cleanup failed")]) from None


def logged_cleanup_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    failures = []
    for record in caplog.records:
        if record.exc_info is not None and isinstance(record.exc_info[1], BaseExceptionGroup):
            failures += [str(error) for error in record.exc_info[1].exceptions]
    return failures


@pytest.mark.parametrize("stop", ["interrupt", "lost lease"])
async def test_a_stopped_turn_raising_a_cancellation_beside_errors_ends_interrupted(
    stop: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Such a group used to escape the turn and crash the registry's task group."""
    with anyio.fail_after(5):
        rec = Recorder()
        locker = GrantingLocker() if stop == "lost lease" else None
        async with TurnRegistry(locker=locker) as turns:
            victim = Job(fails_while_cancelled)
            turns.submit("conv", victim)
            turns.submit("conv", Job(rec.turn("queued")))
            await wait_all_tasks_blocked()
            if locker is None:
                assert await turns.run("conv", rec.turn("next", result=1), "interrupt") == 1
            else:
                locker.leases[0].lost.set()
                assert await turns.run("conv", rec.turn("next", result=1)) == 1
                assert locker.leases[0].released
            expected = TurnInterrupted if locker is None else LeaseLostError
            assert isinstance(victim.error, expected)
            assert await turns.run("conv", rec.turn("later", result=2)) == 2, "still alive"
        assert logged_cleanup_failures(caplog) == ["cleanup failed"]
        ran = ["next", "later"] if locker is None else ["queued", "next", "later"]
        assert rec.log == [f"{what} {name}" for name in ran for what in ("start", "end")]


@pytest.mark.parametrize("how", ["an exception", "an enclosing cancel scope"])
async def test_a_cancellation_beside_errors_while_the_registry_is_left_ends_interrupted(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(5):
        victim = Job(fails_while_cancelled)
        queued = Job(forever)
        left_by: list[str] = []
        with anyio.CancelScope() as enclosing:
            try:
                async with TurnRegistry() as turns:
                    turns.submit("conv", victim)
                    turns.submit("conv", queued)
                    await wait_all_tasks_blocked()
                    if how == "an exception":
                        raise LookupError("leaving")
                    enclosing.cancel()
                    await anyio.sleep_forever()
            except LookupError as error:
                left_by.append(str(error))
        assert left_by == (["leaving"] if how == "an exception" else [])
        assert enclosing.cancelled_caught == (how != "an exception")
        assert isinstance(victim.error, TurnInterrupted)
        assert isinstance(queued.error, DrainingError)
        assert victim.done
        assert queued.done
        assert logged_cleanup_failures(caplog) == ["cleanup failed"]


async def test_a_turn_raising_a_stray_cancellation_beside_errors_fails_with_the_errors() -> None:
    with anyio.fail_after(5):
        one, two = ValueError("one"), KeyError("two")

        async def turn(fence: int) -> None:
            with anyio.CancelScope() as inner:
                inner.cancel()
                try:
                    await anyio.lowlevel.checkpoint()
                except anyio.get_cancelled_exc_class() as cancelled:
                    stray = cancelled
            # Nothing cancels the turn: the cancellation in this group is nobody's.
            raise BaseExceptionGroup("odd", [one, stray, two])

        async with TurnRegistry() as turns:
            with pytest.raises(ExceptionGroup) as info:
                await turns.run("conv", turn)
            assert info.value.exceptions == (one, two)
            assert await turns.run("conv", answer_one) == 1


async def answer_one(fence: int) -> int:
    return 1


# -- capacity and bad input --------------------------------------------------------------


async def test_queue_full_leaves_the_job_untouched() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry(max_queued=2) as turns:
            turns.submit("conv", Job(rec.turn("a", gate)))
            turns.submit("conv", Job(rec.turn("b")))
            turns.submit("conv", Job(rec.turn("c")))
            refused = Job(rec.turn("d"))
            with pytest.raises(
                QueueFullError, match=r"^too many turns are already queued for this conversation$"
            ):
                turns.submit("conv", refused)
            with pytest.raises(QueueFullError):
                await turns.run("conv", rec.turn("e"))
            assert turns.waiting("conv") == 2
            gate.set()
            await turns.wait()
            assert (refused.done, refused.dropped, refused.error) == (False, False, None)
            assert turns.submit("conv", refused) == 0, "an untouched job can be submitted later"
        assert rec.log == [f"{w} {n}" for n in "abcd" for w in ("start", "end")]


async def test_default_cap_is_ten_waiting_turns() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            assert turns.max_queued == DEFAULT_MAX_QUEUED
            positions = [turns.submit("conv", Job(rec.turn(str(i), gate))) for i in range(11)]
            assert positions == list(range(11))
            with pytest.raises(QueueFullError):
                turns.submit("conv", Job(forever))
            gate.set()
        assert len(rec.log) == 22


async def test_max_queued_zero_runs_one_turn_and_queues_none() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry(max_queued=0) as turns:
            assert turns.submit("conv", Job(rec.turn("a", gate))) == 0
            for mode in ("enqueue", "interrupt", "replace_queued"):
                with pytest.raises(QueueFullError):
                    turns.submit("conv", Job(rec.turn("b")), mode)
            with pytest.raises(ConversationBusyError):
                turns.submit("conv", Job(rec.turn("b")), "reject")
            gate.set()
        assert rec.log == ["start a", "end a"], "nothing was interrupted or queued"


@pytest.mark.parametrize("max_queued", [-1, True, 2.0, "10"])
def test_bad_max_queued(max_queued: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^max_queued must be a nonnegative integer$"):
        TurnRegistry(max_queued=max_queued)  # type: ignore[arg-type]


async def test_bad_arguments_change_nothing() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            running = Job(rec.turn("a", gate))
            turns.submit("conv", running)
            job = Job(rec.turn("b"))
            with pytest.raises(InvalidArgumentError, match=r"^multitask must be one of "):
                turns.submit("conv", job, "rollback")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match=r"^conversation_id must be a nonempty"):
                turns.submit("", job)
            with pytest.raises(InvalidArgumentTypeError, match=r"^conversation_id must be a"):
                turns.submit(7, job)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentTypeError, match=r"^conversation_id must be a"):
                turns.waiting(["conv"])  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentTypeError, match=r"^job must be a Job$"):
                turns.submit("conv", rec.turn("c"))  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match=r"^a Job can be submitted only once$"):
                turns.submit("conv", running)
            with pytest.raises(InvalidArgumentError, match=r"^timeout must be a nonnegative"):
                await turns.wait(timeout=-1)
            with pytest.raises(InvalidArgumentError, match=r"^timeout must be a nonnegative"):
                await turns.wait(timeout=float("nan"))
            assert turns.waiting("conv") == 0
            assert not job.done
            gate.set()
        assert rec.log == ["start a", "end a"]


async def test_a_submit_from_another_thread_is_refused_and_changes_nothing() -> None:
    """It used to admit the job, then fail to start its task: the conversation stayed busy
    for good, with a turn that never ran."""
    with anyio.fail_after(5):
        async with TurnRegistry() as turns:
            job = Job(answer_one)
            with pytest.raises(UsageError, match=r"^TurnRegistry.submit\(\) was called from "):
                await anyio.to_thread.run_sync(turns.submit, "conv", job)
            assert turns.statistics() == TurnStatistics(0, 0, 0, False)
            assert (job.done, job.error) == (False, None)
            position = await anyio.to_thread.run_sync(
                lambda: anyio.from_thread.run_sync(turns.submit, "conv", job)
            )
            assert position == 0
            await job.wait()
        assert job.result == 1


async def test_the_registry_must_be_entered_once() -> None:
    with anyio.fail_after(5):
        turns = TurnRegistry()
        assert await turns.wait(), "an unentered registry has nothing to wait for"
        job = Job(answer_one)
        with pytest.raises(
            UsageError,
            match=r"^enter the TurnRegistry with 'async with' before submitting turns: its turns"
            r" run in the task group that block opens$",
        ):
            turns.submit("conv", job)
        with pytest.raises(UsageError, match=r"^enter the TurnRegistry"):
            await turns.run("conv", forever)
        assert turns.statistics() == TurnStatistics(0, 0, 0, False)
        async with turns:
            assert turns.submit("conv", job) == 0, "the refused job was left untouched"
            with pytest.raises(
                UsageError,
                match=r"^this TurnRegistry is already entered: one 'async with' block owns its"
                r" turns; share the registry it gave instead of entering it again$",
            ):
                await turns.__aenter__()
            assert await turns.run("conv", answer_one) == 1, "entering twice changed nothing"
        assert job.result == 1
        with pytest.raises(
            UsageError,
            match=r"^a TurnRegistry can be entered only once: leaving its 'async with' block"
            r" ended its turns for good; create a new TurnRegistry$",
        ):
            await turns.__aenter__()
        with pytest.raises(DrainingError):
            turns.submit("conv", Job(forever))


class IntSubclass(int):
    pass


class FloatSubclass(float):
    pass


class Index:
    """An integer by ``operator.index`` only, like ``numpy.int64``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.parametrize("max_queued", [IntSubclass(1), Index(1)])
async def test_max_queued_takes_any_integer(max_queued: object) -> None:
    """An integer that is not an int subclass (numpy's) used to be refused."""
    with anyio.fail_after(5):
        turns = TurnRegistry(max_queued=max_queued)  # type: ignore[arg-type]
        assert turns.max_queued == 1
        assert type(turns.max_queued) is int
        assert TurnRegistry(max_queued=10**400).max_queued == 10**400
        async with turns:
            turns.submit("conv", Job(forever))
            turns.submit("conv", Job(forever))
            with pytest.raises(QueueFullError):
                turns.submit("conv", Job(forever))
            turns.submit("conv", Job(answer_one), "interrupt")


@pytest.mark.parametrize(
    "timeout", [10**400, -(10**400), math.inf, -math.inf, math.nan, -1, -0.5, FloatSubclass(-1)]
)
async def test_wait_refuses_timeouts_that_are_no_finite_nonnegative_number(
    timeout: object,
) -> None:
    """A huge int used to leak OverflowError, and infinity was taken for a timeout."""
    with anyio.fail_after(5):
        async with TurnRegistry() as turns:
            turns.submit("conv", Job(answer_one))
            with pytest.raises(
                InvalidArgumentError,
                match=r"^timeout must be a nonnegative finite number or None$",
            ) as info:
                await turns.wait(timeout=timeout)  # type: ignore[arg-type]
            assert not isinstance(info.value, TypeError)


@pytest.mark.parametrize("timeout", ["5", True, b"1", [1]])
async def test_wait_refuses_timeouts_of_the_wrong_type(timeout: object) -> None:
    with anyio.fail_after(5):
        async with TurnRegistry() as turns:
            with pytest.raises(
                InvalidArgumentTypeError,
                match=r"^timeout must be a nonnegative finite number or None$",
            ):
                await turns.wait(timeout=timeout)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "timeout", [IntSubclass(0), FloatSubclass(0.0), Fraction(1, 100), 10**300, 0]
)
async def test_wait_takes_any_real_number_of_seconds(timeout: float) -> None:
    with anyio.fail_after(5):
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            assert await turns.wait(timeout=timeout)  # idle: at once
            turns.submit("conv", Job(Recorder().turn("a", gate)))
            if timeout < 1:
                assert not await turns.wait(timeout=timeout)
            gate.set()
            assert await turns.wait(timeout=timeout if timeout >= 1 else None)


async def test_run_with_a_non_callable_changes_nothing() -> None:
    """It used to take a place in the queue and fail only when its turn came."""
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            turns.submit("conv", Job(rec.turn("a", gate)))
            before = turns.statistics()
            for bad in (None, "turn", 42):
                with pytest.raises(
                    InvalidArgumentTypeError,
                    match=r"^run must be callable: an async function taking the fence$",
                ):
                    await turns.run("conv", bad)  # type: ignore[arg-type]
                with pytest.raises(InvalidArgumentTypeError):
                    await turns.run("other", bad)  # type: ignore[arg-type]
            assert turns.statistics() == before
            assert turns.waiting("conv") == 0
            gate.set()
            assert await turns.run("conv", rec.turn("b", result=2)) == 2, "still usable"
        assert rec.log == ["start a", "end a", "start b", "end b"]


async def test_draining_of_a_registry_with_one_place() -> None:
    with anyio.fail_after(5):
        turns = TurnRegistry(max_queued=1)
        seen = [turns.draining]
        async with turns:
            seen.append(turns.draining)
            turns.submit("conv", Job(answer_one))
            seen.append(turns.draining)
            turns.drain()
            seen += [turns.draining, turns.statistics().draining]
        seen.append(turns.draining)
        assert seen == [False, False, False, True, True, True]
        other = TurnRegistry(max_queued=1)
        async with other:
            seen = [other.draining]  # a registry's drain is its own
        assert [*seen, other.draining] == [False, True], "leaving the block drains"


async def test_replace_queued_at_position_one_of_a_full_queue_of_one() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry(max_queued=1) as turns:
            running = Job(rec.turn("a", gate))
            turns.submit("conv", running)
            old = Job(rec.turn("b"))
            assert turns.submit("conv", old) == 1
            with pytest.raises(QueueFullError):
                turns.submit("conv", Job(rec.turn("x")))
            new = Job(rec.turn("c"))
            assert turns.submit("conv", new, "replace_queued") == 1, "the full queue is replaced"
            assert (old.dropped, old.done) == (True, True)
            assert turns.waiting("conv") == 1
            with pytest.raises(QueueFullError):
                turns.submit("conv", Job(rec.turn("y")))
            gate.set()
            await new.wait()
        assert running.error is None
        assert rec.log == [f"{w} {n}" for n in "ac" for w in ("start", "end")]


# -- statistics --------------------------------------------------------------------------


async def test_statistics_count_conversations_running_and_waiting_turns() -> None:
    with anyio.fail_after(5):
        gates = {name: anyio.Event() for name in ("a", "x")}
        rec = Recorder()
        async with TurnRegistry() as turns:
            assert turns.statistics() == TurnStatistics(
                conversations=0, running=0, waiting=0, draining=False
            )
            turns.submit("one", Job(rec.turn("a", gates["a"])))
            turns.submit("one", Job(rec.turn("b")))
            turns.submit("one", Job(rec.turn("c")))
            turns.submit("two", Job(Recorder().turn("x", gates["x"])))
            assert turns.statistics() == TurnStatistics(2, 2, 2, False)
            async with anyio.create_task_group() as tg:
                tg.start_soon(turns.run, "one", rec.turn("dropped"))
                await wait_all_tasks_blocked()
                assert turns.statistics().waiting == 3
                tg.cancel_scope.cancel()
            assert turns.statistics() == TurnStatistics(2, 2, 3, False), "dropped still waits"
            turns.submit("two", Job(answer_one), "replace_queued")
            turns.submit("two", Job(answer_one), "replace_queued")
            assert turns.statistics().waiting == 4
            turns.drain()
            snapshot = turns.statistics()
            assert snapshot == TurnStatistics(2, 2, 4, True)
            gates["x"].set()
            await wait_all_tasks_blocked()
            assert turns.statistics() == TurnStatistics(1, 1, 3, True)
            gates["a"].set()
            assert await turns.wait()
            assert turns.statistics() == TurnStatistics(0, 0, 0, True)
            assert snapshot == TurnStatistics(2, 2, 4, True), "a snapshot, not a live view"
        assert rec.log == [f"{w} {n}" for n in "abc" for w in ("start", "end")]


def test_statistics_are_a_frozen_value() -> None:
    snapshot = TurnRegistry().statistics()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.waiting = 3  # type: ignore[misc]
    assert snapshot == TurnStatistics(0, 0, 0, False)
    assert hash(snapshot) == hash(TurnStatistics(0, 0, 0, False))


# -- callers that go away ----------------------------------------------------------------


async def test_cancelling_a_waiting_run_drops_its_job_and_the_queue_moves_on() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry(max_queued=2) as turns:
            turns.submit("conv", Job(rec.turn("a", gate)))
            async with anyio.create_task_group() as tg:
                tg.start_soon(turns.run, "conv", rec.turn("b"))
                await wait_all_tasks_blocked()
                tg.cancel_scope.cancel()
            (dropped,) = turns._table.pending("conv")
            assert dropped.dropped
            assert not dropped.done, "a dropped job is done only when it is reached"
            # Until reached it still counts: in waiting(), positions and max_queued.
            assert turns.waiting("conv") == 1
            last = Job(rec.turn("c"), on_dequeue=rec.dequeue("c"))
            assert turns.submit("conv", last) == 2
            with pytest.raises(QueueFullError):
                turns.submit("conv", Job(rec.turn("x")))
            gate.set()
            await last.wait()
            assert (dropped.done, dropped.error) == (True, None)
        assert rec.log == ["start a", "end a", "dequeue c", "start c", "end c"]


async def test_cancelling_a_run_whose_turn_started_leaves_the_turn_running() -> None:
    with anyio.fail_after(5):
        started, gate, finished = anyio.Event(), anyio.Event(), anyio.Event()

        async def turn(fence: int) -> None:
            started.set()
            await gate.wait()
            finished.set()

        async with TurnRegistry() as turns:
            caller_left = anyio.Event()

            async def caller() -> None:
                with anyio.CancelScope() as scope:
                    task_scope.append(scope)
                    await turns.run("conv", turn)
                caller_left.set()

            task_scope: list[anyio.CancelScope] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(caller)
                await started.wait()
                task_scope[0].cancel()
                await caller_left.wait()  # the caller is cancelled at once...
                assert not finished.is_set()  # ...while its turn still runs
                gate.set()
            assert await turns.wait()
            assert finished.is_set()


async def test_a_run_cancelled_before_it_submits_starts_nothing() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        async with TurnRegistry() as turns:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await turns.run("conv", rec.turn("a"))
            assert turns.waiting("conv") == 0
        assert rec.log == []


# -- on_dequeue and callbacks ------------------------------------------------------------


async def test_on_dequeue_only_for_jobs_that_waited_and_errors_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        rec = Recorder()

        def broken() -> None:
            rec.log.append("dequeue c")
            raise RuntimeError("callback bug")

        async with TurnRegistry() as turns:
            turns.submit("conv", Job(rec.turn("a"), on_dequeue=rec.dequeue("a")))
            turns.submit("conv", Job(rec.turn("b"), on_dequeue=rec.dequeue("b")))
            turns.submit("conv", Job(rec.turn("c"), on_dequeue=broken))
        assert rec.log == [
            "start a",
            "end a",
            "dequeue b",
            "start b",
            "end b",
            "dequeue c",
            "start c",
            "end c",
        ]
        assert any("callback" in r.getMessage() for r in caplog.records)


# -- drain, wait, and leaving the block --------------------------------------------------


async def test_drain_without_locker_refuses_new_turns_and_runs_queued_ones() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            turns.submit("conv", Job(rec.turn("a", gate)))
            queued = Job(rec.turn("b"))
            turns.submit("conv", queued)
            turns.drain()
            turns.drain()  # idempotent
            assert turns.draining
            refused = Job(rec.turn("x"))
            for mode in ("enqueue", "reject", "interrupt", "replace_queued"):
                with pytest.raises(
                    DrainingError, match=r"^this server is shutting down; retry the turn$"
                ):
                    turns.submit("other", refused, mode)
                with pytest.raises(DrainingError):
                    turns.submit("conv", refused, mode)
            assert (refused.done, refused.dropped, refused.error) == (False, False, None)
            assert turns.waiting("conv") == 1
            with pytest.raises(DrainingError):
                await turns.run("conv", rec.turn("y"))
            gate.set()
            assert await turns.wait()
            assert queued.done
            assert queued.error is None
        assert rec.log == ["start a", "end a", "start b", "end b"]


async def test_wait_returns_true_at_once_when_idle() -> None:
    with anyio.fail_after(5):
        async with TurnRegistry() as turns:
            assert await turns.wait()
            assert await turns.wait(timeout=0)


@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock")],
)
async def test_wait_times_out_on_the_clock() -> None:
    with anyio.fail_after(100):
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            turns.submit("conv", Job(Recorder().turn("a", gate)))
            start = anyio.current_time()
            assert not await turns.wait(timeout=25.0)
            assert anyio.current_time() - start == pytest.approx(25.0)
            gate.set()
            assert await turns.wait(timeout=None)


async def test_wait_times_out_in_real_time() -> None:
    with anyio.fail_after(5):
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            turns.submit("conv", Job(Recorder().turn("a", gate)))
            assert not await turns.wait(timeout=0.01)
            gate.set()
            assert await turns.wait(timeout=5)


async def test_leaving_the_block_normally_drains_and_waits() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        async with TurnRegistry() as turns:
            for name in "abc":
                turns.submit("conv", Job(rec.turn(name)))
        assert turns.draining
        assert rec.log == [f"{w} {n}" for n in "abc" for w in ("start", "end")]


async def test_leaving_the_block_by_an_exception_cancels_the_turns() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        running = Job(forever)
        queued = Job(rec.turn("b"), on_dequeue=rec.dequeue("b"), on_refused=rec.refused("b"))
        turns = TurnRegistry()

        async def body() -> None:
            async with turns:
                turns.submit("conv", running)
                turns.submit("conv", queued)
                await wait_all_tasks_blocked()
                raise ZeroDivisionError

        with pytest.raises(ZeroDivisionError):  # as it is, not in an exception group
            await body()
        assert running.done
        assert isinstance(running.error, TurnInterrupted)
        assert queued.done
        assert isinstance(queued.error, DrainingError)
        assert rec.log == ["refused b DrainingError"]
        assert not turns._table


async def test_leaving_the_block_before_a_turns_task_ran_never_runs_it() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        started = Job(rec.turn("a"))

        async def body() -> None:
            async with TurnRegistry() as turns:
                assert turns.submit("conv", started) == 0  # its task has not run yet
                raise KeyError("at once")

        with pytest.raises(KeyError):
            await body()
        assert started.done
        assert isinstance(started.error, TurnInterrupted)
        assert rec.log == []


async def test_a_dropped_job_still_queued_at_shutdown_is_done_without_a_refusal() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        dropped: list[Job[object]] = []

        async def body() -> None:
            async with TurnRegistry() as turns:
                turns.submit("conv", Job(forever))
                async with anyio.create_task_group() as tg:
                    tg.start_soon(turns.run, "conv", rec.turn("never"))
                    await wait_all_tasks_blocked()
                    tg.cancel_scope.cancel()
                (job,) = turns._table.pending("conv")
                dropped.append(job)
                raise KeyError("leaving")

        with pytest.raises(KeyError):
            await body()
        (job,) = dropped
        assert (job.done, job.dropped, job.error) == (True, True, None)
        assert rec.log == []


async def test_leaving_the_block_by_cancellation_cancels_the_turns() -> None:
    with anyio.fail_after(5):
        running = Job(forever)
        with anyio.CancelScope() as outer:
            async with TurnRegistry() as turns:
                turns.submit("conv", running)
                await wait_all_tasks_blocked()
                outer.cancel()
                await anyio.sleep_forever()
        assert outer.cancelled_caught
        assert isinstance(running.error, TurnInterrupted)


async def test_an_enclosing_cancellation_stops_the_turns_only_through_the_block() -> None:
    """A scope around the registry stops its turns by making the block leave, never
    behind the block's back: a block shielded from it keeps its turns running."""
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        running = Job(rec.turn("a", gate))
        queued = Job(rec.turn("b", anyio.Event()))
        with anyio.CancelScope() as enclosing:
            async with TurnRegistry() as turns:
                turns.submit("conv", running)
                turns.submit("conv", queued)
                await wait_all_tasks_blocked()
                enclosing.cancel()
                with anyio.CancelScope(shield=True):
                    await wait_all_tasks_blocked()
                    assert not running.done, "the turn was not cancelled behind the block"
                    gate.set()
                    await running.wait()
                    assert running.error is None
                await anyio.sleep_forever()  # the block is cancelled here
        assert enclosing.cancelled_caught
        assert isinstance(queued.error, TurnInterrupted), "stopped when the block was left"
        assert rec.log == ["start a", "end a", "start b", "end b"]


async def test_a_cancelled_shutdown_wait_cancels_the_turns() -> None:
    with anyio.fail_after(5):
        running = Job(forever)
        refused: list[str] = []

        async def caller(turns: TurnRegistry) -> None:
            try:
                await turns.run("conv", forever)
            except DrainingError as error:
                refused.append(str(error))

        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as outer:

                async def cancel_when_stuck() -> None:
                    await wait_all_tasks_blocked()
                    outer.cancel()

                async with TurnRegistry() as turns:
                    turns.submit("conv", running)
                    tg.start_soon(caller, turns)
                    await wait_all_tasks_blocked()
                    assert turns.waiting("conv") == 1
                    tg.start_soon(cancel_when_stuck)
                # not reached: __aexit__ waits for the endless turn and is cancelled
            assert outer.cancelled_caught
        assert isinstance(running.error, TurnInterrupted)
        assert refused == ["this server is shutting down; retry the turn"]


# -- double texting ----------------------------------------------------------------------


async def test_reject_refuses_a_busy_conversation() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            assert turns.submit("conv", Job(rec.turn("a", gate)), "reject") == 0
            refused = Job(rec.turn("b"))
            with pytest.raises(
                ConversationBusyError,
                match=r"^a turn is already running or queued for this conversation$",
            ):
                turns.submit("conv", refused, "reject")
            with pytest.raises(ConversationBusyError):
                await turns.run("conv", rec.turn("c"), multitask="reject")
            assert not refused.done
            gate.set()
            await turns.wait()
            assert await turns.run("conv", rec.turn("d", result=4), multitask="reject") == 4
        assert rec.log == ["start a", "end a", "start d", "end d"]


async def test_interrupt_cancels_the_running_turn_and_drops_the_queue() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        outcomes: dict[str, object] = {}

        async def caller(name: str, turn: Turn, mode: Multitask = "enqueue") -> None:
            try:
                outcomes[name] = await turns.run("conv", turn, mode)
            except CoordinatorError as error:
                outcomes[name] = type(error)

        async with TurnRegistry() as turns, anyio.create_task_group() as tg:
            running = Job(rec.turn("a", anyio.Event()))
            turns.submit("conv", running)
            queued = Job(rec.turn("b"), on_dequeue=rec.dequeue("b"))
            turns.submit("conv", queued)
            tg.start_soon(caller, "c", rec.turn("c"))
            await wait_all_tasks_blocked()
            assert turns.waiting("conv") == 2
            new = Job(rec.turn("d", result="d"), on_dequeue=rec.dequeue("d"))
            assert turns.submit("conv", new, "interrupt") == 1
            assert queued.dropped
            assert queued.done, "dropped by double texting: done at once"
            assert turns.waiting("conv") == 1
            await new.wait()
        assert isinstance(running.error, TurnInterrupted)
        assert running.done
        assert not running.dropped
        assert queued.error is None
        assert outcomes == {"c": TurnDropped}
        assert new.error is None
        assert rec.log == ["start a", "end a", "dequeue d", "start d", "end d"]


async def test_interrupt_through_run_and_on_an_idle_conversation() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        async with TurnRegistry() as turns:
            assert turns.submit("idle", Job(rec.turn("a")), "interrupt") == 0
            await turns.wait()
            first = Job(forever)
            turns.submit("conv", first)
            assert await turns.run("conv", rec.turn("b", result=2), multitask="interrupt") == 2
            assert isinstance(first.error, TurnInterrupted)

            raised: list[CoordinatorError] = []

            async def victim() -> None:
                try:
                    await turns.run("conv", forever)
                except TurnInterrupted as error:
                    raised.append(error)

            async with anyio.create_task_group() as tg:
                tg.start_soon(victim)
                await wait_all_tasks_blocked()
                turns.submit("conv", Job(rec.turn("c")), "interrupt")
            assert len(raised) == 1
        assert rec.log == ["start a", "end a", "start b", "end b", "start c", "end c"]


async def test_interrupt_before_the_turn_task_started_never_runs_the_turn() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        async with TurnRegistry() as turns:
            first = Job(rec.turn("a"))
            assert turns.submit("conv", first) == 0
            assert turns.submit("conv", Job(rec.turn("b")), "interrupt") == 1
        assert isinstance(first.error, TurnInterrupted)
        assert rec.log == ["start b", "end b"]


async def test_an_interrupted_turn_cleans_up_before_the_next_one_starts() -> None:
    with anyio.fail_after(5):
        log: list[str] = []

        async def slow_cleanup(fence: int) -> None:
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    for _ in range(5):
                        await anyio.lowlevel.checkpoint()
                log.append("cleaned up")

        async def next_turn(fence: int) -> None:
            log.append("next")

        async with TurnRegistry() as turns:
            turns.submit("conv", Job(slow_cleanup))
            await wait_all_tasks_blocked()
            turns.submit("conv", Job(next_turn), "interrupt")
        assert log == ["cleaned up", "next"]


async def test_a_turn_that_finishes_despite_the_interrupt_still_ends_interrupted() -> None:
    """The stop decides (CONTRACT §5b): such a turn used to end as a success."""
    with anyio.fail_after(5):
        entered, release = anyio.Event(), anyio.Event()

        async def stubborn(fence: int) -> str:
            with anyio.CancelScope(shield=True):
                entered.set()
                await release.wait()
            return "done anyway"  # no checkpoint left for the interrupt to land on

        async with TurnRegistry() as turns:
            job = Job(stubborn)
            turns.submit("conv", job)
            await entered.wait()
            turns.submit("conv", Job(Recorder().turn("b")), "interrupt")
            release.set()
            await job.wait()
            assert isinstance(job.error, TurnInterrupted)
            assert job.result is None, "a stopped turn's partial result is discarded"


async def test_replace_queued_keeps_the_running_turn() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        async with TurnRegistry() as turns:
            running = Job(rec.turn("a", gate))
            turns.submit("conv", running)
            old = [Job(rec.turn(n)) for n in "bc"]
            for job in old:
                turns.submit("conv", job)
            new = Job(rec.turn("d"))
            assert turns.submit("conv", new, "replace_queued") == 1
            assert all(job.dropped and job.done for job in old)
            assert turns.waiting("conv") == 1
            raised: list[str] = []

            async def replaced() -> None:
                try:
                    await turns.run("conv", rec.turn("e"))
                except TurnDropped as error:
                    raised.append(str(error))

            async with anyio.create_task_group() as tg:
                tg.start_soon(replaced)
                await wait_all_tasks_blocked()
                assert turns.submit("conv", Job(rec.turn("f")), "replace_queued") == 1
            assert raised == ["the turn was dropped before it started"]
            assert new.dropped
            gate.set()
        assert running.error is None
        assert rec.log == [f"{w} {n}" for n in "af" for w in ("start", "end")]


# -- the locker --------------------------------------------------------------------------


async def test_each_turn_runs_under_its_own_lease_with_its_fence() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        locker = GrantingLocker(rec.log)
        async with TurnRegistry(locker=locker) as turns:
            turns.submit("conv", Job(rec.turn("a")))
            turns.submit("conv", Job(rec.turn("b"), on_dequeue=rec.dequeue("b")))
            turns.submit("conv", Job(rec.turn("c", error=ValueError("x"))))
            assert await turns.wait()
        assert rec.log == [
            "acquire conv",
            "grant conv 1",
            "start a",
            "end a",
            "release conv 1",
            "dequeue b",
            "acquire conv",
            "grant conv 2",
            "start b",
            "end b",
            "release conv 2",
            "acquire conv",
            "grant conv 3",
            "start c",
            "end c",
            "release conv 3",
        ]
        assert rec.fences == {"a": 1, "b": 2, "c": 3}


async def test_two_registries_sharing_a_locker_never_overlap() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        locker = GrantingLocker()
        async with TurnRegistry(locker=locker) as one, TurnRegistry(locker=locker) as two:
            for i in range(10):
                (one if i % 2 else two).submit("conv", Job(rec.turn(str(i))))
            assert await one.wait()
            assert await two.wait()
        assert sorted(rec.fences.values()) == list(range(1, 11))
        assert all(lease.released for lease in locker.leases)


async def test_a_failing_locker_refuses_the_turn_and_never_reports_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        locker = FailingLocker()
        errors: list[BaseException] = []
        async with TurnRegistry(locker=locker) as turns:
            job = Job(rec.turn("a"), on_refused=errors.append)
            turns.submit("conv", job)
            with pytest.raises(
                CoordinationUnavailableError,
                match=r"^this conversation could not be locked across server replicas; "
                r"retry the turn shortly$",
            ) as raised:
                await turns.run("conv", rec.turn("b"))
            assert isinstance(raised.value.__cause__, ConnectionError)
        assert job.done
        assert isinstance(job.error, CoordinationUnavailableError)
        assert errors == [job.error], "on_refused gets the error"
        assert rec.log == []
        assert locker.attempts == 2
        assert any("could not lock" in r.getMessage() for r in caplog.records)


async def test_a_failing_on_refused_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(5):

        def broken(error: BaseException) -> None:
            raise RuntimeError("callback bug")

        async with TurnRegistry(locker=FailingLocker()) as turns:
            job = Job(forever, on_refused=broken)
            turns.submit("conv", job)
            await job.wait()
            assert isinstance(job.error, CoordinationUnavailableError)
        (record,) = [r for r in caplog.records if "callback" in r.getMessage()]
        assert record.exc_info is not None
        assert str(record.exc_info[1]) == "callback bug"


async def test_drain_cancels_lease_waits_and_refuses_queued_turns() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        locker = BlockingLocker()
        async with TurnRegistry(locker=locker) as turns:
            first = Job(rec.turn("a"), on_refused=rec.refused("a"))
            second = Job(rec.turn("b"), on_dequeue=rec.dequeue("b"), on_refused=rec.refused("b"))
            turns.submit("conv", first)
            turns.submit("conv", second)
            outcome: list[type[BaseException]] = []

            async def caller() -> None:
                with pytest.raises(DrainingError) as raised:
                    await turns.run("other", rec.turn("c"))
                outcome.append(raised.type)

            async with anyio.create_task_group() as tg:
                tg.start_soon(caller)
                await wait_all_tasks_blocked()
                assert locker.waiting == 2
                turns.drain()
            assert await turns.wait()
        assert locker.cancelled == 2
        assert isinstance(first.error, DrainingError)
        assert isinstance(second.error, DrainingError)
        assert outcome == [DrainingError]
        # No lease is acquired for b, so there is no dequeue to announce.
        assert rec.log == ["refused a DrainingError", "refused b DrainingError"]


async def test_drain_leaves_a_turn_that_holds_its_lease_running() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        gate = anyio.Event()
        locker = GrantingLocker()
        async with TurnRegistry(locker=locker) as turns:
            running = Job(rec.turn("a", gate))
            turns.submit("conv", running)
            await wait_all_tasks_blocked()
            turns.drain()
            gate.set()
        assert running.error is None
        assert rec.log == ["start a", "end a"]
        assert locker.leases[0].released


async def test_a_lost_lease_cancels_the_turn() -> None:
    with anyio.fail_after(5):
        rec = Recorder()
        locker = GrantingLocker()
        async with TurnRegistry(locker=locker) as turns:
            victim = Job(rec.turn("a", anyio.Event()))
            turns.submit("conv", victim)
            turns.submit("conv", Job(rec.turn("b")))
            await wait_all_tasks_blocked()
            assert rec.log == ["start a"]
            locker.leases[0].lost.set()
            await victim.wait()
            assert isinstance(victim.error, LeaseLostError)
            assert locker.leases[0].released, "the lease is released before the job is done"

            async def lose() -> None:
                await wait_all_tasks_blocked()
                locker.leases[-1].lost.set()

            raised: list[str] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(lose)
                try:
                    await turns.run("conv", forever)
                except LeaseLostError as error:
                    raised.append(str(error))
            assert raised == ["the conversation's lease was lost while the turn was running"]
        assert rec.log == ["start a", "end a", "start b", "end b"]
        assert [lease.fence for lease in locker.leases] == [1, 2, 3]


async def test_a_lease_lost_at_grant_never_runs_the_turn() -> None:
    with anyio.fail_after(5):
        rec = Recorder()

        class LostAtGrant(GrantingLocker):
            async def acquire(self, conversation_id: str) -> FakeLease:
                lease = await super().acquire(conversation_id)
                lease.lost.set()
                return lease

        locker = LostAtGrant()
        async with TurnRegistry(locker=locker) as turns:
            with pytest.raises(LeaseLostError):
                await turns.run("conv", rec.turn("a"))
        assert rec.log == []
        assert locker.leases[0].released


async def test_an_interrupted_turn_still_releases_its_lease() -> None:
    with anyio.fail_after(5):
        locker = GrantingLocker()
        async with TurnRegistry(locker=locker) as turns:
            first = Job(forever)
            turns.submit("conv", first)
            await wait_all_tasks_blocked()
            assert await turns.run("conv", Recorder().turn("b", result=1), "interrupt") == 1
            assert isinstance(first.error, TurnInterrupted)
        assert [lease.released for lease in locker.leases] == [True, True]


async def test_interrupting_a_lease_wait_and_shutdown_release_leases() -> None:
    with anyio.fail_after(5):
        locker = BlockingLocker()
        async with TurnRegistry(locker=locker) as turns:
            waiting = Job(forever)
            turns.submit("conv", waiting)
            await wait_all_tasks_blocked()
            turns.submit("conv", Job(forever), "interrupt")
            await waiting.wait()
            assert isinstance(waiting.error, TurnInterrupted)
            assert locker.cancelled == 1
        granting = GrantingLocker()

        async def body() -> None:
            async with TurnRegistry(locker=granting) as turns:
                turns.submit("conv", Job(forever))
                await granting.granted.wait()
                await wait_all_tasks_blocked()
                raise KeyError

        with pytest.raises(KeyError):
            await body()
        assert granting.leases[0].released, "released, shielded, while the registry was cancelled"


async def test_a_failing_release_is_logged_and_the_queue_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        rec = Recorder()

        class BadRelease(FakeLease):
            async def release(self) -> None:
                await super().release()
                raise OSError("connection reset")

        class Locker(GrantingLocker):
            async def acquire(self, conversation_id: str) -> FakeLease:
                lease = await super().acquire(conversation_id)
                lease.__class__ = BadRelease
                return lease

        async with TurnRegistry(locker=Locker()) as turns:
            turns.submit("conv", Job(rec.turn("a")))
            assert await turns.run("conv", rec.turn("b", result="b")) == "b"
        assert rec.log == ["start a", "end a", "start b", "end b"]
        assert sum("releasing the lease" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock"),
        pytest.param("asyncio", id="asyncio-short"),
    ],
)
async def test_a_hanging_release_is_abandoned_after_a_bound(
    anyio_backend_name: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound = RELEASE_TIMEOUT
    if anyio_backend_name == "asyncio":  # real time: a short bound
        bound = 0.05
        monkeypatch.setattr(turns_types, "RELEASE_TIMEOUT", bound)
    with anyio.fail_after(1000 if anyio_backend_name == "trio" else 5):
        rec = Recorder()

        class Hanging(FakeLease):
            async def release(self) -> None:
                await anyio.sleep_forever()

        class Locker(GrantingLocker):
            async def acquire(self, conversation_id: str) -> FakeLease:
                lease = await super().acquire(conversation_id)
                lease.__class__ = Hanging
                self.locks[conversation_id].release()  # the lease lapses by itself
                return lease

        async with TurnRegistry(locker=Locker()) as turns:
            start = anyio.current_time()
            first = Job(rec.turn("a"))
            turns.submit("conv", first)
            assert await turns.run("conv", rec.turn("b", result="b")) == "b"
            assert anyio.current_time() - start == pytest.approx(2 * bound, rel=0.5)
            assert first.error is None
        assert sum("abandoned" in r.getMessage() for r in caplog.records) == 2


# -- races, stress and memory ------------------------------------------------------------


async def test_a_submit_racing_the_end_of_the_last_turn_starts_one_turn_at_a_time() -> None:
    """The Go original could start a second runner for a conversation being forgotten."""
    with anyio.fail_after(10):
        rec = Recorder()
        async with TurnRegistry() as turns:
            taking: dict[str, int] = {}
            inner = turns._take_turn

            async def counted(conversation_id: str, job: Job[object], waited: bool) -> None:
                taking[conversation_id] = taking.get(conversation_id, 0) + 1
                assert taking[conversation_id] == 1, "two turns at once in one conversation"
                try:
                    await inner(conversation_id, job, waited)
                finally:
                    taking[conversation_id] -= 1

            turns._take_turn = counted  # type: ignore[method-assign]
            positions: list[int] = []

            async def resubmit_when_done(i: int, job: Job[object]) -> None:
                await job.wait()
                follow = Job(rec.turn(f"{i}b"))
                positions.append(turns.submit("conv", follow))

            async with anyio.create_task_group() as tg:
                for i in range(200):
                    job = Job(rec.turn(f"{i}a"))
                    # The waiter parks before the turn ends: it is woken by the end of the
                    # conversation's last turn and submits while its task is leaving.
                    tg.start_soon(resubmit_when_done, i, job)
                    await anyio.lowlevel.checkpoint()
                    turns.submit("conv", job)
                    await job.wait()
        assert 0 in positions, "some resubmits hit a conversation that had just gone idle"
        assert rec.active == 0
        assert len(rec.log) == 800


ENQUEUE_ONLY: list[Multitask] = ["enqueue"]
MIXED: list[Multitask] = [*(ENQUEUE_ONLY * 27), "reject", "interrupt", "replace_queued"]


@pytest.mark.parametrize(("modes", "seed"), [(ENQUEUE_ONLY, 1), (MIXED, 2), (MIXED, 3)])
async def test_many_concurrent_submitters_never_overlap(modes: list[Multitask], seed: int) -> None:
    with anyio.fail_after(30):
        rng = random.Random(seed)
        active = 0
        bodies_ended = 0

        def turn(checkpoints: int) -> Turn:
            async def run(fence: int) -> None:
                nonlocal active, bodies_ended
                active += 1
                assert active == 1, "two turns of one conversation overlap"
                try:
                    for _ in range(checkpoints):
                        await anyio.lowlevel.checkpoint()
                finally:
                    active -= 1
                bodies_ended += 1

            return run

        outcomes: dict[str, int] = {}

        def count(kind: str) -> None:
            outcomes[kind] = outcomes.get(kind, 0) + 1

        async def call(mode: Multitask, checkpoints: int) -> None:
            try:
                await turns.run("conv", turn(checkpoints), mode)
            except CoordinatorError as error:
                count(type(error).__name__)
            else:
                count("ran")

        async def submitter(plan: list[tuple[Multitask, int, int | None]]) -> None:
            for mode, checkpoints, patience in plan:
                async with anyio.create_task_group() as caller:
                    caller.start_soon(call, mode, checkpoints)
                    if patience is not None:  # the caller goes away, queued or running
                        for _ in range(patience):
                            await anyio.lowlevel.checkpoint()
                        caller.cancel_scope.cancel()
                if caller.cancel_scope.cancelled_caught:
                    count("cancelled")

        async with TurnRegistry(max_queued=100) as turns, anyio.create_task_group() as tg:
            for _ in range(50):
                plan = [
                    (
                        rng.choice(modes),
                        rng.randrange(4),
                        rng.randrange(20) if rng.random() < 0.1 else None,
                    )
                    for _ in range(20)
                ]
                tg.start_soon(submitter, plan)
        assert sum(outcomes.values()) >= 1000
        assert bodies_ended >= outcomes["ran"] >= 50
        assert active == 0
        assert not turns._table
        if modes is ENQUEUE_ONLY:
            assert set(outcomes) == {"ran", "cancelled"}
        else:
            assert {"TurnDropped", "TurnInterrupted", "ConversationBusyError"} <= set(outcomes)


async def _fan_out(turns: TurnRegistry, count: int, prefix: str) -> None:
    async def turn(fence: int) -> None:
        await anyio.lowlevel.checkpoint()

    for i in range(count):
        turns.submit(f"{prefix}-{i}", Job(turn if i else forever))
    assert len(turns._table) == count
    # One conversation is stuck until interrupted, so all of them are alive at once.
    await wait_all_tasks_blocked()
    turns.submit(f"{prefix}-0", Job(turn), "interrupt")
    assert await turns.wait()


class LeanLocker:
    """Grants at once and remembers nothing, so only the registry could hold memory."""

    def __init__(self) -> None:
        self.fence = 0

    async def acquire(self, conversation_id: str) -> Lease:
        await anyio.lowlevel.checkpoint()
        self.fence += 1
        return LeanLease(self.fence)


class LeanLease:
    def __init__(self, fence: int) -> None:
        self.fence = fence
        self.lost = anyio.Event()

    async def release(self) -> None:
        await anyio.lowlevel.checkpoint()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("locked", "count"), [(False, 10_000), (True, 2_000)], ids=["unlocked", "locked"]
)
async def test_ten_thousand_conversations_leave_nothing_behind(locked: bool, count: int) -> None:
    with anyio.fail_after(60):
        async with TurnRegistry(locker=LeanLocker() if locked else None) as turns:
            # The first burst grows the backends' own tables (anyio's task set, asyncio's
            # task registry) to their high-water mark; a second burst of *new*
            # conversations must then leave nothing behind.
            await _fan_out(turns, count, "first")
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                await _fan_out(turns, count, "second")
                gc.collect()
                after = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            assert not turns._table
            assert not turns._leases
            ours = [tracemalloc.Filter(True, "*lovely_coordinator*")]
            held_by_us = after.filter_traces(ours).compare_to(
                before.filter_traces(ours), "filename"
            )
            assert sum(stat.size_diff for stat in held_by_us) < 4_000
            # Memory blocks, not bytes: a hash table elsewhere may sit at another capacity,
            # but anything kept per conversation would be thousands of blocks (the rest
            # is noise of a few hundred at most: free lists, caches).
            blocks = sum(stat.count_diff for stat in after.compare_to(before, "filename"))
            assert blocks < 1_000, f"{blocks} blocks still held after {count} conversations"

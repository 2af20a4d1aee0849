"""Turns under a lease (``_turns/lease``): lockers and leases that misbehave, on asyncio and trio.

The well-behaved cases (fences, drain, a lost lease, a hanging release) are in
tests/turns/test_queues.py; here the locker and the lease are as hostile as a turn may be.
"""

from __future__ import annotations

import contextlib

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked

from lovely_coordinator import UsageError
from lovely_coordinator.turns import (
    CoordinationUnavailableError,
    DrainingError,
    Job,
    LeaseLostError,
    LeaseSignal,
    TurnInterrupted,
    TurnRegistry,
)

from ..base.outcome_helpers import Abort, a_stray_cancellation

pytestmark = pytest.mark.anyio


class Lease:
    def __init__(self, fence: int, release_fails_with: BaseException | None) -> None:
        self.fence = fence
        self.lost: LeaseSignal = anyio.Event()
        self.released = False
        self.release_fails_with = release_fails_with

    async def release(self) -> None:
        await anyio.lowlevel.checkpoint()
        self.released = True
        if self.release_fails_with is not None:
            raise self.release_fails_with


class Locker:
    """Grants at once with fences 1, 2, 3, ...; told beforehand how to misbehave."""

    def __init__(
        self,
        acquire_fails_with: BaseException | None = None,
        release_fails_with: BaseException | None = None,
    ) -> None:
        self.acquire_fails_with = acquire_fails_with
        self.release_fails_with = release_fails_with
        self.leases: list[Lease] = []

    async def acquire(self, conversation_id: str) -> Lease:
        await anyio.lowlevel.checkpoint()
        if self.acquire_fails_with is not None:
            failure, self.acquire_fails_with = self.acquire_fails_with, None
            raise failure
        lease = Lease(len(self.leases) + 1, self.release_fails_with)
        self.leases.append(lease)
        return lease


async def fence_of(fence: int) -> int:
    await anyio.lowlevel.checkpoint()
    return fence


def logged(caplog: pytest.LogCaptureFixture, text: str) -> list[BaseException | None]:
    return [r.exc_info[1] if r.exc_info else None for r in caplog.records if text in r.getMessage()]


async def test_a_turn_that_catches_its_lease_loss_and_returns_ends_with_lease_lost() -> None:
    """It used to end as a success, with its partial result (CONTRACT §5b)."""
    with anyio.fail_after(5):
        locker = Locker()

        async def catches_its_stop(fence: int) -> str:
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                return "partial"
            return "unreachable"

        async with TurnRegistry(locker=locker) as turns, anyio.create_task_group() as tg:
            raised: list[BaseException] = []

            async def caller() -> None:
                try:
                    await turns.run("conv", catches_its_stop)
                except LeaseLostError as error:
                    raised.append(error)

            tg.start_soon(caller)
            await wait_all_tasks_blocked()
            assert isinstance(locker.leases[0].lost, anyio.Event)
            locker.leases[0].lost.set()
        assert len(raised) == 1
        assert locker.leases[0].released


@pytest.mark.parametrize("failure", ["abort", "stray cancellation", "error"])
async def test_a_locker_raising_anything_refuses_the_turn(
    failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A BaseException used to tear the registry down; a cancellation of its own, too."""
    with anyio.fail_after(5):
        cause: BaseException = {"abort": Abort("abort"), "error": ConnectionError("down")}.get(
            failure
        ) or await a_stray_cancellation()
        refusals: list[BaseException] = []
        async with TurnRegistry(locker=Locker(acquire_fails_with=cause)) as turns:
            job = Job(fence_of, on_refused=refusals.append)
            turns.submit("conv", job)
            await job.wait()
            assert isinstance(job.error, CoordinationUnavailableError)
            assert job.error.__cause__ is cause
            assert refusals == [job.error]
            assert await turns.run("conv", fence_of) == 1, "the next turn gets a lease"
        assert logged(caplog, "could not lock conversation 'conv'") == [cause]


async def test_a_locker_misused_refuses_the_turn_with_its_own_usage_error() -> None:
    """A misuse (a Redis locker under trio) says why, not "retry the turn shortly"."""
    with anyio.fail_after(5):
        misuse = UsageError("this locker is asyncio-only")
        refused: list[BaseException] = []
        async with TurnRegistry(locker=Locker(acquire_fails_with=misuse)) as turns:
            job: Job[int] = Job(fence_of, on_refused=refused.append)
            turns.submit("c", job)
            await job.wait()
            assert job.error is misuse
            assert refused == [misuse]
            assert await turns.run("c", fence_of) == 1  # the next turn is served


@pytest.mark.parametrize("failure", ["abort", "stray cancellation"])
async def test_a_release_raising_anything_is_logged_and_the_queue_goes_on(
    failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(5):
        cause = Abort("abort") if failure == "abort" else await a_stray_cancellation()
        locker = Locker(release_fails_with=cause)
        async with TurnRegistry(locker=locker) as turns:
            first = Job(fence_of)
            turns.submit("conv", first)
            assert await turns.run("conv", fence_of) == 2
            assert first.result == 1
        assert [lease.released for lease in locker.leases] == [True, True]
        assert logged(caplog, "releasing the lease of conversation 'conv' failed") == [cause] * 2


async def test_a_lease_signal_that_fails_stops_the_turn_as_if_the_lease_was_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        broken = OSError("the renewal task died")

        class BrokenSignal:
            def is_set(self) -> bool:
                return False

            async def wait(self) -> None:
                await anyio.lowlevel.checkpoint()
                raise broken

        class BrokenLocker(Locker):
            async def acquire(self, conversation_id: str) -> Lease:
                lease = await super().acquire(conversation_id)
                lease.lost = BrokenSignal()
                return lease

        locker = BrokenLocker()
        async with TurnRegistry(locker=locker) as turns:
            job = Job(lambda fence: anyio.sleep_forever())
            turns.submit("conv", job)
            await job.wait()
            assert isinstance(job.error, LeaseLostError)
        assert [lease.released for lease in locker.leases] == [True]
        assert logged(caplog, "watching the lease of conversation 'conv' failed") == [broken]


async def test_a_lease_that_cannot_be_read_counts_as_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        unreadable = RuntimeError("no fence")
        ran: list[int] = []

        class Unreadable(Lease):
            @property
            def fence(self) -> int:
                raise unreadable

            @fence.setter
            def fence(self, value: int) -> None:
                pass

        class UnreadableLocker(Locker):
            async def acquire(self, conversation_id: str) -> Lease:
                lease = await super().acquire(conversation_id)
                lease.__class__ = Unreadable
                return lease

        async def turn(fence: int) -> None:
            ran.append(fence)

        locker = UnreadableLocker()
        async with TurnRegistry(locker=locker) as turns:
            with pytest.raises(LeaseLostError):
                await turns.run("conv", turn)
        assert ran == [], "the turn never ran"
        assert locker.leases[0].released
        assert logged(caplog, "the lease of conversation 'conv' cannot be read") == [unreadable]


async def test_on_dequeue_that_drains_refuses_its_turn_without_a_lease() -> None:
    with anyio.fail_after(5):
        locker = Locker()
        refusals: list[BaseException] = []
        async with TurnRegistry(locker=locker) as turns:
            gate = anyio.Event()

            async def gated(fence: int) -> None:
                await gate.wait()

            turns.submit("conv", Job(gated))
            job = Job(fence_of, on_dequeue=turns.drain, on_refused=refusals.append)
            turns.submit("conv", job)
            gate.set()
            await job.wait()
        assert isinstance(job.error, DrainingError)
        assert refusals == [job.error]
        assert len(locker.leases) == 1, "no lease was acquired for the refused turn"


# trio only: asyncio re-raises KeyboardInterrupt and SystemExit from any task straight out
# of the event loop, which is also what they do here.
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("where", ["acquire", "release"])
async def test_system_exit_from_the_locker_or_the_lease_ends_the_registry(where: str) -> None:
    with anyio.fail_after(5):
        stop = SystemExit(4)
        locker = Locker(**{f"{where}_fails_with": stop})
        job = Job(fence_of)

        async def serve() -> None:
            async with TurnRegistry(locker=locker) as turns:
                turns.submit("conv", job)
                await anyio.sleep_forever()

        with pytest.raises(BaseExceptionGroup) as info:
            await serve()
        assert info.group_contains(SystemExit)
        assert job.done
        if where == "release":
            assert job.result == 1, "the turn itself had succeeded"


class GrantsAnyway(Locker):
    """Catches the cancellation of its acquisition and grants the lease regardless."""

    async def acquire(self, conversation_id: str) -> Lease:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            pass
        lease = Lease(len(self.leases) + 1, None)
        self.leases.append(lease)
        return lease


@pytest.mark.parametrize("stop", ["drain", "interrupt", "shutdown"])
async def test_a_lease_granted_despite_a_cancelled_acquisition_is_given_back_unused(
    stop: str,
) -> None:
    """The turn's body used to run after drain(), interrupt or the block's exception."""
    with anyio.fail_after(5):
        locker = GrantsAnyway()
        ran: list[int] = []

        async def turn(fence: int) -> None:
            ran.append(fence)

        job = Job(turn)
        with pytest.raises(KeyError) if stop == "shutdown" else contextlib.nullcontext():
            async with TurnRegistry(locker=locker) as turns:
                turns.submit("conv", job)
                await wait_all_tasks_blocked()
                if stop == "drain":
                    turns.drain()
                elif stop == "interrupt":
                    turns.submit("conv", Job(fence_of), "interrupt")
                else:
                    raise KeyError
                await job.wait()
        assert ran == [], "the body never ran"
        expected = {"drain": DrainingError, "interrupt": TurnInterrupted}.get(stop, TurnInterrupted)
        assert isinstance(job.error, expected)
        assert locker.leases[0].released


async def test_a_locker_returning_none_refuses_the_turn(caplog: pytest.LogCaptureFixture) -> None:
    """It used to pass for a lease: the turn was reported done, with no error, never run."""
    with anyio.fail_after(5):

        class SaysNo(Locker):
            async def acquire(self, conversation_id: str) -> Lease:
                await anyio.lowlevel.checkpoint()
                return None  # type: ignore[return-value]

        async with TurnRegistry(locker=SaysNo()) as turns:
            with pytest.raises(CoordinationUnavailableError) as raised:
                await turns.run("conv", fence_of)
        assert isinstance(raised.value.__cause__, TypeError)
        assert logged(caplog, "could not lock conversation 'conv'") == [raised.value.__cause__]

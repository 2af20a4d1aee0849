"""Job (CONTRACT §3, §5b): the value, and how a turn's outcome is decided, on asyncio and trio.

The rules live in ``_turns/job.py``; they are exercised through a real :class:`TurnRegistry`,
since only a registry takes a job's turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked

from lovely_coordinator import InvalidArgumentTypeError
from lovely_coordinator.turns import DrainingError, Job, TurnInterrupted, TurnRegistry

from ..base.outcome_helpers import Abort, a_stray_cancellation

pytestmark = pytest.mark.anyio


async def forever(fence: int) -> None:
    await anyio.sleep_forever()


async def answer(fence: int) -> str:
    await anyio.lowlevel.checkpoint()
    return "answer"


def turn_failures(caplog: pytest.LogCaptureFixture) -> list[BaseException]:
    return [
        r.exc_info[1]
        for r in caplog.records
        if r.name == "lovely_coordinator.turns" and r.exc_info and r.exc_info[1] is not None
    ]


# -- the value ---------------------------------------------------------------------------


def test_a_job_can_be_built_outside_an_event_loop() -> None:
    job = Job(forever)
    assert (job.done, job.dropped, job.error, job.result) == (False, False, None, None)
    assert repr(job) == "<Job new error=None>"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"run": None}, "run must be callable: an async function taking the fence"),
        ({"run": "answer"}, "run must be callable: an async function taking the fence"),
        ({"run": answer, "on_dequeue": 3}, "on_dequeue must be callable or None"),
        ({"run": answer, "on_refused": "log"}, "on_refused must be callable or None"),
    ],
)
def test_callables_are_checked_when_the_job_is_built(
    arguments: dict[str, object], message: str
) -> None:
    """They used to be accepted, and failed only when the turn ran (a bare TypeError)."""
    with pytest.raises(InvalidArgumentTypeError, match=f"^{message}$") as info:
        Job(**arguments)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError)


async def test_result_holds_what_run_returned() -> None:
    with anyio.fail_after(5):

        async def fails(fence: int) -> int:
            raise ValueError("no")

        async with TurnRegistry() as turns:
            ok: Job[str] = Job(answer)
            failed: Job[int] = Job(fails)
            turns.submit("conv", ok)
            turns.submit("conv", failed)
            results_before = (ok.result, failed.result)
            assert results_before == (None, None), "nothing before the turn returned"
            await failed.wait()
            assert ok.result == "answer"
            assert isinstance(failed.error, ValueError)
            assert failed.result is None
            dropped = Job(answer)
            turns.submit("conv", Job(answer))
            turns.submit("conv", dropped)
            turns.submit("conv", Job(answer), "replace_queued")
            assert (dropped.done, dropped.dropped, dropped.error, dropped.result) == (
                True,
                True,
                None,
                None,
            )
            assert await turns.run("conv", answer) == "answer"
        assert repr(ok) == "<Job done error=None>"


# -- a cancellation the turn raised itself (bug 2) -----------------------------------------


async def raises_a_stray_cancellation(fence: int) -> None:
    """Raises a cancellation that nothing outside the turn asked for."""
    raise await a_stray_cancellation()


async def awaits_a_future_cancelled_elsewhere(fence: int) -> None:
    future = asyncio.get_running_loop().create_future()
    future.cancel()  # as another task might: the turn itself is not cancelled
    await future


async def check_a_stray_cancellation_fails_only_its_turn(
    turn: Callable[[int], Awaitable[None]], caplog: pytest.LogCaptureFixture
) -> None:
    gate = anyio.Event()
    block_went_on = False

    async def gated(fence: int) -> str:
        await gate.wait()
        return "other conversation"

    async with TurnRegistry() as turns:
        other = Job(gated)
        turns.submit("other", other)
        victim = Job(turn)
        turns.submit("conv", victim)
        queued = Job(answer)
        turns.submit("conv", queued)
        await victim.wait()
        await wait_all_tasks_blocked()  # the block is not cancelled, nor is anything else
        assert isinstance(victim.error, anyio.get_cancelled_exc_class())
        with pytest.raises(
            TurnInterrupted, match=r"^the turn ended by a cancellation it raised itself$"
        ) as info:
            await turns.run("conv", turn)  # never a bare cancellation in the caller
        assert isinstance(info.value.__cause__, anyio.get_cancelled_exc_class())
        assert not other.done
        gate.set()
        assert await turns.run("conv", answer) == "answer"
        block_went_on = True
    assert block_went_on
    assert (other.result, queued.result) == ("other conversation", "answer")
    assert turn_failures(caplog)[:1] == [victim.error]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_turn_awaiting_a_future_cancelled_elsewhere_fails_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its CancelledError used to cancel the registry's block and every conversation."""
    with anyio.fail_after(5):
        await check_a_stray_cancellation_fails_only_its_turn(
            awaits_a_future_cancelled_elsewhere, caplog
        )


async def test_a_turn_raising_a_stray_cancellation_fails_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        await check_a_stray_cancellation_fails_only_its_turn(raises_a_stray_cancellation, caplog)


# -- the stop decides (bug 3) --------------------------------------------------------------


async def catches_its_stop(fence: int) -> str:
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        return "partial"  # swallows its cancellation and returns
    return "unreachable"


async def test_a_turn_that_catches_its_interruption_and_returns_ends_interrupted() -> None:
    """It used to end as a success, with its partial result."""
    with anyio.fail_after(5):
        raised: list[BaseException] = []
        async with TurnRegistry() as turns, anyio.create_task_group() as tg:

            async def caller() -> None:
                try:
                    await turns.run("conv", catches_its_stop)
                except TurnInterrupted as error:
                    raised.append(error)

            tg.start_soon(caller)
            await wait_all_tasks_blocked()
            assert await turns.run("conv", answer, "interrupt") == "answer"
        assert len(raised) == 1


@pytest.mark.parametrize("how", ["an exception", "an enclosing cancel scope"])
async def test_a_turn_that_catches_the_shutdown_and_returns_ends_interrupted(how: str) -> None:
    with anyio.fail_after(5):
        victim = Job(catches_its_stop)
        queued = Job(answer)
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
            except LookupError:
                pass
        assert isinstance(victim.error, TurnInterrupted)
        assert victim.result is None
        assert isinstance(queued.error, DrainingError), "the queued turn never started"


# -- BaseException subclasses that are not cancellation (bug 4) ----------------------------


async def test_a_turn_raising_a_base_exception_fails_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It used to tear the registry down, and with it every conversation."""
    with anyio.fail_after(5):
        abort = Abort("framework abort")
        gate = anyio.Event()

        async def aborts(fence: int) -> None:
            raise abort

        async def gated(fence: int) -> str:
            await gate.wait()
            return "other conversation"

        async with TurnRegistry() as turns:
            other = Job(gated)
            turns.submit("other", other)
            victim = Job(aborts)
            turns.submit("conv", victim)
            queued = Job(answer)
            turns.submit("conv", queued)
            await queued.wait()
            assert victim.error is abort
            assert queued.result == "answer"
            with pytest.raises(Abort):  # run re-raises the turn's own exception
                await turns.run("conv", aborts)
            assert not other.done
            gate.set()
        assert other.result == "other conversation"
        assert turn_failures(caplog)[:1] == [abort]


async def test_callbacks_raising_anything_are_logged_and_the_turn_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        gate = anyio.Event()
        stray = await a_stray_cancellation()
        abort = Abort("callback abort")

        def aborts() -> None:
            raise abort

        def raises_the_stray_cancellation() -> None:
            raise stray

        async def gated(fence: int) -> None:
            await gate.wait()

        async with TurnRegistry() as turns:
            turns.submit("conv", Job(gated))
            first = Job(answer, on_dequeue=aborts)
            second = Job(answer, on_dequeue=raises_the_stray_cancellation)
            turns.submit("conv", first)
            turns.submit("conv", second)
            gate.set()
            await second.wait()
            assert (first.result, second.result) == ("answer", "answer")
        assert turn_failures(caplog) == [abort, stray]


# trio only: asyncio re-raises KeyboardInterrupt and SystemExit from any task straight out
# of the event loop, which is also what they do here.
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("stop", [SystemExit(3), KeyboardInterrupt()])
async def test_system_exit_and_keyboard_interrupt_are_recorded_then_end_the_registry(
    stop: BaseException,
) -> None:
    with anyio.fail_after(5):

        async def stops_the_program(fence: int) -> None:
            raise stop

        def stops_the_program_at_dequeue() -> None:
            raise stop

        other = Job(forever)
        victim = Job(stops_the_program)
        queued = Job(answer, on_dequeue=stops_the_program_at_dequeue)

        async def serve() -> None:
            async with TurnRegistry() as turns:
                turns.submit("other", other)
                turns.submit("conv", Job(answer))
                turns.submit("conv", queued)
                turns.submit("third", victim)
                await anyio.sleep_forever()

        with pytest.raises(BaseExceptionGroup) as info:
            await serve()
        assert info.group_contains(type(stop))
        assert victim.error is stop
        assert isinstance(other.error, TurnInterrupted)
        assert queued.done, "its callback ended the registry before its turn"
        assert queued.result is None


# -- the helpers the rules are made of -----------------------------------------------------

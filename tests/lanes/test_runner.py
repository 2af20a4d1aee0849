"""Lanes (CONTRACT §2) on asyncio and trio: scheduling, stops, finalizers, on_exit, time."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal, get_args

import anyio
import anyio.abc
import pytest
from trio.testing import MockClock

import lovely_coordinator.lanes as lanes_module
from lovely_coordinator import InvalidArgumentError, InvalidArgumentTypeError
from lovely_coordinator._base.errors import UsageError
from lovely_coordinator._lanes.runner import _Run
from lovely_coordinator.lanes import (
    ActivationFailed,
    ActivationInterrupted,
    ActivationSucceeded,
    Exit,
    LaneQueueFull,
    Lanes,
    LanesClosed,
    LanesConfigInvalid,
    LaneSnapshot,
    LanesStatus,
    create_lanes,
    current_activation,
)

from ..base.outcome_helpers import Abort, a_stray_cancellation

pytestmark = pytest.mark.anyio

TRIO_MOCK = pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock")],
)

TIMED = pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock"),
        pytest.param("asyncio", id="asyncio-real-time"),
    ],
)

settle = anyio.wait_all_tasks_blocked


class Clock:
    """Test durations: exact virtual seconds on trio's MockClock, hundredths of real
    seconds on asyncio (where a time is checked only to lie in a window after it)."""

    def __init__(self, anyio_backend: object) -> None:
        self.exact = anyio_backend != "asyncio"
        self.scale = 1.0 if self.exact else 0.01

    def __call__(self, seconds: float) -> float:
        return seconds * self.scale

    def at(self, actual: float, expected: float) -> bool:
        if self.exact:
            return actual == expected
        return expected - 1e-3 <= actual < expected + 0.25


@pytest.fixture
def clock(anyio_backend: object) -> Clock:
    return Clock(anyio_backend)


class Probe:
    """Activations that run until released, and a log of what happened, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.exits: list[Exit] = []
        self.releases: dict[str, anyio.Event] = {}

    async def activate(self, key: str) -> None:
        self.log.append(("start", key))
        release = self.releases[key] = anyio.Event()
        await release.wait()

    def release(self, key: str) -> None:
        self.releases.pop(key).set()

    def on_exit(self, outcome: Exit) -> None:
        self.exits.append(outcome)
        self.log.append(("exit", outcome.key))

    def starts(self) -> list[str]:
        return [key for what, key in self.log if what == "start"]


@asynccontextmanager
async def probed(
    max_concurrent: int, max_queued: int | None = None, turn_timeout: float | None = None
) -> AsyncIterator[tuple[Lanes, Probe]]:
    probe = Probe()
    async with create_lanes(
        max_concurrent,
        max_queued,
        turn_timeout,
        activate=probe.activate,
        on_exit=probe.on_exit,
    ) as lanes:
        yield lanes, probe


def test_all_is_the_contract() -> None:
    assert lanes_module.__all__ == [
        "Activation",
        "ActivationFailed",
        "ActivationInterrupted",
        "ActivationSucceeded",
        "Exit",
        "LaneQueueFull",
        "LaneSnapshot",
        "Lanes",
        "LanesClosed",
        "LanesConfig",
        "LanesConfigInvalid",
        "LanesStatus",
        "create_lanes",
        "current_activation",
    ]
    for name in lanes_module.__all__:
        if name != "Exit":  # a type alias: a union has no module of its own
            assert getattr(lanes_module, name).__module__.startswith("lovely_coordinator.")
    assert get_args(Exit) == (ActivationSucceeded, ActivationFailed, ActivationInterrupted)


# --- configuration (LanesConfig itself: tests/lanes/test_types.py) ------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"max_concurrent": 0},
        {"max_concurrent": 1, "max_queued": -1},
        {"max_concurrent": 1, "turn_timeout": 0},
    ],
)
def test_create_lanes_validates_its_settings_at_once(settings: dict[str, object]) -> None:
    with pytest.raises(LanesConfigInvalid, match=r"^Invalid lanes config: ") as info:
        create_lanes(activate=Probe().activate, **settings)  # type: ignore[arg-type]
    assert type(info.value) is LanesConfigInvalid  # never a bare pydantic error


@pytest.mark.parametrize(
    ("callables", "message"),
    [
        ({"activate": "nope"}, "activate must be callable"),
        ({"activate": None}, "activate must be callable"),
        ({"activate": Probe().activate, "on_exit": 3}, "on_exit must be callable or None"),
    ],
)
def test_create_lanes_rejects_uncallables_at_once(
    callables: dict[str, object], message: str
) -> None:
    """They used to raise a plain LanesConfigInvalid, which no TypeError handler caught."""
    with pytest.raises(LanesConfigInvalid, match=f"^Invalid lanes config: {message}$") as info:
        create_lanes(1, **callables)  # type: ignore[arg-type]
    assert isinstance(info.value, InvalidArgumentTypeError)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, ValueError)


# --- scheduling ------------------------------------------------------------------------


async def test_wake_starts_queues_and_coalesces() -> None:
    with anyio.fail_after(5):
        async with probed(2, max_queued=2) as (lanes, probe):
            assert lanes.wake("a") == "started"
            assert lanes.wake("b") == "started"
            assert lanes.wake("c") == "queued"
            assert lanes.wake("a") == "coalesced"
            assert lanes.wake("c") == "coalesced"
            assert lanes.status() == LanesStatus(
                running=2,
                queued=1,
                closed=False,
                lanes=(
                    LaneSnapshot("a", "running", True),
                    LaneSnapshot("b", "running", False),
                    LaneSnapshot("c", "queued", True),
                ),
            )
            await settle()
            assert sorted(probe.starts()) == ["a", "b"]  # trio runs new tasks in any order


async def test_many_wakes_of_a_queued_or_running_lane_make_one_activation() -> None:
    with anyio.fail_after(5):
        async with probed(1) as (lanes, probe):
            lanes.wake("a")
            await settle()
            for _ in range(5):
                assert lanes.wake("a") == "coalesced"
                assert lanes.wake("b") in {"queued", "coalesced"}
            probe.release("a")
            await settle()
            probe.release("b")
            await settle()
            probe.release("a")
            await settle()
            assert probe.starts() == ["a", "b", "a"]
            assert lanes.status().lanes == ()


async def test_slots_hand_off_in_fifo_order_and_a_rewoken_lane_waits_at_the_tail() -> None:
    with anyio.fail_after(5):
        async with probed(1) as (lanes, probe):
            lanes.wake("a")
            lanes.wake("b")
            lanes.wake("c")
            await settle()
            assert lanes.wake("a") == "coalesced"  # owed after b and c
            assert lanes.wake("d") == "queued"
            for key in ["a", "b", "c", "d"]:
                probe.release(key)
                await settle()
            probe.release("a")
            await settle()
            assert probe.starts() == ["a", "b", "c", "d", "a"]
            assert [e.key for e in probe.exits] == ["a", "b", "c", "d", "a"]
            assert all(isinstance(e, ActivationSucceeded) for e in probe.exits)


async def test_a_full_queue_refuses_and_changes_nothing() -> None:
    with anyio.fail_after(5):
        async with probed(1, max_queued=1) as (lanes, probe):
            lanes.wake("a")
            lanes.wake("b")
            before = lanes.status()
            with pytest.raises(LaneQueueFull) as info:
                lanes.wake("c")
            assert (info.value.key, info.value.max_queued) == ("c", 1)
            assert lanes.status() == before
            assert lanes.wake("a") == "coalesced"  # coalescing never checks capacity
            await settle()
            assert probe.starts() == ["a"]


async def test_max_queued_zero_still_serves_a_rewoken_running_lane() -> None:
    with anyio.fail_after(5):
        async with probed(1, max_queued=0) as (lanes, probe):
            lanes.wake("a")
            await settle()
            with pytest.raises(LaneQueueFull):
                lanes.wake("b")
            assert lanes.wake("a") == "coalesced"
            probe.release("a")
            await settle()
            assert probe.starts() == ["a", "a"]
            assert lanes.status().lanes == (LaneSnapshot("a", "running", False),)


async def test_non_string_key_is_rejected() -> None:
    with anyio.fail_after(5):
        async with probed(1) as (lanes, _):
            with pytest.raises(InvalidArgumentError, match=r"^Lane keys must be strings$"):
                lanes.wake(b"a")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"^Lane keys must be strings$"):
                await lanes.cancel(["a"])  # type: ignore[arg-type]
            assert lanes.status().lanes == ()


async def test_a_wake_from_another_thread_is_refused_and_changes_nothing() -> None:
    """It used to record the activation, then fail to spawn its task: the slot leaked and
    close() (so leaving the block) hung for good."""
    with anyio.fail_after(5):
        async with probed(1) as (lanes, probe):
            before = lanes.status()
            with pytest.raises(UsageError, match=r"^Lanes.wake\(\) was called from another thread"):
                await anyio.to_thread.run_sync(lanes.wake, "a")
            assert lanes.status() == before
            assert await anyio.to_thread.run_sync(anyio.from_thread.run_sync, lanes.wake, "a") == (
                "started"
            )
            await settle()
            probe.release("a")
        assert probe.starts() == ["a"]


async def test_repr_shows_the_counts() -> None:
    with anyio.fail_after(5):
        async with probed(1) as (lanes, _):
            lanes.wake("a")
            lanes.wake("b")
            assert repr(lanes) == "<Lanes 1/1 running, 1 queued>"
        assert repr(lanes) == "<Lanes 0/1 running, 0 queued, closed>"


async def test_a_lane_woken_by_its_own_activation_or_on_exit_runs_once_more() -> None:
    with anyio.fail_after(5):
        runs: list[str] = []
        own: list[Lanes] = []

        async def activate(key: str) -> None:
            runs.append(key)
            if runs.count(key) == 1:
                assert own[0].wake(key) == "coalesced"

        def on_exit(outcome: Exit) -> None:
            if runs.count(outcome.key) == 2:
                assert own[0].wake(outcome.key) == "coalesced"

        async with create_lanes(1, activate=activate, on_exit=on_exit) as lanes:
            own.append(lanes)
            lanes.wake("a")
            lanes.wake("b")
            await settle()
            assert runs == ["a", "b", "a", "b", "a", "b"]


# --- cancel ----------------------------------------------------------------------------


async def test_cancel_a_queued_lane_drops_it_without_a_report() -> None:
    with anyio.fail_after(5):
        async with probed(1) as (lanes, probe):
            lanes.wake("a")
            lanes.wake("b")
            await lanes.cancel("b")
            assert lanes.status().lanes == (LaneSnapshot("a", "running", False),)
            await settle()
            probe.release("a")
            await settle()
            assert probe.starts() == ["a"]
            assert probe.exits == [ActivationSucceeded("a")]
            assert lanes.wake("b") == "started"  # wakes after a cancel are served as usual


async def test_cancel_an_idle_lane_returns_at_once() -> None:
    with anyio.fail_after(5):
        async with probed(1) as (lanes, probe):
            await lanes.cancel("nobody")
            assert probe.log == []


async def test_cancel_waits_for_finalizers_and_on_exit_and_the_slot_is_already_handed_on() -> None:
    with anyio.fail_after(5):
        finalizer_may_end = anyio.Event()
        on_exit_may_end = anyio.Event()
        log: list[str] = []
        seen_when_cancel_returned: list[LanesStatus] = []

        async def finalizer() -> None:
            log.append("finalizer")
            await finalizer_may_end.wait()

        async def activate(key: str) -> None:
            log.append(f"start {key}")
            activation = current_activation()
            assert activation is not None
            activation.exit_stack.push_async_callback(finalizer)
            await anyio.sleep_forever()

        async def on_exit(outcome: Exit) -> None:
            log.append(f"exit {outcome}")
            await on_exit_may_end.wait()

        async with (
            create_lanes(1, activate=activate, on_exit=on_exit) as lanes,
            anyio.create_task_group() as tg,
        ):

            async def cancel_a() -> None:
                await lanes.cancel("a")
                seen_when_cancel_returned.append(lanes.status())

            lanes.wake("a")
            lanes.wake("b")
            await settle()
            tg.start_soon(cancel_a)
            await settle()
            assert log == ["start a", "finalizer"]
            finalizer_may_end.set()
            await settle()
            assert log[-1] == "exit ActivationInterrupted(key='a', reason='cancel')"
            assert not seen_when_cancel_returned
            on_exit_may_end.set()
            await settle()
            # When cancel returned, b already held the slot (its task may not have run yet).
            assert seen_when_cancel_returned == [
                LanesStatus(1, 0, False, (LaneSnapshot("b", "running", False),))
            ]
            assert log[-1] == "start b"


async def test_cancel_drops_the_follow_up_of_a_running_lane() -> None:
    with anyio.fail_after(5):
        async with probed(1) as (lanes, probe):
            lanes.wake("a")
            await settle()
            lanes.wake("a")
            await lanes.cancel("a")
            await settle()
            assert probe.starts() == ["a"]
            assert probe.exits == [ActivationInterrupted("a", "cancel")]
            assert lanes.status().lanes == ()


async def test_an_activation_stopped_before_its_task_ran_never_calls_activate() -> None:
    with anyio.fail_after(5):
        async with probed(2) as (lanes, probe):
            assert lanes.wake("a") == "started"
            await lanes.cancel("a")  # its task had not run yet
            assert lanes.wake("b") == "started"
            await lanes.close()
            assert probe.starts() == []
            assert probe.exits == [
                ActivationInterrupted("a", "cancel"),
                ActivationInterrupted("b", "close"),
            ]


async def test_a_cancelled_cancel_caller_still_stops_the_activation() -> None:
    with anyio.fail_after(5):
        on_exit_may_end = anyio.Event()
        exits: list[Exit] = []

        async def on_exit(outcome: Exit) -> None:
            exits.append(outcome)
            await on_exit_may_end.wait()

        async with create_lanes(1, activate=Probe().activate, on_exit=on_exit) as lanes:
            lanes.wake("a")
            await settle()
            with anyio.move_on_after(0.01):
                await lanes.cancel("a")
            assert exits == [ActivationInterrupted("a", "cancel")]
            assert lanes.status().running == 1  # on_exit still runs, shielded
            on_exit_may_end.set()
            await settle()
            assert lanes.status().running == 0


async def test_cancel_from_inside_the_activation_interrupts_it() -> None:
    with anyio.fail_after(5):
        exits: list[Exit] = []
        reported = anyio.Event()
        own: list[Lanes] = []

        async def activate(key: str) -> None:
            await own[0].cancel(key)
            raise AssertionError("not reached: cancel interrupts its own activation")

        def on_exit(outcome: Exit) -> None:
            exits.append(outcome)
            reported.set()

        async with create_lanes(1, activate=activate, on_exit=on_exit) as lanes:
            own.append(lanes)
            lanes.wake("a")
            # Not settle(): on asyncio it can return while anyio still delivers a
            # cancellation a task requested of its own scope.
            await reported.wait()
            assert exits == [ActivationInterrupted("a", "cancel")]


# --- close -----------------------------------------------------------------------------


async def test_close_refuses_wakes_drops_the_queue_and_interrupts_what_runs() -> None:
    with anyio.fail_after(5):
        async with probed(1) as (lanes, probe):
            lanes.wake("a")
            lanes.wake("b")
            await settle()
            lanes.wake("a")
            await lanes.close()
            assert probe.starts() == ["a"]
            assert probe.exits == [ActivationInterrupted("a", "close")]  # b was never recorded
            assert lanes.status() == LanesStatus(0, 0, True, ())
            with pytest.raises(LanesClosed) as info:
                lanes.wake("c")
            assert info.value.key == "c"
            await lanes.close()  # idempotent
            await lanes.cancel("a")
        assert probe.exits == [ActivationInterrupted("a", "close")]


async def test_a_second_close_waits_for_what_still_runs() -> None:
    with anyio.fail_after(5):
        on_exit_may_end = anyio.Event()
        closed: list[int] = []

        async def on_exit(outcome: Exit) -> None:
            await on_exit_may_end.wait()

        async with (
            create_lanes(1, activate=Probe().activate, on_exit=on_exit) as lanes,
            anyio.create_task_group() as tg,
        ):

            async def close(n: int) -> None:
                await lanes.close()
                closed.append(n)

            lanes.wake("a")
            await settle()
            tg.start_soon(close, 1)
            await settle()
            tg.start_soon(close, 2)
            await settle()
            assert closed == []
            on_exit_may_end.set()
            await settle()
            assert sorted(closed) == [1, 2]


async def test_leaving_the_block_closes_and_waits() -> None:
    with anyio.fail_after(5):
        async with probed(2) as (lanes, probe):
            lanes.wake("a")
            lanes.wake("b")
            lanes.wake("c")
            await settle()
        assert sorted(probe.exits, key=lambda e: e.key) == [
            ActivationInterrupted("a", "close"),
            ActivationInterrupted("b", "close"),
        ]
        assert lanes.status().closed
        with pytest.raises(LanesClosed):
            lanes.wake("a")


async def test_an_error_or_cancellation_in_the_block_still_closes() -> None:
    with anyio.fail_after(5):
        probe = Probe()

        async def fail_in_the_block() -> None:
            async with create_lanes(1, activate=probe.activate, on_exit=probe.on_exit) as lanes:
                lanes.wake("a")
                await settle()
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):  # unwrapped, on trio too
            await fail_in_the_block()
        with anyio.CancelScope() as scope:
            async with create_lanes(1, activate=probe.activate, on_exit=probe.on_exit) as lanes:
                lanes.wake("b")
                await settle()
                scope.cancel()
                await anyio.sleep_forever()
        assert probe.exits == [
            ActivationInterrupted("a", "close"),
            ActivationInterrupted("b", "close"),
        ]


async def test_a_lanes_context_cannot_be_entered_twice() -> None:
    with anyio.fail_after(5):
        probe = Probe()
        scope = create_lanes(1, activate=probe.activate, on_exit=probe.on_exit)
        async with scope as lanes:
            with pytest.raises(
                UsageError,
                match=r"^this create_lanes\(\) context manager is already entered: one 'async with'"
                r" block owns its lanes; share the Lanes it gave instead of entering it again$",
            ) as info:
                await scope.__aenter__()
            assert isinstance(info.value, RuntimeError)
            assert lanes.wake("a") == "started", "the lanes are untouched"
            await settle()
        with pytest.raises(
            UsageError,
            match=r"^a create_lanes\(\) context manager can be entered only once: leaving its"
            r" block closed its lanes for good; call create_lanes\(\) again$",
        ):
            await scope.__aenter__()
        assert probe.exits == [ActivationInterrupted("a", "close")]


# --- outcomes, finalizers and on_exit ---------------------------------------------------


async def test_outcomes_of_bodies_that_end_by_themselves() -> None:
    with anyio.fail_after(5):
        error = ValueError("bad turn")
        exits: list[Exit] = []

        async def activate(key: str) -> None:
            if key == "fails":
                raise error

        def raises_synchronously(key: str) -> None:  # not even a coroutine function
            raise error

        async with create_lanes(2, activate=activate, on_exit=exits.append) as lanes:
            lanes.wake("ok")
            lanes.wake("fails")
            await settle()
        assert sorted(exits, key=lambda e: e.key) == [
            ActivationFailed("fails", error),
            ActivationSucceeded("ok"),
        ]
        exits.clear()
        async with create_lanes(
            1,
            activate=raises_synchronously,  # type: ignore[arg-type]
            on_exit=exits.append,
        ) as lanes:
            assert lanes.wake("x") == "started"
            await settle()
            assert lanes.wake("x") == "started"  # the lane keeps working
            await settle()
        assert exits == [ActivationFailed("x", error), ActivationFailed("x", error)]


async def test_finalizers_run_after_the_body_and_a_stop_during_them_keeps_the_outcome() -> None:
    with anyio.fail_after(5):
        error = KeyError("body")
        in_finalizer = {key: anyio.Event() for key in ("ok", "fails")}
        finalizers_may_end = anyio.Event()
        order: list[str] = []
        exits: list[Exit] = []

        async def finalizer(key: str) -> None:
            order.append(f"finalizer {key}")
            in_finalizer[key].set()
            await finalizers_may_end.wait()  # shielded: the stop below does not cut it short
            await anyio.lowlevel.checkpoint()
            order.append(f"finalizer {key} done")

        async def activate(key: str) -> None:
            activation = current_activation()
            assert activation is not None
            activation.exit_stack.push_async_callback(finalizer, key)
            order.append(f"body {key}")
            if key == "fails":
                raise error

        async with create_lanes(2, activate=activate, on_exit=exits.append) as lanes:
            lanes.wake("ok")
            lanes.wake("fails")
            await in_finalizer["ok"].wait()
            await in_finalizer["fails"].wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(lanes.cancel, "ok")
                tg.start_soon(lanes.close)
                await settle()
                finalizers_may_end.set()
        assert set(order) == {
            "body ok",
            "body fails",
            "finalizer ok",
            "finalizer fails",
            "finalizer ok done",
            "finalizer fails done",
        }
        assert order.index("body ok") < order.index("finalizer ok")
        assert sorted(exits, key=lambda e: e.key) == [
            ActivationFailed("fails", error),
            ActivationSucceeded("ok"),
        ]


# trio only: asyncio re-raises a SystemExit from any task straight out of the event loop.
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_system_exit_in_a_body_is_reported_then_ends_the_lanes() -> None:
    with anyio.fail_after(5):
        exits: list[Exit] = []

        async def activate(key: str) -> None:
            if key == "exit":
                raise SystemExit(3)
            await anyio.sleep_forever()

        async def run() -> None:
            async with create_lanes(2, activate=activate, on_exit=exits.append) as lanes:
                lanes.wake("other")
                lanes.wake("exit")
                await anyio.sleep_forever()

        with pytest.raises(BaseExceptionGroup) as info:
            await run()
        assert info.group_contains(SystemExit)
        by_key = {e.key: e for e in exits}
        assert len(exits) == len(by_key) == 2
        assert by_key["other"] == ActivationInterrupted("other", "close")
        failed = by_key["exit"]
        assert isinstance(failed, ActivationFailed)
        assert isinstance(failed.cause, SystemExit)


# trio only, as above.
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_system_exit_from_a_stopped_body_still_ends_the_lanes() -> None:
    """The stop decided the outcome, and the SystemExit used to vanish with the body's
    cause."""
    with anyio.fail_after(5):
        exits: list[Exit] = []

        async def activate(key: str) -> None:
            try:
                await anyio.sleep_forever()
            finally:
                raise SystemExit(3)

        async def run() -> None:
            async with create_lanes(1, activate=activate, on_exit=exits.append) as lanes:
                lanes.wake("a")
                await settle()
                await lanes.cancel("a")
                await anyio.sleep_forever()

        with pytest.raises(BaseExceptionGroup) as info:
            await run()
        assert info.group_contains(SystemExit)
        assert exits == [ActivationInterrupted("a", "cancel")]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_body_that_interrupts_itself_has_failed() -> None:
    with anyio.fail_after(5):
        exits: list[Exit] = []

        async def activate(key: str) -> None:
            if key == "raises":
                raise asyncio.CancelledError
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # not a stop by the lanes
            await asyncio.sleep(1)

        async with create_lanes(2, activate=activate, on_exit=exits.append) as lanes:
            lanes.wake("raises")
            lanes.wake("cancels itself")
            await settle()
            assert lanes.wake("raises") == "started"  # the lane keeps working
            await settle()
        assert [(type(e), e.key) for e in exits] == [
            (ActivationFailed, "raises"),
            (ActivationFailed, "cancels itself"),
            (ActivationFailed, "raises"),
        ]
        assert all(isinstance(e.cause, asyncio.CancelledError) for e in exits)  # type: ignore[union-attr]


async def test_a_raising_finalizer_fails_the_activation_with_only_its_error() -> None:
    with anyio.fail_after(5):
        finalizer_error = OSError("cleanup")
        exits: list[Exit] = []

        async def broken() -> None:
            raise finalizer_error

        async def activate(key: str) -> None:
            activation = current_activation()
            assert activation is not None
            activation.exit_stack.push_async_callback(broken)
            if key == "fails":
                raise ValueError("body")
            if key == "stopped":
                await anyio.sleep_forever()

        async with create_lanes(3, activate=activate, on_exit=exits.append) as lanes:
            for key in ("ok", "fails", "stopped"):
                lanes.wake(key)
            await settle()
            await lanes.cancel("stopped")
        assert sorted(exits, key=lambda e: e.key) == [
            ActivationFailed("fails", finalizer_error),
            ActivationFailed("ok", finalizer_error),
            ActivationFailed("stopped", finalizer_error),
        ]


async def test_a_stop_during_the_bodys_own_finally_is_an_interruption() -> None:
    with anyio.fail_after(5):
        in_finally = anyio.Event()
        exits: list[Exit] = []

        async def activate(key: str) -> None:
            try:
                pass
            finally:
                in_finally.set()
                await anyio.sleep_forever()

        async with create_lanes(1, activate=activate, on_exit=exits.append) as lanes:
            lanes.wake("a")
            await in_finally.wait()
            await lanes.cancel("a")
        assert exits == [ActivationInterrupted("a", "cancel")]


async def test_an_error_a_stopped_body_raises_is_logged_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The stop decides the outcome; the body's error beside it used to vanish without a
    trace (CONTRACT §5b: recorded on the exit, or logged)."""
    with anyio.fail_after(5):
        broken = RuntimeError("cleanup failed")
        exits: list[Exit] = []

        async def activate(key: str) -> None:
            try:
                await anyio.sleep_forever()
            finally:
                raise broken

        async with create_lanes(1, activate=activate, on_exit=exits.append) as lanes:
            lanes.wake("a")
            await settle()
            await lanes.cancel("a")
        assert exits == [ActivationInterrupted("a", "cancel")]
        records = [r for r in caplog.records if "activation of 'a' failed while" in r.getMessage()]
        assert [r.exc_info[1] if r.exc_info else None for r in records] == [broken]


async def test_on_exit_runs_shielded_and_the_slot_passes_on_only_after_it_returns() -> None:
    with anyio.fail_after(5):
        probe = Probe()
        in_on_exit = anyio.Event()
        on_exit_may_end = anyio.Event()

        async def on_exit(outcome: Exit) -> None:
            probe.log.append(("on_exit", outcome.key))
            in_on_exit.set()
            await on_exit_may_end.wait()
            await anyio.lowlevel.checkpoint()  # a stop cannot cut it short
            probe.log.append(("on_exit done", outcome.key))

        async with create_lanes(1, activate=probe.activate, on_exit=on_exit) as lanes:
            lanes.wake("a")
            lanes.wake("b")
            await settle()
            probe.release("a")
            await in_on_exit.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(lanes.cancel, "a")
                await settle()
                assert lanes.status().running == 1
                assert probe.starts() == ["a"]
                on_exit_may_end.set()
            await settle()
            assert probe.log == [
                ("start", "a"),
                ("on_exit", "a"),
                ("on_exit done", "a"),
                ("start", "b"),
            ]


async def test_an_on_exit_error_is_logged_as_a_warning_and_the_lane_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):

        async def activate(key: str) -> None:
            pass

        def on_exit(outcome: Exit) -> None:
            raise RuntimeError("report failed")

        caplog.set_level(logging.WARNING, logger="lovely_coordinator")
        async with create_lanes(1, activate=activate, on_exit=on_exit) as lanes:
            lanes.wake("room:1")
            await settle()
            assert lanes.wake("room:1") == "started"
            await settle()
        records = [r for r in caplog.records if "on_exit failed for room:1" in r.getMessage()]
        assert len(records) == 2
        assert records[0].levelno == logging.WARNING
        assert records[0].exc_info is not None
        assert isinstance(records[0].exc_info[1], RuntimeError)


async def test_without_on_exit_activations_still_run() -> None:
    with anyio.fail_after(5):
        ran: list[str] = []

        async def activate(key: str) -> None:
            ran.append(key)

        async with create_lanes(1, activate=activate) as lanes:
            lanes.wake("a")
            lanes.wake("b")
            await settle()
        assert ran == ["a", "b"]


ON_EXIT_FAILURES = pytest.mark.parametrize(
    ("anyio_backend", "failure"),
    [
        *[(backend, failure) for backend in ("asyncio", "trio") for failure in ("stray", "abort")],
        ("asyncio", "asyncio.CancelledError()"),
    ],
)


@ON_EXIT_FAILURES
async def test_whatever_on_exit_raises_is_logged_and_contained(
    failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancellation of its own used to escape the lanes unlogged; a BaseException too."""
    with anyio.fail_after(5):
        raised: BaseException
        if failure == "stray":  # a real cancellation, caught from a scope gone since
            raised = await a_stray_cancellation()
        elif failure == "abort":
            raised = Abort("abort")
        else:  # what awaiting a future another task cancelled raises
            raised = asyncio.CancelledError()
        probe = Probe()

        async def on_exit(outcome: Exit) -> None:
            probe.on_exit(outcome)
            await anyio.lowlevel.checkpoint()
            raise raised

        caplog.set_level(logging.WARNING, logger="lovely_coordinator")
        block_went_on = False
        async with create_lanes(2, activate=probe.activate, on_exit=on_exit) as lanes:
            lanes.wake("a")
            lanes.wake("b")
            await settle()
            probe.release("a")
            await settle()
            assert lanes.wake("a") == "started", "the lane goes on"
            await settle()
            assert probe.starts().count("b") == 1
            assert lanes.status().running == 2, "nothing else was cancelled"
            block_went_on = True
        assert block_went_on
        assert sorted(e.key for e in probe.exits) == ["a", "a", "b"]
        records = [r for r in caplog.records if "on_exit failed for " in r.getMessage()]
        assert sorted(r.getMessage() for r in records) == [
            "on_exit failed for a",
            "on_exit failed for a",
            "on_exit failed for b",
        ]
        assert all(r.levelno == logging.WARNING for r in records)
        assert all(r.exc_info is not None and r.exc_info[1] is raised for r in records)


async def test_a_body_raising_a_base_exception_has_failed_and_nothing_else_stops() -> None:
    with anyio.fail_after(5):
        abort = Abort("abort")
        probe = Probe()

        async def activate(key: str) -> None:
            if key == "aborts":
                raise abort
            await probe.activate(key)

        async with create_lanes(2, activate=activate, on_exit=probe.on_exit) as lanes:
            lanes.wake("other")
            lanes.wake("aborts")
            await settle()
            assert lanes.wake("aborts") == "started"
            await settle()
            assert probe.starts() == ["other"], "the other activation still runs"
            probe.release("other")
            await settle()
        assert probe.exits == [
            ActivationFailed("aborts", abort),
            ActivationFailed("aborts", abort),
            ActivationSucceeded("other"),
        ]


# trio only: asyncio re-raises a SystemExit from any task straight out of the event loop.
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_system_exit_in_on_exit_is_logged_then_ends_the_lanes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        probe = Probe()
        stop = SystemExit(2)

        def on_exit(outcome: Exit) -> None:
            probe.on_exit(outcome)
            if outcome.key == "exit":
                raise stop

        async def run() -> None:
            async with create_lanes(2, activate=probe.activate, on_exit=on_exit) as lanes:
                lanes.wake("other")
                lanes.wake("exit")
                await settle()
                probe.release("exit")
                await anyio.sleep_forever()

        with pytest.raises(BaseExceptionGroup) as info:
            await run()
        assert info.group_contains(SystemExit)
        assert probe.exits == [ActivationSucceeded("exit"), ActivationInterrupted("other", "close")]
        (record,) = [r for r in caplog.records if "on_exit failed for exit" in r.getMessage()]
        assert record.exc_info is not None
        assert record.exc_info[1] is stop


@TIMED
@pytest.mark.parametrize("stop", ["timeout", "cancel", "close"])
async def test_a_body_that_catches_its_stop_and_returns_is_interrupted(
    clock: Clock, stop: Literal["timeout", "cancel", "close"]
) -> None:
    """The stop decides (CONTRACT §5b), the timeout included."""
    with anyio.fail_after(clock(1000)):
        exits: list[Exit] = []
        caught = anyio.Event()

        async def activate(key: str) -> None:
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                caught.set()  # and returns, as if it had finished

        async with create_lanes(
            1, turn_timeout=clock(10), activate=activate, on_exit=exits.append
        ) as lanes:
            lanes.wake("a")
            await settle()
            if stop == "cancel":
                await lanes.cancel("a")
            elif stop == "close":
                await lanes.close()
            await caught.wait()
        assert exits == [ActivationInterrupted("a", stop)]


# --- context and current_activation -------------------------------------------------------

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


async def test_activations_and_on_exit_run_in_the_context_lanes_were_created_in() -> None:
    with anyio.fail_after(5):
        seen: list[tuple[str, str]] = []

        async def activate(key: str) -> None:
            seen.append(("activate", request_id.get()))
            request_id.set("changed by the body")

        def on_exit(outcome: Exit) -> None:
            seen.append(("on_exit", request_id.get()))

        token = request_id.set("creator")
        try:
            async with create_lanes(1, activate=activate, on_exit=on_exit) as lanes:
                request_id.set("later in the creator")

                async def waker() -> None:
                    request_id.set("waker")
                    lanes.wake("a")

                async with anyio.create_task_group() as tg:
                    tg.start_soon(waker)
                await settle()
                lanes.wake("b")
                await settle()
        finally:
            request_id.reset(token)
        assert seen[0] == ("activate", "creator")
        assert seen[2] == ("activate", "creator")  # the first body's change did not leak
        assert request_id.get() == "none"


@TRIO_MOCK
async def test_current_activation_inside_and_outside() -> None:
    with anyio.fail_after(1000):
        seen: list[tuple[str, float, bool]] = []
        exits: list[Exit] = []

        async def child(key: str) -> None:
            activation = current_activation()
            assert activation is not None
            seen.append((f"child of {activation.key}", activation.started_at, True))

        async def activate(key: str) -> None:
            activation = current_activation()
            assert activation is not None
            seen.append((activation.key, activation.started_at, True))
            assert activation.started_at == anyio.current_time()
            async with anyio.create_task_group() as tg:
                tg.start_soon(child, key)
            await anyio.sleep(3)

        def on_exit(outcome: Exit) -> None:
            exits.append(outcome)
            assert current_activation() is None

        assert current_activation() is None
        async with create_lanes(1, activate=activate, on_exit=on_exit) as lanes:
            start = anyio.current_time()
            lanes.wake("a")
            lanes.wake("b")
            await anyio.sleep(10)
        assert seen == [
            ("a", start, True),
            ("child of a", start, True),
            ("b", start + 3, True),
            ("child of b", start + 3, True),
        ]
        assert exits == [ActivationSucceeded("a"), ActivationSucceeded("b")]


# --- turn timeout (deterministic on trio's MockClock, short real times on asyncio) ---------


@TIMED
async def test_timeout_counts_from_each_activations_own_start(clock: Clock) -> None:
    with anyio.fail_after(clock(1000)):
        ended_at: dict[str, float] = {}
        exits: list[Exit] = []

        async def activate(key: str) -> None:
            if key == "quick":
                await anyio.sleep(clock(4))
                return
            await anyio.sleep_forever()

        def on_exit(outcome: Exit) -> None:
            exits.append(outcome)
            ended_at[outcome.key] = anyio.current_time()

        async with create_lanes(
            1, turn_timeout=clock(10), activate=activate, on_exit=on_exit
        ) as lanes:
            start = anyio.current_time()
            lanes.wake("quick")
            lanes.wake("slow")
            await anyio.sleep(clock(20))
        assert exits == [ActivationSucceeded("quick"), ActivationInterrupted("slow", "timeout")]
        assert clock.at(ended_at["quick"], start + clock(4))
        assert clock.at(ended_at["slow"], ended_at["quick"] + clock(10))


async def test_timeout_with_real_time() -> None:
    with anyio.fail_after(5):
        exits: list[Exit] = []
        both_ended = anyio.Event()

        def on_exit(outcome: Exit) -> None:
            exits.append(outcome)
            if len(exits) == 2:
                both_ended.set()

        async with create_lanes(
            1, turn_timeout=0.02, activate=lambda key: anyio.sleep_forever(), on_exit=on_exit
        ) as lanes:
            lanes.wake("a")
            lanes.wake("b")
            await both_ended.wait()
        assert exits == [
            ActivationInterrupted("a", "timeout"),
            ActivationInterrupted("b", "timeout"),
        ]


@TIMED
@pytest.mark.parametrize(
    ("cancel_at", "stopped_at", "reason"),
    [
        pytest.param(2, 2, "cancel", id="cancel-then-deadline-during-cleanup"),
        pytest.param(12, 10, "timeout", id="deadline-then-cancel-during-cleanup"),
    ],
)
async def test_the_first_stop_reason_wins(
    clock: Clock, cancel_at: float, stopped_at: float, reason: Literal["cancel", "timeout"]
) -> None:
    with anyio.fail_after(clock(1000)):
        stops: list[float] = []
        exits: list[Exit] = []

        async def activate(key: str) -> None:
            try:
                await anyio.sleep_forever()
            finally:
                stops.append(anyio.current_time())
                with anyio.CancelScope(shield=True):  # a long cleanup of the body's own
                    await anyio.sleep(clock(30))

        async with create_lanes(
            1, turn_timeout=clock(10), activate=activate, on_exit=exits.append
        ) as lanes:
            start = anyio.current_time()
            lanes.wake("a")
            await anyio.sleep(clock(cancel_at))
            await lanes.cancel("a")
            assert clock.at(anyio.current_time(), stops[0] + clock(30))
        assert len(stops) == 1
        assert clock.at(stops[0], start + clock(stopped_at))
        assert exits == [ActivationInterrupted("a", reason)]


@TIMED
async def test_a_deadline_during_finalizers_keeps_the_bodys_success(clock: Clock) -> None:
    with anyio.fail_after(clock(1000)):
        exits: list[Exit] = []
        finalized_at: list[float] = []

        async def finalizer() -> None:
            await anyio.sleep(clock(30))  # past the deadline, and not cut short by it
            finalized_at.append(anyio.current_time())

        async def activate(key: str) -> None:
            activation = current_activation()
            assert activation is not None
            activation.exit_stack.push_async_callback(finalizer)
            await anyio.sleep(clock(5))

        async with create_lanes(
            1, turn_timeout=clock(10), activate=activate, on_exit=exits.append
        ) as lanes:
            start = anyio.current_time()
            lanes.wake("a")
            await anyio.sleep(clock(50))
        assert exits == [ActivationSucceeded("a")]
        assert clock.at(finalized_at[0], start + clock(35))


# --- randomized: every step keeps the invariants ------------------------------------------


class Fuzz:
    """Drives random wakes, cancels, completions, clock advances and a close."""

    def __init__(
        self,
        rng: random.Random,
        max_concurrent: int,
        max_queued: int | None,
        turn_timeout: float | None,
    ) -> None:
        self.rng = rng
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.turn_timeout = turn_timeout
        self.started_at: dict[str, float] = {}
        self.keys = [f"k{i}" for i in range(8)]
        self.releases: dict[str, anyio.Event] = {}
        self.active: set[str] = set()  # bodies running now
        self.unreported: set[str] = set()  # activate called, on_exit not yet
        self.records = 0  # activations the lanes recorded as started
        self.reports = 0
        self.closing = False
        # The lanes turn an exception in activate or on_exit into an outcome or a log
        # line, so the checks made there are collected here and asserted by check().
        self.violations: list[str] = []

    def expect(self, condition: bool, violation: str) -> None:
        if not condition:
            self.violations.append(violation)

    def count_records(self, lanes: Lanes) -> None:
        # Every activation recorded as started, whether or not activate is ever called,
        # must be reported exactly once: count them where they are made.
        self.lanes = lanes  # activate() reads its record's stop cell
        state = lanes._state
        new_record = state._new_record

        def counted(key: str) -> _Run:
            self.records += 1
            return new_record(key)

        state._new_record = counted

    async def activate(self, key: str) -> None:
        self.expect(not self.closing, "an activation started after close")
        self.expect(key not in self.unreported, "two activations of one key overlap")
        self.expect(len(self.active) < self.max_concurrent, "more bodies than slots")
        stop = self.lanes._state.running[key].stop
        self.expect(stop is None, f"activate called after a stop ({stop})")
        self.active.add(key)
        self.unreported.add(key)
        release = self.releases[key] = anyio.Event()
        try:
            activation = current_activation()
            self.expect(activation is not None and activation.key == key, "no activation")
            if activation is not None:
                self.started_at[key] = activation.started_at
            if activation is not None and self.rng.random() < 0.3:
                activation.exit_stack.push_async_callback(anyio.sleep, self.rng.random())
            await release.wait()
            if self.rng.random() < 0.2:
                raise ValueError("random failure")
        finally:
            self.active.discard(key)
            del self.releases[key]

    def on_exit(self, outcome: Exit) -> None:
        self.reports += 1
        if outcome.key in self.unreported:
            self.unreported.discard(outcome.key)
            if isinstance(outcome, ActivationInterrupted) and outcome.reason == "timeout":
                ran = anyio.current_time() - self.started_at[outcome.key]
                limit = math.inf if self.turn_timeout is None else self.turn_timeout
                # The deadline is start + timeout in floats, so (start + timeout) - start
                # can come out a few ulps short of timeout; allow that, nothing more.
                self.expect(ran >= limit - 1e-9, f"timed out after {ran}")
        else:  # stopped before its task ran: never activated
            self.expect(isinstance(outcome, ActivationInterrupted), f"unmatched {outcome}")

    def check(self, lanes: Lanes) -> None:
        assert self.violations == []
        status = lanes.status()
        assert status.running <= self.max_concurrent
        assert self.max_queued is None or status.queued <= self.max_queued
        keys = [lane.key for lane in status.lanes]
        assert len(keys) == len(set(keys)), "a key twice"
        assert status.queued == 0 or status.running == self.max_concurrent
        assert len(self.active) <= status.running
        lanes._state.check_invariants()

    def wake(self, lanes: Lanes, key: str) -> None:
        before = lanes.status()
        try:
            result = lanes.wake(key)
        except LaneQueueFull:
            assert before.queued == self.max_queued
            assert key not in {lane.key for lane in before.lanes}
        except LanesClosed:
            assert self.closing
        else:
            assert not self.closing
            if key in {lane.key for lane in before.lanes}:
                assert result == "coalesced"
            elif before.queued == 0 and before.running < self.max_concurrent:
                assert result == "started"
            else:
                assert result == "queued"

    async def step(self, lanes: Lanes, tg: anyio.abc.TaskGroup, timed: bool) -> None:
        action = self.rng.random()
        key = self.rng.choice(self.keys)
        if action < 0.4:
            self.wake(lanes, key)
        elif action < 0.7:
            if self.releases:
                self.releases[self.rng.choice(sorted(self.releases))].set()
        elif action < 0.8:
            tg.start_soon(lanes.cancel, key)
        elif action < 0.85:
            # The cancel may reach the new activation before or after its task first ran.
            self.wake(lanes, key)
            tg.start_soon(lanes.cancel, key)
        else:
            await anyio.sleep(self.rng.choice([0, 0.5, 3, 7]) if timed else 0)

    async def close(self, lanes: Lanes) -> None:
        self.closing = True
        await lanes.close()


async def run_fuzz(seed: int, timed: bool, steps: int) -> None:
    rng = random.Random(seed)
    turn_timeout = rng.choice([None, 5.0]) if timed else None
    fuzz = Fuzz(rng, rng.randint(1, 4), rng.choice([None, 0, 1, 3]), turn_timeout)
    async with (
        create_lanes(
            fuzz.max_concurrent,
            fuzz.max_queued,
            fuzz.turn_timeout,
            activate=fuzz.activate,
            on_exit=fuzz.on_exit,
        ) as lanes,
        anyio.create_task_group() as tg,
    ):
        fuzz.count_records(lanes)
        close_at = rng.randrange(steps * 3 // 4, steps)  # and keep going after it
        for step in range(steps):
            if step == close_at:
                fuzz.wake(lanes, rng.choice(fuzz.keys))  # may start a task close then stops
                tg.start_soon(fuzz.close, lanes)
            else:
                await fuzz.step(lanes, tg, timed)
            await settle()
            fuzz.check(lanes)
        await fuzz.close(lanes)
        fuzz.check(lanes)
    assert not fuzz.unreported, "an activation was never reported"
    assert fuzz.reports == fuzz.records


@TRIO_MOCK
@pytest.mark.parametrize("seed", range(8))
async def test_random_operations_keep_every_invariant_timed(seed: int) -> None:
    with anyio.fail_after(100_000):
        await run_fuzz(seed, timed=True, steps=400)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.slow
async def test_random_operations_keep_every_invariant(seed: int) -> None:
    with anyio.fail_after(10):
        await run_fuzz(seed, timed=False, steps=100)

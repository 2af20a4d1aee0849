"""ProviderLimitHandler on a real coordinator: closures, timed reopen, the half-open probe.

Time-dependent tests run on trio's MockClock (deterministic) and on asyncio in short
real time; ``unit`` scales the delays. Tests whose bodies never await (the handler is
synchronous; they only need a running loop for the coordinator's timers) cannot hang and
carry no ``fail_after``.
"""

from __future__ import annotations

import gc
import logging
import weakref
from random import Random

import anyio
import httpx2
import pytest
from lovely_coordinator_limits import Backoff, ProviderLimitHandler
from trio.testing import MockClock

from lovely_coordinator import (
    AgentCoordinator,
    AgentPermit,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    create_agent_coordinator,
)

T = ModelTuple("openai", "gpt-4o")
OTHER = ModelTuple("anthropic", "claude")

TIMED = pytest.mark.parametrize(
    ("anyio_backend", "unit"),
    [
        pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), 10.0, id="trio-mock"),
        pytest.param("asyncio", 0.02, id="asyncio-real-time"),
    ],
)


def _handler(coordinator: AgentCoordinator, base: float = 1.0) -> ProviderLimitHandler:
    backoff = Backoff(base=base, factor=2.0, max_delay=100 * base, jitter=0.0)
    return ProviderLimitHandler(coordinator, backoff=backoff, rng=Random(0))


def _limit_of(coordinator: AgentCoordinator, t: ModelTuple) -> int | None:
    return next((e.limit for e in coordinator.statistics().tuples if e.tuple == t), None)


@pytest.mark.anyio
async def test_a_limit_closes_the_tuple_and_caps_it_at_one() -> None:
    coordinator = create_agent_coordinator(4)
    coordinator.set_tuple_limit(T, 3)
    handler = _handler(coordinator)
    now = anyio.current_time()
    assert handler.report_limit(T, retry_after=30.0) == 30.0
    assert not coordinator.is_tuple_open(T)
    reopens_at = coordinator.tuple_reopens_at(T)
    assert reopens_at is not None
    assert now + 30.0 <= reopens_at <= anyio.current_time() + 30.0
    assert _limit_of(coordinator, T) == 1
    state = handler.state(T)
    assert state is not None
    assert (state.tuple, state.failures, state.saved_limit) == (T, 1, 3)
    assert state.reopens_at == reopens_at
    assert coordinator.is_tuple_open(OTHER)
    assert handler.state(OTHER) is None


@pytest.mark.anyio
async def test_without_a_hint_the_backoff_decides() -> None:
    coordinator = create_agent_coordinator(4)
    handler = _handler(coordinator, base=2.0)
    assert handler.report_limit(("openai", "gpt-4o")) == 2.0


@pytest.mark.anyio
async def test_server_hints_are_capped() -> None:
    coordinator = create_agent_coordinator(4)
    handler = _handler(coordinator, base=1.0)
    assert handler.report_limit(T, retry_after=86_400.0) == 100.0


@pytest.mark.anyio
async def test_limits_while_closed_never_escalate() -> None:
    coordinator = create_agent_coordinator(4)
    handler = _handler(coordinator)
    handler.report_limit(T, retry_after=10.0)
    first = coordinator.tuple_reopens_at(T)
    # Requests admitted before the closure keep reporting: no hint, no change.
    assert handler.report_limit(T) is None
    assert coordinator.tuple_reopens_at(T) == first
    # A later hint pushes the reopen later; an earlier one is ignored by the gate.
    assert handler.report_limit(T, retry_after=20.0) == 20.0
    later = coordinator.tuple_reopens_at(T)
    assert first is not None
    assert later is not None
    assert later > first
    handler.report_limit(T, retry_after=1.0)
    assert coordinator.tuple_reopens_at(T) == later
    state = handler.state(T)
    assert state is not None
    assert state.failures == 1


@TIMED
@pytest.mark.anyio
async def test_the_probe_succeeds_and_the_cap_comes_back_step_by_step(unit: float) -> None:
    with anyio.fail_after(100 * unit):
        coordinator = create_agent_coordinator(4)
        coordinator.set_tuple_limit(T, 3)
        handler = _handler(coordinator, base=unit)
        handler.report_limit(T, retry_after=5 * unit)
        closed_at = anyio.current_time()
        # Two requests wait; the reopened gate lets exactly one through (half-open).
        probe = await coordinator.acquire(T)
        assert anyio.current_time() >= closed_at + 5 * unit
        assert coordinator.is_tuple_open(T)
        async with anyio.create_task_group() as tg:
            second: list[AgentPermit] = []

            async def wait_second() -> None:
                second.append(await coordinator.acquire(T))

            tg.start_soon(wait_second)
            await anyio.wait_all_tasks_blocked()
            assert coordinator.statistics().active == 1
            assert coordinator.queued_count == 1
            # The probe (admitted after the closure) succeeds: one more slot, and the
            # waiter goes through at once; not the whole cap yet.
            handler.report_success(T, started_at=anyio.current_time())
            state = handler.state(T)
            assert state is not None
            assert state.cap == 2
            assert _limit_of(coordinator, T) == 2
        probe.release()
        (permit,) = second
        assert permit.held
        assert coordinator.active_count == 1
        # A round of two successes at cap 2 gives the old cap back, and ends the episode.
        handler.report_success(T, started_at=anyio.current_time())
        assert _limit_of(coordinator, T) == 2
        handler.report_success(T, started_at=anyio.current_time())
        assert handler.state(T) is None
        assert _limit_of(coordinator, T) == 3
        permit.release()


@TIMED
@pytest.mark.anyio
async def test_a_failed_probe_closes_again_for_longer(unit: float) -> None:
    with anyio.fail_after(100 * unit):
        coordinator = create_agent_coordinator(4)
        handler = _handler(coordinator, base=unit)
        assert handler.report_limit(T) == unit  # backoff step 0
        permit = await coordinator.acquire(T)  # waits out the closure: this is the probe
        assert handler.report_limit(T) == 2 * unit  # backoff step 1
        state = handler.state(T)
        assert state is not None
        assert state.failures == 2
        assert not coordinator.is_tuple_open(T)
        permit.release()
        permit = await coordinator.acquire(T)
        # A hint shorter than the backoff does not shorten the escalation.
        assert handler.report_limit(T, retry_after=0.0) == 4 * unit
        permit.release()
        permit = await coordinator.acquire(T)
        # Back to the global cap of 4 (the tuple had none) in rounds of 1, 2 and 3.
        for _ in range(1 + 2 + 3):
            assert handler.state(T) is not None
            handler.report_success(T)
        permit.release()
        assert handler.state(T) is None
        assert _limit_of(coordinator, T) is None
        assert handler.report_limit(T) == unit  # a new episode starts from the first step


@pytest.mark.anyio
async def test_successes_from_before_the_closure_prove_nothing() -> None:
    coordinator = create_agent_coordinator(4)
    handler = _handler(coordinator)
    started = anyio.current_time() - 1.0  # a request admitted a second ago
    handler.report_limit(T, retry_after=60.0)
    handler.report_success(T, started_at=started)  # gate still closed
    coordinator.open_tuple(T)  # someone reopens early
    handler.report_success(T, started_at=started)  # admitted before the closure
    assert handler.state(T) is not None
    handler.report_success(T, started_at=anyio.current_time())
    state = handler.state(T)
    assert state is not None
    assert state.cap == 2  # the probe proved the way: recovery has started


@pytest.mark.anyio
async def test_observe_classifies_and_reads_the_wait() -> None:
    coordinator = create_agent_coordinator(4)
    handler = _handler(coordinator)
    request = httpx2.Request("POST", "https://api.openai.com/v1/chat/completions")
    limited = httpx2.Response(429, headers={"retry-after": "12"}, request=request)
    error = httpx2.HTTPStatusError("429", request=request, response=limited)
    assert not handler.observe(T, TimeoutError())
    assert coordinator.is_tuple_open(T)
    assert handler.observe(T, error)
    reopens_at = coordinator.tuple_reopens_at(T)
    assert reopens_at is not None
    assert reopens_at <= anyio.current_time() + 12.0


@pytest.mark.anyio
async def test_bad_tuples_change_nothing() -> None:
    coordinator = create_agent_coordinator(4)
    handler = _handler(coordinator)
    message = r"^Model tuple provider and model must be nonempty and contain no NUL bytes$"
    with pytest.raises(InvalidArgumentError, match=message):
        handler.report_limit(("openai", ""))
    with pytest.raises(InvalidArgumentError, match=message):
        handler.report_success(("openai",))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=message):
        handler.observe(("", "x"), TimeoutError())
    assert coordinator.statistics().tuples == ()
    assert handler.coordinator is coordinator


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True])
async def test_bad_waits_change_nothing(bad: float) -> None:
    coordinator = create_agent_coordinator(4)
    handler = _handler(coordinator)
    message = r"^retry_after must be a finite number of seconds >= 0 or None$"
    with pytest.raises(InvalidArgumentError, match=message):
        handler.report_limit(T, retry_after=bad)
    assert handler.state(T) is None
    assert coordinator.is_tuple_open(T)
    assert coordinator.statistics().tuples == ()


@pytest.mark.anyio
async def test_one_shared_handler_per_coordinator() -> None:
    first, second = create_agent_coordinator(2), create_agent_coordinator(2)
    shared = ProviderLimitHandler.for_coordinator(first)
    assert ProviderLimitHandler.for_coordinator(first) is shared
    assert ProviderLimitHandler.for_coordinator(second) is not shared
    assert shared.coordinator is first
    with pytest.raises(
        InvalidArgumentTypeError, match=r"^coordinator must be an AgentCoordinator$"
    ):
        ProviderLimitHandler.for_coordinator(object())  # type: ignore[arg-type]


def test_the_shared_handler_lives_as_long_as_its_coordinator() -> None:
    coordinator = create_agent_coordinator(2)
    handler = weakref.ref(ProviderLimitHandler.for_coordinator(coordinator))
    gc.collect()
    assert handler() is not None
    del coordinator
    gc.collect()
    assert handler() is None


@pytest.mark.anyio
async def test_closures_and_recoveries_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    coordinator = create_agent_coordinator(2)
    handler = _handler(coordinator)
    with caplog.at_level(logging.DEBUG, logger="lovely_coordinator.limits"):
        handler.report_limit(T, retry_after=30.0, reason="HTTP 429")
        reopens_at = coordinator.tuple_reopens_at(T)
        assert reopens_at is not None
        coordinator.open_tuple(T)
        handler.report_success(T)  # the probe: cap 2 of 2, so recovered at once
    closed, recovered = (r for r in caplog.records if r.name == "lovely_coordinator.limits")
    assert closed.levelno == logging.INFO
    assert closed.getMessage() == (
        f"openai/gpt-4o closed for 30 s (reopens at {reopens_at:.3f} on the anyio clock), "
        "cap 1: HTTP 429"
    )
    assert recovered.getMessage() == "openai/gpt-4o recovered: cap restored to None"

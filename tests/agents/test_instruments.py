"""_agents/instruments: what an Instrument is told, exactly once per wait, and what it may break.

A state machine drives the pure scheduler (permits, reservations, model requests with and
without a covering permit, budgets, gates, lending, time) with a recording instrument
attached and checks, after every step, that the waits it was told started and not yet
ended are exactly the scheduler's queued tickets, and that an end without a start reports
no wait at all. The coordinator-level tests then check each outcome (granted, cancelled,
rejected), token settlements and the containment of hooks that raise, on asyncio and trio.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from lovely_coordinator import (
    AgentCoordinator,
    CoordinatorBusyError,
    CoordinatorConfig,
    Instrument,
    InvalidArgumentTypeError,
    ModelTuple,
    PermitReleasedError,
    TupleSuspendedError,
    create_agent_coordinator,
)
from lovely_coordinator._agents.instruments import Dispatch
from lovely_coordinator._agents.scheduler import Scheduler
from lovely_coordinator._agents.tickets import GRANTED, INACTIVE, LENT, QUEUED, PermitTicket, Ticket

A = ModelTuple("p", "a")
B = ModelTuple("p", "b")


class Recorder(Instrument):
    """Records every hook call; notes (in ``problems``: a hook's own exception would be
    contained) any wait that starts twice, or ends with a wait although it never began."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.open: dict[object, ModelTuple] = {}
        self.started: list[tuple[object, ModelTuple]] = []
        self.ended: list[tuple[object, ModelTuple, str, float]] = []
        self.settled: list[tuple[ModelTuple, int]] = []

    def wait_started(self, wait: object, model_tuple: ModelTuple) -> None:
        if wait in self.open:
            self.problems.append(f"{wait} started twice")
        self.open[wait] = model_tuple
        self.started.append((wait, model_tuple))

    def wait_ended(
        self, wait: object, model_tuple: ModelTuple, outcome: str, waited: float
    ) -> None:
        if outcome not in ("granted", "cancelled", "rejected") or waited < 0.0:
            self.problems.append(f"{wait} ended {outcome} after {waited}")
        if wait in self.open:
            if self.open.pop(wait) != model_tuple:
                self.problems.append(f"{wait} ended on another tuple")
        elif waited != 0.0:  # granted or refused at once: no wait at all
            self.problems.append(f"{wait} ended {outcome} after {waited} s but never began")
        self.ended.append((wait, model_tuple, outcome, waited))

    def tokens_settled(self, model_tuple: ModelTuple, tokens: int) -> None:
        if tokens <= 0:
            self.problems.append(f"settled {tokens}")
        self.settled.append((model_tuple, tokens))

    def outcomes(self) -> list[str]:
        return [outcome for _wait, _t, outcome, _waited in self.ended]


class FakeParker:
    def __init__(self) -> None:
        self.outcome: object = None

    def grant(self, value: bool) -> None:
        self.outcome = value

    def fail(self, error: BaseException) -> None:
        self.outcome = error


# -- the state machine ---------------------------------------------------------------------------


class InstrumentedScheduler(RuleBasedStateMachine):
    """Random scheduling on the pure scheduler; the recorder must stay in step with it."""

    @initialize(limit=st.integers(1, 3), max_queued=st.none() | st.integers(0, 4))
    def start(self, limit: int, max_queued: int | None) -> None:
        self.now = 0.0
        self.s = Scheduler(limit, max_queued=max_queued, clock=lambda: self.now)
        self.recorder = Recorder()
        self.s.observer = Dispatch(((object(), self.recorder),))
        self.tickets: list[Ticket] = []

    def _pick(self, index: int, *states: int) -> Ticket | None:
        found = [t for t in self.tickets if t.state in states]
        return found[index % len(found)] if found else None

    def _permit(self, index: int, *states: int) -> PermitTicket | None:
        found = [t for t in self.tickets if t.state in states and isinstance(t, PermitTicket)]
        return found[index % len(found)] if found else None

    @rule(t=st.sampled_from([A, B]), active=st.booleans(), reject=st.booleans())
    def enqueue(self, t: ModelTuple, active: bool, reject: bool) -> None:
        try:
            ticket = self.s.enqueue(t, None, active, reject)
        except (TupleSuspendedError, CoordinatorBusyError):
            assert self.recorder.ended[-1][0] is None  # refused: an end without a wait
            assert self.recorder.ended[-1][2] == "rejected"
            return
        ticket.parker = FakeParker() if ticket.state != GRANTED else None
        self.tickets.append(ticket)

    @rule(
        t=st.sampled_from([A, B]),
        reject=st.booleans(),
        tokens=st.integers(0, 30),
        cover=st.none() | st.integers(0, 20),
    )
    def request(self, t: ModelTuple, reject: bool, tokens: int, cover: int | None) -> None:
        permit = None if cover is None else self._permit(cover, GRANTED, LENT)
        try:
            ticket = self.s.enqueue_request(t, None, reject, tokens, permit)
        except (TupleSuspendedError, CoordinatorBusyError):
            assert self.recorder.ended[-1][0] is None
            assert self.recorder.ended[-1][2] == "rejected"
            return
        ticket.parker = FakeParker() if ticket.state != GRANTED else None
        self.tickets.append(ticket)

    @rule(t=st.sampled_from([A, B]), requests=st.none() | st.integers(1, 3))
    def budget(self, t: ModelTuple, requests: int | None) -> None:
        self.s.set_budget(t, requests, None if requests is None else 40)

    @rule(seconds=st.sampled_from([0.5, 5.0, 60.0]))
    def wait(self, seconds: float) -> None:
        self.now += seconds
        self.s.advance()

    @rule(index=st.integers(0, 20))
    def activate(self, index: int) -> None:
        ticket = self._pick(index, INACTIVE)
        if ticket is not None:
            self.s.activate(ticket)

    @rule(index=st.integers(0, 20))
    def release(self, index: int) -> None:
        ticket = self._pick(index, GRANTED, LENT)
        if ticket is not None:
            self.s.release(ticket)

    @rule(index=st.integers(0, 20), fail=st.booleans())
    def leave(self, index: int, fail: bool) -> None:
        ticket = self._pick(index, INACTIVE, QUEUED)
        if ticket is None:
            return
        if fail:
            self.s.fail(ticket, RuntimeError("gone"))
        else:
            self.s.discard(ticket)

    @rule(index=st.integers(0, 20))
    def lend(self, index: int) -> None:
        ticket = self._permit(index, GRANTED, LENT, QUEUED)
        if ticket is None or (ticket.state == QUEUED and not ticket.bypass):
            return
        self.s.lend_begin(ticket)

    @rule(index=st.integers(0, 20))
    def lend_end(self, index: int) -> None:
        ticket = self._permit(index, LENT)
        if ticket is not None:
            self.s.lend_end(ticket, FakeParker())

    @rule(t=st.sampled_from([A, B]), closed=st.booleans())
    def gate(self, t: ModelTuple, closed: bool) -> None:
        if closed:
            self.s.close(t, None)
        else:
            self.s.open(t)

    @rule(limit=st.integers(1, 3))
    def set_limit(self, limit: int) -> None:
        self.s.set_limit(limit)

    @rule(t=st.sampled_from([A, B]), limit=st.none() | st.integers(1, 2))
    def set_tuple_limit(self, t: ModelTuple, limit: int | None) -> None:
        self.s.set_tuple_limit(t, limit)

    @invariant()
    def every_queued_ticket_is_an_open_wait(self) -> None:
        self.s.check_invariants()
        queued = {t for t in self.tickets if t.state in (INACTIVE, QUEUED)}
        assert set(self.recorder.open) == queued
        assert self.recorder.problems == []


InstrumentedScheduler.TestCase.settings = settings(
    max_examples=int(os.environ.get("SCHEDULER_EXAMPLES", "300")),
    stateful_step_count=50,
    deadline=None,
)
test_every_wait_ends_exactly_once = InstrumentedScheduler.TestCase


# -- through the coordinator -------------------------------------------------------------------


class Monotonic:
    """A stand-in for ``time.monotonic`` where the core reads it: time moves when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def monotonic(monkeypatch: pytest.MonkeyPatch) -> Monotonic:
    clock = Monotonic()
    for module in ("_agents.lending", "_agents.instruments"):
        monkeypatch.setattr(f"lovely_coordinator.{module}.monotonic", clock)
    return clock


def instrumented(limit: int = 1, **config: Any) -> tuple[AgentCoordinator, Recorder]:
    coordinator = create_agent_coordinator(
        config=CoordinatorConfig(max_concurrency=limit, **config)
    )
    recorder = Recorder()
    coordinator.add_instrument(recorder)
    return coordinator, recorder


@pytest.mark.anyio
async def test_granted_at_once_ends_without_a_start() -> None:
    with anyio.fail_after(5):
        coordinator, recorder = instrumented()
        async with coordinator.permit(A):
            pass
        assert recorder.started == []
        assert [(t, o, w) for _k, t, o, w in recorder.ended] == [(A, "granted", 0.0)]


@pytest.mark.anyio
async def test_a_queued_wait_is_measured_from_enqueue_to_grant(monotonic: Monotonic) -> None:
    with anyio.fail_after(5):
        coordinator, recorder = instrumented()
        holder = await coordinator.acquire(A)
        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinator.run, A, anyio.lowlevel.checkpoint)
            await wait_all_tasks_blocked()
            assert [t for _w, t in recorder.started] == [A]
            monotonic.now += 2.5
            holder.release()
        (_wait, t, outcome, waited) = recorder.ended[-1]
        assert (t, outcome) == (A, "granted")
        assert waited == 2.5
        assert recorder.open == {}
        assert recorder.problems == []


@pytest.mark.anyio
async def test_cancelled_while_queued() -> None:
    with anyio.fail_after(5):
        coordinator, recorder = instrumented()
        holder = await coordinator.acquire(A)
        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinator.run, A, anyio.lowlevel.checkpoint)
            await wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        holder.release()
        assert recorder.outcomes() == ["granted", "cancelled"]
        assert recorder.open == {}
        assert recorder.problems == []


@pytest.mark.anyio
async def test_rejected_queued_and_at_once() -> None:
    with anyio.fail_after(5):
        coordinator, recorder = instrumented()
        holder = await coordinator.acquire(A)
        failed: list[BaseException] = []

        async def foreground() -> None:
            try:
                await coordinator.acquire(A, reject_on_closed_tuple=True)
            except TupleSuspendedError as exc:
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(foreground)
            await wait_all_tasks_blocked()
            coordinator.close_tuple(A)
        assert len(failed) == 1
        with pytest.raises(TupleSuspendedError):
            await coordinator.acquire(A, reject_on_closed_tuple=True)
        holder.release()
        assert recorder.outcomes() == ["granted", "rejected", "rejected"]
        assert recorder.ended[1][0] is not None  # it had queued
        assert recorder.ended[2][0] is None  # refused before it took a place
        assert recorder.open == {}
        assert recorder.problems == []


@pytest.mark.anyio
async def test_max_queued_refusal_is_rejected() -> None:
    with anyio.fail_after(5):
        coordinator, recorder = instrumented(max_queued=0)
        holder = await coordinator.acquire(A)
        with pytest.raises(CoordinatorBusyError):
            await coordinator.acquire(A)
        with pytest.raises(CoordinatorBusyError):
            coordinator.reserve(B)
        holder.release()
        assert recorder.outcomes() == ["granted", "rejected", "rejected"]
        assert [t for _w, t, _o, _s in recorder.ended] == [A, A, B]


@pytest.mark.anyio
async def test_a_reservation_waits_from_reserve_and_cancel_ends_it() -> None:
    with anyio.fail_after(5):
        coordinator, recorder = instrumented()
        first = coordinator.reserve(A)
        second = coordinator.reserve(B)
        assert [t for _w, t in recorder.started] == [A, B]  # inactive: waiting already
        first.activate()
        second.cancel()
        assert recorder.outcomes() == ["granted", "cancelled"]
        assert recorder.open == {}
        assert recorder.problems == []
        await first.run(anyio.lowlevel.checkpoint)


@pytest.mark.anyio
async def test_reacquire_after_an_earlier_wait_is_a_new_wait(monotonic: Monotonic) -> None:
    # Regression: a lending permit that had queued once kept its old enqueue time, so a
    # reacquire granted at once reported the first wait again.
    with anyio.fail_after(5):
        coordinator, recorder = instrumented()
        holder = await coordinator.acquire(A)

        async def lender() -> None:
            async with coordinator.permit(A):
                await coordinator.with_lent_permit(anyio.lowlevel.checkpoint)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lender)
            await wait_all_tasks_blocked()
            monotonic.now += 3.0
            holder.release()
        grants = [w for _k, _t, o, w in recorder.ended if o == "granted"]
        assert grants == [0.0, 3.0, 0.0]  # the holder, the lender, its reacquire (at once)
        assert recorder.open == {}
        assert recorder.problems == []


@pytest.mark.anyio
async def test_released_while_reacquiring_is_cancelled() -> None:
    with anyio.fail_after(5):
        coordinator, recorder = instrumented()
        permit = await coordinator.acquire(A)
        other: list[Any] = []

        async def wait() -> None:
            other.append(await coordinator.acquire(B))  # takes the lent slot

        async def lend() -> None:
            with pytest.raises(PermitReleasedError):
                await permit.lend(wait)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lend)
            await wait_all_tasks_blocked()  # reacquiring: the slot is B's now
            permit.release()
        other[0].release()
        assert recorder.outcomes() == ["granted", "granted", "cancelled"]
        assert recorder.open == {}
        assert recorder.problems == []


@pytest.mark.anyio
async def test_requests_report_settled_tokens_once_per_increase() -> None:
    with anyio.fail_after(5):
        coordinator, recorder = instrumented(limit=2)
        coordinator.set_budget(A, tokens_per_minute=10_000)
        async with coordinator.request(A, tokens=100) as call:
            call.settle(0)  # nothing settled yet: nothing to count
            call.settle(40)
            call.settle(70)  # a growing total: the growth
            call.settle(50)  # lower than before: a counter never goes down
            call.settle(80)
            async with coordinator.request(A, tokens=5) as same:  # the same call, joined
                assert same is call
                same.settle(90)
        assert recorder.settled == [(A, 40), (A, 30), (A, 10), (A, 10)]
        assert recorder.outcomes() == ["granted"]


class Hostile(Instrument):
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.calls = 0

    def wait_started(self, wait: object, model_tuple: ModelTuple) -> None:
        self.calls += 1
        raise self.error

    def wait_ended(
        self, wait: object, model_tuple: ModelTuple, outcome: str, waited: float
    ) -> None:
        self.calls += 1
        raise self.error

    def tokens_settled(self, model_tuple: ModelTuple, tokens: int) -> None:
        self.calls += 1
        raise self.error


class Custom(BaseException):
    pass


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error", [ValueError("boom"), Custom("base"), KeyboardInterrupt(), anyio.EndOfStream()]
)
async def test_a_hook_that_raises_is_contained_and_logged(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(1)
        hostile = Hostile(error)
        recorder = Recorder()
        coordinator.add_instrument(hostile)
        coordinator.add_instrument(recorder)  # still told everything
        with caplog.at_level(logging.ERROR, "lovely_coordinator.instruments"):
            holder = await coordinator.acquire(A)
            async with anyio.create_task_group() as tg:
                tg.start_soon(coordinator.run, A, anyio.lowlevel.checkpoint)
                await wait_all_tasks_blocked()
                holder.release()
            async with coordinator.request(A) as call:
                call.settle(3)
        coordinator._scheduler.check_invariants()
        assert coordinator.statistics().active == 0
        assert hostile.calls == 5  # 3 ends (2 permits, 1 request), 1 start, 1 settle
        assert recorder.outcomes() == ["granted", "granted", "granted"]
        assert len(caplog.records) == 5
        assert all(r.exc_info is not None for r in caplog.records)


def test_add_instrument_checks_its_argument() -> None:
    coordinator = create_agent_coordinator(1)
    with pytest.raises(InvalidArgumentTypeError, match=r"^instrument must be"):
        coordinator.add_instrument(object())  # type: ignore[arg-type]
    assert coordinator._scheduler.observer is None


def test_remove_is_idempotent_and_removes_only_its_registration() -> None:
    coordinator = create_agent_coordinator(1)
    recorder = Recorder()
    remove_first = coordinator.add_instrument(recorder)
    remove_second = coordinator.add_instrument(recorder)
    remove_first()
    remove_first()
    coordinator.reserve(A).cancel()
    assert recorder.outcomes() == ["cancelled"]  # once: the second registration only
    remove_second()
    assert coordinator._scheduler.observer is None
    coordinator.reserve(A).cancel()
    assert recorder.outcomes() == ["cancelled"]


def test_only_the_hooks_a_subclass_overrides_are_called() -> None:
    class EndsOnly(Instrument):
        def __init__(self) -> None:
            self.ends = 0

        def wait_ended(
            self, wait: object, model_tuple: ModelTuple, outcome: str, waited: float
        ) -> None:
            self.ends += 1

    coordinator = create_agent_coordinator(1)
    ends = EndsOnly()
    coordinator.add_instrument(ends)
    dispatch = coordinator._scheduler.observer
    assert dispatch is not None
    assert dispatch._started == ()
    assert dispatch._settled == ()
    coordinator.reserve(A).cancel()
    assert ends.ends == 1


def test_the_hot_paths_see_no_observer_without_instruments() -> None:
    coordinator = create_agent_coordinator(1)
    assert _observer(coordinator) is None
    remove = coordinator.add_instrument(Recorder())
    assert isinstance(_observer(coordinator), Dispatch)
    remove()
    assert _observer(coordinator) is None


def _observer(coordinator: AgentCoordinator) -> Dispatch | None:
    return coordinator._scheduler.observer  # (read afresh: mypy narrows attributes)


def test_a_ticket_granted_at_once_has_no_enqueue_time() -> None:
    s = Scheduler(1)
    first = s.enqueue(A, None, True, False)
    second = s.enqueue(A, None, True, False)
    assert first.state == GRANTED
    assert first.since is None  # the fast path reads no clock
    assert second.state == QUEUED
    assert second.since is not None
    s.release(first)
    assert second.state == GRANTED

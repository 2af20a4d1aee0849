"""``request_sync()``, the blocking twin of ``request()``, from plain threads.

Threads here are real OS threads with no event loop; the admissions they block on are
made on the coordinator's private helper loop. Every wait in a test is bounded (a
timeout on ``join`` or on ``request_sync`` itself); threads are ordered with events and
with the coordinator's own statistics (a waiter is visible in ``queued``), never sleeps.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import anyio
import pytest

from lovely_coordinator import (
    AdmissionTimeoutError,
    AgentCoordinator,
    CoordinatorBusyError,
    CoordinatorConfig,
    CoordinatorError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    TupleSuspendedError,
    UsageError,
    create_agent_coordinator,
)
from lovely_coordinator._agents.blocking import helper_loop

T = ModelTuple("openai", "gpt")
U = ModelTuple("anthropic", "claude")
TIMEOUT_MESSAGE = r"^timeout must be a nonnegative number of seconds or None$"
BOUND = 10.0  # the longest any test waits for a thread


def assert_idle(coord: AgentCoordinator) -> None:
    stats = coord.statistics()
    assert (stats.active, stats.queued, stats.lent) == (0, 0, 0), stats


def wait_until(condition: Callable[[], bool]) -> None:
    """Spin (briefly yielding the GIL) until another thread made ``condition`` true."""
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.0005)


def enter(context: AbstractContextManager[object]) -> None:
    """Enter ``context``, which must refuse."""
    with context:
        pytest.fail("admitted")  # pragma: no cover


@contextmanager
def running(target: Callable[[], object]) -> Iterator[threading.Thread]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield thread
    thread.join(BOUND)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def test_threads_never_exceed_the_cap_and_all_finish() -> None:
    coord = create_agent_coordinator(3)
    coord.set_tuple_limit(U, 1)
    lock = threading.Lock()
    in_flight = {T: 0, U: 0, "all": 0}
    peak = {T: 0, U: 0, "all": 0}

    def work(t: ModelTuple) -> None:
        for _ in range(30):
            with coord.request_sync(t, tokens=3, timeout=BOUND) as call:
                assert call.tuple == t
                assert call.tokens == 3
                with lock:
                    for key in (t, "all"):
                        in_flight[key] += 1
                        peak[key] = max(peak[key], in_flight[key])
                time.sleep(0)
                with lock:
                    for key in (t, "all"):
                        in_flight[key] -= 1

    threads = [threading.Thread(target=work, args=(T if i % 2 else U,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
        assert not thread.is_alive()
    assert peak["all"] <= 3
    assert peak[U] == 1
    assert peak[T] >= 1
    assert_idle(coord)


def test_a_thread_waits_in_line_with_async_callers_and_is_granted_by_their_release() -> None:
    coord = create_agent_coordinator(1)
    holding, release = threading.Event(), threading.Event()

    async def hold() -> None:
        async with coord.request(T):
            holding.set()
            await anyio.to_thread.run_sync(release.wait, BOUND)

    order: list[int] = []

    def blocked() -> None:
        with coord.request_sync(T, timeout=BOUND) as call:
            order.append(call.acceptance_order)

    with running(lambda: anyio.run(hold)):
        assert holding.wait(BOUND)
        with running(blocked):
            wait_until(lambda: coord.queued_count == 1)
            assert order == []
            release.set()
    assert order == [2]
    assert_idle(coord)


def test_timeout_zero_admits_what_is_free_and_refuses_what_is_not() -> None:
    coord = create_agent_coordinator(1)
    for _ in range(50):
        with coord.request_sync(T, timeout=0) as call:
            assert call.tuple == T
            for _ in range(3):
                with pytest.raises(AdmissionTimeoutError) as caught:
                    enter(coord.request_sync(T, timeout=0))
                assert isinstance(caught.value, TimeoutError)
                assert isinstance(caught.value, CoordinatorError)
                assert str(caught.value) == "the request was not admitted within its timeout"
                assert coord.queued_count == 0
    assert_idle(coord)


def test_a_timeout_leaves_nothing_queued_and_draws_nothing() -> None:
    coord = create_agent_coordinator(1)
    coord.set_budget(T, tokens_per_minute=600)
    with coord.request_sync(T, tokens=10):
        started = time.monotonic()
        with pytest.raises(AdmissionTimeoutError):
            enter(coord.request_sync(T, tokens=100, timeout=0.05))
        assert time.monotonic() - started >= 0.05
        assert coord.queued_count == 0
    stats = coord.tuple_statistics(T)
    assert stats is not None
    assert stats.tokens_available is not None
    assert stats.tokens_available <= 600 - 10 + 1  # only the first call's 10 were drawn
    assert stats.tokens_available >= 600 - 10 - 1
    assert_idle(coord)


def test_grants_racing_timeouts_never_leak_a_slot() -> None:
    coord = create_agent_coordinator(2)
    admitted = [0]
    lock = threading.Lock()

    def churn(index: int) -> None:
        for round_ in range(60):
            try:
                with coord.request_sync(T, timeout=(index + round_) % 3 * 0.0005), lock:
                    admitted[0] += 1
            except AdmissionTimeoutError:
                pass

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
        assert not thread.is_alive()
    assert admitted[0] > 0
    assert_idle(coord)
    # Every slot is still there: both can be taken at once.
    with coord.request_sync(T, timeout=0), coord.request_sync(U, timeout=0):
        pass


def test_budget_waits_are_woken_by_the_refill_with_no_other_loop() -> None:
    coord = create_agent_coordinator(4)
    coord.set_budget(T, requests_per_minute=600)  # a full bucket of 600, then one per 0.1 s
    started = time.monotonic()
    for _ in range(600):
        with coord.request_sync(T, timeout=0):
            pass
    with coord.request_sync(T, timeout=BOUND):
        pass
    assert time.monotonic() - started >= 0.09
    assert_idle(coord)


def test_settle_from_a_thread_refunds_the_budget() -> None:
    coord = create_agent_coordinator()
    coord.set_budget(T, tokens_per_minute=1000)
    with coord.request_sync(T, tokens=400) as call:
        call.settle(10)
        assert call.tokens == 10
    stats = coord.tuple_statistics(T)
    assert stats is not None
    assert stats.tokens_available is not None
    assert 989 <= stats.tokens_available <= 1000


def test_an_error_in_the_body_still_releases() -> None:
    coord = create_agent_coordinator(1)
    with pytest.raises(KeyError), coord.request_sync(T):
        raise KeyError("boom")
    assert_idle(coord)


def test_reject_on_closed_tuple_fails_at_once_and_when_closed_while_waiting() -> None:
    coord = create_agent_coordinator(1)
    coord.close_tuple(T)
    with pytest.raises(TupleSuspendedError), coord.request_sync(T, reject_on_closed_tuple=True):
        pytest.fail("admitted on a closed gate")  # pragma: no cover
    coord.open_tuple(T)
    failures: list[BaseException] = []

    def waiter() -> None:
        try:
            with coord.request_sync(T, reject_on_closed_tuple=True, timeout=BOUND):
                pytest.fail("admitted on a closed gate")  # pragma: no cover
        except TupleSuspendedError as exc:
            failures.append(exc)

    with coord.request_sync(U), running(waiter):
        wait_until(lambda: coord.queued_count == 1)
        coord.close_tuple(T)
    assert len(failures) == 1
    coord.open_tuple(T)
    assert_idle(coord)


def test_a_full_queue_is_refused() -> None:
    coord = create_agent_coordinator(config=CoordinatorConfig(max_concurrency=1, max_queued=1))

    def waiter() -> None:
        with pytest.raises(AdmissionTimeoutError), coord.request_sync(T, timeout=0.2):
            pytest.fail("admitted past the cap")  # pragma: no cover

    with coord.request_sync(T), running(waiter):
        wait_until(lambda: coord.queued_count == 1)
        with pytest.raises(CoordinatorBusyError), coord.request_sync(T, timeout=0):
            pytest.fail("admitted past the cap")  # pragma: no cover
    assert_idle(coord)


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, -math.inf])
def test_a_bad_timeout_is_refused_before_anything_happens(value: float) -> None:
    coord = create_agent_coordinator()
    with pytest.raises(InvalidArgumentError, match=TIMEOUT_MESSAGE):
        coord.request_sync(T, timeout=value)
    with pytest.raises(InvalidArgumentTypeError, match=TIMEOUT_MESSAGE):
        coord.request_sync(T, timeout=True)
    with pytest.raises(InvalidArgumentTypeError, match=TIMEOUT_MESSAGE):
        coord.request_sync(T, timeout="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"^tokens must be a nonnegative integer$"):
        coord.request_sync(T, tokens=-1)
    assert coord.next_acceptance_order() == 1  # no order was drawn


def test_an_infinite_timeout_is_no_bound() -> None:
    coord = create_agent_coordinator()
    with coord.request_sync(T, timeout=math.inf) as call:
        assert call.tuple == T


def test_entering_twice_is_a_usage_error() -> None:
    coord = create_agent_coordinator()
    context = coord.request_sync(T)
    with context, pytest.raises(UsageError, match="entered only once"):
        context.__enter__()
    assert_idle(coord)


@pytest.mark.anyio
async def test_inside_an_event_loop_it_refuses_to_block() -> None:
    coord = create_agent_coordinator()
    with pytest.raises(UsageError, match=r"use `async with coordinator.request\(...\)` here"):
        enter(coord.request_sync(T))
    assert_idle(coord)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
def test_an_interruption_inside_the_hand_off_to_the_helper_loop_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGINT may be handled inside ``call_soon_threadsafe``, once the admission's start
    is scheduled but before the helper loop was woken: the slot it is granted goes back."""
    coord = create_agent_coordinator(1)
    loop = helper_loop()
    real = loop._write_to_self  # type: ignore[attr-defined]
    interruptions = [KeyboardInterrupt()]

    def interrupted_once() -> None:
        if interruptions:
            raise interruptions.pop()  # where a signal handler would raise it
        real()

    monkeypatch.setattr(loop, "_write_to_self", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        enter(coord.request_sync(T, timeout=BOUND))
    # Whatever the loop still had to run has run: the admission, and its abandonment.
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(BOUND)
    assert_idle(coord)


def test_an_interrupted_wait_gives_its_place_back() -> None:
    coord = create_agent_coordinator(1)
    release = threading.Event()

    def holder() -> None:
        with coord.request_sync(T):
            release.wait(BOUND)

    def interrupt() -> None:
        wait_until(lambda: coord.queued_count == 1)
        os.kill(os.getpid(), signal.SIGINT)

    with running(holder):
        wait_until(lambda: coord.active_count == 1)
        with running(interrupt), pytest.raises(KeyboardInterrupt):
            enter(coord.request_sync(T, timeout=BOUND))
        assert coord.queued_count == 0
        release.set()
    assert_idle(coord)

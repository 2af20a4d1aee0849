"""Requests and permits share slots safely (CONTRACT §9), on asyncio and trio.

One test per case of issue 17, each of which failed before the fix: a deadlock between
two agents at a tuple capped at 1 (case 1), a tuple cap exceeded when a budget change
lets waiting requests go (case 2) and after a reacquire that bypassed the cap (case 3).
The rules themselves are checked step by step against the model in test_scheduler.py.
"""

from __future__ import annotations

import asyncio
import json
import threading

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from lovely_coordinator import AgentCoordinator, ModelTuple, create_agent_coordinator

pytestmark = pytest.mark.anyio

GPT = ModelTuple("openai", "gpt")
CLAUDE = ModelTuple("anthropic", "claude")


class Provider:
    """Counts the calls in flight per tuple, and the most seen at once."""

    def __init__(self) -> None:
        self.now: dict[ModelTuple, int] = {}
        self.peak: dict[ModelTuple, int] = {}

    def enter(self, t: ModelTuple) -> None:
        self.now[t] = self.now.get(t, 0) + 1
        self.peak[t] = max(self.peak.get(t, 0), self.now[t])

    def leave(self, t: ModelTuple) -> None:
        self.now[t] -= 1


def assert_idle(coord: AgentCoordinator) -> None:
    stats = coord.statistics()
    assert (stats.active, stats.queued, stats.lent) == (0, 0, 0), stats


async def test_case_1_a_foreign_covered_request_at_a_capped_tuple_deadlocks_no_one() -> None:
    # Agent A holds GPT's only unit as a permit and calls GPT second; agent B holds a
    # CLAUDE permit and calls GPT first. B's call stopped every covered request of GPT
    # behind it, A's own included, and A's permit never ended: neither ran, for good.
    with anyio.fail_after(5):
        coord = create_agent_coordinator(4)
        coord.set_tuple_limit(GPT, 1)
        calls: list[str] = []
        a_calls = anyio.Event()

        async def agent_a() -> None:
            async with coord.permit(GPT):
                await a_calls.wait()
                async with coord.request(GPT):
                    calls.append("A")

        async def agent_b() -> None:
            async with coord.permit(CLAUDE), coord.request(GPT):
                calls.append("B")

        async with anyio.create_task_group() as tg:
            tg.start_soon(agent_a)
            await wait_all_tasks_blocked()
            tg.start_soon(agent_b)
            await wait_all_tasks_blocked()
            a_calls.set()
        assert calls == ["B", "A"]
        assert_idle(coord)


async def test_case_2_a_budget_change_never_lets_more_calls_than_the_cap_run() -> None:
    # T capped at 3 with its budget spent: two own-slot requests, one covered by a
    # permit of another tuple, one more own-slot request wait. Raising the budget let
    # the grant loop serve the covered one and then grant the next own-slot request
    # without checking the cap again: 4 in flight.
    with anyio.fail_after(5):
        coord = create_agent_coordinator(8)
        coord.set_tuple_limit(GPT, 3)
        coord.set_budget(GPT, requests_per_minute=1)
        async with coord.request(GPT):
            pass  # the budget is spent now
        provider = Provider()
        finish = anyio.Event()

        async def call() -> None:
            async with coord.request(GPT):
                provider.enter(GPT)
                await finish.wait()
                provider.leave(GPT)

        async def covered_call() -> None:
            async with coord.permit(CLAUDE):
                await call()

        async with anyio.create_task_group() as tg:
            for work in (call, call, covered_call, call):
                tg.start_soon(work)
                await wait_all_tasks_blocked()
            assert provider.peak == {}
            coord.set_budget(GPT, requests_per_minute=600)
            await wait_all_tasks_blocked()
            assert provider.now == {GPT: 3}
            finish.set()
        assert provider.peak == {GPT: 3}
        assert_idle(coord)


async def test_case_3_calls_never_exceed_the_cap_after_a_reacquire_bypassed_it() -> None:
    # cap(T) = 1: X lends its T permit, Y takes T's unit, X's reacquire bypasses the cap
    # (§1), and then X and Y each call T on their own permit: 2 in flight on T.
    with anyio.fail_after(5):
        coord = create_agent_coordinator(4)
        coord.set_tuple_limit(GPT, 1)
        provider = Provider()
        y_holds = anyio.Event()
        x_back = anyio.Event()
        finish = anyio.Event()

        async def call() -> None:
            async with coord.request(GPT):
                provider.enter(GPT)
                await finish.wait()
                provider.leave(GPT)

        async def agent_x() -> None:
            async with coord.permit(GPT) as permit:
                await permit.lend(y_holds.wait)
                x_back.set()
                await call()

        async def agent_y() -> None:
            async with coord.permit(GPT):
                y_holds.set()
                await x_back.wait()
                await call()

        async with anyio.create_task_group() as tg:
            tg.start_soon(agent_x)
            await wait_all_tasks_blocked()
            tg.start_soon(agent_y)
            await wait_all_tasks_blocked()
            assert provider.now == {GPT: 1}
            # X's reacquire took T past its cap; the waiting call's permit is lent (rule L).
            stats = coord.statistics()
            assert (stats.active, stats.queued, stats.lent) == (1, 1, 1)
            finish.set()
        assert provider.peak == {GPT: 1}
        assert_idle(coord)


async def test_case_4_a_request_waiting_for_its_gate_holds_no_slot() -> None:
    # Rule L: agent A's permit is lent while A's call waits for the closed GPT gate, so
    # B's CLAUDE work runs on that slot meanwhile; once the gate opens, A's call takes
    # the slot back ahead of C, accepted after A's permit. (Before: A's permit kept the
    # only slot idle until the gate reopened.)
    with anyio.fail_after(5):
        coord = create_agent_coordinator(1)
        coord.close_tuple(GPT)
        log: list[str] = []
        b_may_end = anyio.Event()

        async def agent(name: str, call: ModelTuple, wait: anyio.Event | None = None) -> None:
            async with coord.permit(CLAUDE):
                log.append(f"{name} holds")
                async with coord.request(call):
                    log.append(f"{name} calls {call.model}")
                    if wait is not None:
                        await wait.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(agent, "A", GPT)
            await wait_all_tasks_blocked()
            stats = coord.statistics()
            assert (stats.active, stats.queued, stats.lent) == (0, 1, 1)  # A's slot is lent
            assert _waiters(coord) == [(GPT, 2, "gate")]  # what the endpoint shows
            tg.start_soon(agent, "B", CLAUDE, b_may_end)
            await wait_all_tasks_blocked()
            assert log == ["A holds", "B holds", "B calls claude"]
            tg.start_soon(agent, "C", CLAUDE)
            await wait_all_tasks_blocked()
            coord.open_tuple(GPT)
            await wait_all_tasks_blocked()
            assert log[-1] == "B calls claude"  # the only slot is B's until B ends
            b_may_end.set()
        assert log == [
            "A holds",
            "B holds",
            "B calls claude",
            "A calls gpt",  # A's call took its slot back ahead of C
            "C holds",
            "C calls claude",
        ]
        assert_idle(coord)


def _waiters(coord: AgentCoordinator) -> list[tuple[ModelTuple, int, str]]:
    """The endpoint's waiters: (tuple, acceptance order, reason)."""
    document = json.loads(coord._document())
    return [
        (ModelTuple(*w["tuple"]), w["acceptance_order"], w["reason"]) for w in document["waiters"]
    ]


@pytest.mark.parametrize("ending", ["closed", "stopped", "blocked"])
@pytest.mark.parametrize("wakeup", ["reopen", "budget"])
async def test_case_5_a_home_loop_that_ends_badly_leaves_no_waiter_of_another_thread(
    ending: str, wakeup: str
) -> None:
    # The home loop's thread runs ``loop.run_until_complete(...)`` and then closes the
    # loop without shutdown_asyncgens, or leaves it stopped, or blocks its thread: its
    # timer never fires, and a waiter here whose gate reopens (or budget refills) in
    # 0.2 s waited for good (blocked: until the home thread woke up). A backup wake-up
    # from a thread of the coordinator's own serves it (within 0.05 s of its instant).
    with anyio.fail_after(10):
        coord = create_agent_coordinator(1)
        armed = threading.Event()
        may_end = threading.Event()

        async def home() -> None:  # this thread's loop becomes home and arms the timer
            if wakeup == "reopen":
                coord.close_tuple(GPT, reopen_after=0.2)
            else:
                coord.set_budget(GPT, requests_per_minute=300)  # one every 0.2 s
                while (entry := coord.tuple_statistics(GPT)) and (
                    entry.requests_available or 0
                ) >= 1:
                    async with coord.request(GPT):
                        pass
            armed.set()
            if ending == "blocked":
                may_end.wait()  # blocks this loop's thread (user error, but not ours)
            else:
                await asyncio.to_thread(may_end.wait)

        loop = asyncio.new_event_loop()

        def run_home() -> None:
            loop.run_until_complete(home())
            if ending == "closed":
                loop.close()  # without shutdown_asyncgens: the timer's end is never seen

        thread = threading.Thread(target=run_home, daemon=True)
        thread.start()
        try:
            await anyio.to_thread.run_sync(armed.wait)
            done = anyio.Event()

            async def waiter() -> None:
                async with coord.request(GPT):
                    pass
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await wait_all_tasks_blocked()
                if ending != "blocked":
                    may_end.set()
                    await anyio.to_thread.run_sync(thread.join)  # home ended, timer pending
                await done.wait()
        finally:
            may_end.set()
            await anyio.to_thread.run_sync(thread.join)
            loop.close()  # (the test's own clean-up: stopped and blocked left it open)
        assert_idle(coord)

"""CoordinatedRateLimiter: a chat model's rate_limiter drawing requests from a tuple's budget."""

from __future__ import annotations

import anyio
import pytest
from langchain_openai import ChatOpenAI
from lovely_coordinator_langchain import CoordinatedRateLimiter
from lovely_coordinator_limits.testing import FakeProvider

from lovely_coordinator import ModelTuple, create_agent_coordinator

pytestmark = pytest.mark.anyio

GPT = ModelTuple("openai", "gpt-test")


async def test_each_call_draws_one_request_from_the_budget(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=4)
    coordinator.set_budget(GPT, requests_per_minute=2)  # two now, the next in 30 s
    limiter = CoordinatedRateLimiter(GPT, coordinator)
    model = ChatOpenAI(
        model="gpt-test",
        base_url=f"{fake_provider_url}/v1",
        api_key="test",  # type: ignore[arg-type]
        rate_limiter=limiter,
    )
    with anyio.fail_after(20):
        for _ in range(2):
            assert (await model.ainvoke("hello")).content == "ok"
        entry = coordinator.tuple_statistics(GPT)
        assert entry is not None
        assert entry.requests_available is not None
        assert entry.requests_available < 1
        assert not await limiter.aacquire(blocking=False)
        # A third call waits for the refill: the budget holds it back.
        async with anyio.create_task_group() as tg:
            tg.start_soon(model.ainvoke, "hello")
            async for statistics in coordinator.watch():
                if statistics.queued == 1:
                    break
            assert len(fake_provider.seen()) == 2
            tg.cancel_scope.cancel()
        assert coordinator.statistics().active == 0


async def test_a_closed_gate_holds_calls_back(fake_provider: FakeProvider) -> None:
    coordinator = create_agent_coordinator()
    limiter = CoordinatedRateLimiter(GPT, coordinator)
    assert await limiter.aacquire(blocking=False)  # nothing known of the tuple: open
    coordinator.close_tuple(GPT)
    assert not await limiter.aacquire(blocking=False)
    assert not limiter.acquire(blocking=False)  # checked before any wait, so fine here
    coordinator.open_tuple(GPT)
    with anyio.fail_after(10):
        assert await limiter.aacquire()

"""coordinate() with the real ChatOpenAI and ChatAnthropic against the local fake provider."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from lovely_coordinator_dev.testing.waits import until_statistics
from lovely_coordinator_langchain import coordinate
from lovely_coordinator_limits import Backoff, ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Quota, Refuse

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentTypeError,
    ModelTuple,
    create_agent_coordinator,
)

pytestmark = pytest.mark.anyio

PROVIDERS = {"127.0.0.1": "local"}
GPT = ModelTuple("local", "gpt-test")
CLAUDE = ModelTuple("local", "claude-test")


def _gpt(url: str) -> ChatOpenAI:
    return ChatOpenAI(model="gpt-test", base_url=f"{url}/v1", api_key="test", max_tokens=20)  # type: ignore[arg-type, call-arg]


def _claude(url: str) -> ChatAnthropic:
    return ChatAnthropic(model="claude-test", base_url=url, api_key="test", max_tokens=20)  # type: ignore[call-arg, arg-type]


def _handler(coordinator: AgentCoordinator) -> ProviderLimitHandler:
    # Short closures after a 429, so the retried requests are quick.
    return ProviderLimitHandler(
        coordinator, backoff=Backoff(base=0.05, factor=2.0, max_delay=1.0, jitter=0.0)
    )


async def _answer(model: BaseChatModel) -> Any:
    return (await model.ainvoke("hello")).content


async def test_the_cap_holds_at_the_provider_under_fan_out(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=3)
    gpt = coordinate(_gpt(fake_provider_url), coordinator, providers=PROVIDERS)
    claude = coordinate(_claude(fake_provider_url), coordinator, providers=PROVIDERS)
    with anyio.fail_after(30):
        async with gpt as gpt_model, claude as claude_model:
            fake_provider.pause("gpt-test")
            fake_provider.pause("claude-test")
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(_answer, gpt_model)
                    tg.start_soon(_answer, claude_model)
                await until_statistics(coordinator, lambda s: s.active == 3 and s.queued == 9)
                await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, None, 3)
                assert fake_provider.in_flight() == 3
                fake_provider.resume("gpt-test")
                fake_provider.resume("claude-test")
        assert fake_provider.peak_in_flight() == 3
        assert len(fake_provider.seen()) == 12
        assert coordinator.statistics().active == 0


async def test_a_429_is_parked_and_retried_out_of_sight(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=3)
    handler = _handler(coordinator)
    with anyio.fail_after(20):
        fake_provider.script("gpt-test", Refuse(headers={"retry-after-ms": "20"}))
        fake_provider.script("claude-test", Refuse(headers={"retry-after-ms": "20"}))
        for build in (_gpt, _claude):
            async with coordinate(
                build(fake_provider_url), coordinator, handler=handler, providers=PROVIDERS
            ) as model:
                assert await _answer(model) == "ok"
        assert [s.status for s in fake_provider.seen("gpt-test")] == [429, 200]
        assert [s.status for s in fake_provider.seen("claude-test")] == [429, 200]


async def test_budgets_are_learned_and_streams_settle(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=3)
    quota = Quota(requests_per_minute=600, tokens_per_minute=60_000)
    fake_provider.limit("gpt-test", quota)
    fake_provider.limit("claude-test", quota)
    fake_provider.reply = "a streamed answer"
    with anyio.fail_after(20):
        for build in (_gpt, _claude):
            async with coordinate(build(fake_provider_url), coordinator, providers=PROVIDERS) as m:
                pieces = [chunk.content async for chunk in m.astream("hello")]
                assert "".join(str(p) for p in pieces) == "a streamed answer"
        tuples = {t.tuple: t for t in coordinator.statistics().tuples}
        for model in (GPT, CLAUDE):
            assert tuples[model].requests_available is not None
            assert tuples[model].tokens_available is not None
            assert tuples[model].active == 0


async def test_the_model_passed_in_is_left_as_it_was(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=1)
    original = _gpt(fake_provider_url)
    coordinated = coordinate(original, coordinator, providers=PROVIDERS)
    with anyio.fail_after(20):
        async with coordinated as model:
            assert model is not original
            assert (model.max_retries, original.max_retries) == (0, None)
            assert (
                model.root_async_client.max_retries,
                original.root_async_client.max_retries,
            ) == (0, 2)
            async with coordinator.permit(GPT):
                # The original goes around the coordinator: the only slot is taken, yet
                # it answers; the copy answers on the permit.
                assert await _answer(original) == "ok"
                assert await _answer(model) == "ok"
        assert coordinated.http_async_client.is_closed
        assert coordinated.handler is ProviderLimitHandler.for_coordinator(coordinator)


def test_other_models_are_refused() -> None:
    from langchain_core.language_models import GenericFakeChatModel

    fake = GenericFakeChatModel(messages=iter(["hi"]))
    with pytest.raises(InvalidArgumentTypeError, match=r"^coordinate\(\) takes a ChatOpenAI"):
        coordinate(fake, create_agent_coordinator())


async def test_the_responses_api_goes_through_the_same_client(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=1)
    chat = ChatOpenAI(
        model="gpt-test",
        base_url=f"{fake_provider_url}/v1",
        api_key="test",  # type: ignore[arg-type]
        use_responses_api=True,
    )
    with anyio.fail_after(20):
        async with coordinate(chat, coordinator, providers=PROVIDERS) as model:
            fake_provider.pause("gpt-test")
            async with anyio.create_task_group() as tg:
                tg.start_soon(_answer, model)
                tg.start_soon(_answer, model)
                await until_statistics(coordinator, lambda s: s.active == 1 and s.queued == 1)
                fake_provider.resume("gpt-test")
    assert [s.api for s in fake_provider.seen()] == ["responses", "responses"]
    assert fake_provider.peak_in_flight() == 1

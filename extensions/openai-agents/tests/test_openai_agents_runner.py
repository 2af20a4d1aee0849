"""coordinated_client() and CoordinatedRunner with the real Agents SDK against the fake provider:
the Responses API (the SDK's default) and chat completions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import anyio.to_thread
import openai
import pytest
from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner
from agents.models.interface import Model
from lovely_coordinator_dev.testing.waits import until_statistics
from lovely_coordinator_limits import Backoff, ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Quota, Refuse
from lovely_coordinator_openai_agents import CoordinatedRunner, coordinated_client

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentTypeError,
    ModelTuple,
    create_agent_coordinator,
)

pytestmark = pytest.mark.anyio

PROVIDERS = {"127.0.0.1": "local"}


@pytest.fixture
def coordinator() -> AgentCoordinator:
    return create_agent_coordinator(max_concurrency=3)


@pytest.fixture
async def client(
    coordinator: AgentCoordinator, fake_provider_url: str
) -> AsyncIterator[openai.AsyncOpenAI]:
    # Short closures after a 429, so the retried requests are quick.
    backoff = Backoff(base=0.05, factor=2.0, max_delay=1.0, jitter=0.0)
    handler = ProviderLimitHandler(coordinator, backoff=backoff)
    base = openai.AsyncOpenAI(api_key="test", base_url=f"{fake_provider_url}/v1")
    async with coordinated_client(
        base, coordinator, handler=handler, providers=PROVIDERS
    ) as coordinated:
        yield coordinated


def _responses(name: str, client: openai.AsyncOpenAI) -> Model:
    return OpenAIResponsesModel(model=name, openai_client=client)


def _chat(name: str, client: openai.AsyncOpenAI) -> Model:
    return OpenAIChatCompletionsModel(model=name, openai_client=client)


async def test_the_cap_holds_for_both_apis_under_fan_out(
    coordinator: AgentCoordinator, client: openai.AsyncOpenAI, fake_provider: FakeProvider
) -> None:
    agents = [
        Agent(name="r", model=_responses("resp-model", client)),
        Agent(name="c", model=_chat("chat-model", client)),
    ]
    with anyio.fail_after(30):
        fake_provider.pause("resp-model")
        fake_provider.pause("chat-model")
        async with anyio.create_task_group() as tg:
            for agent in agents * 6:  # the plain SDK runner: the client alone coordinates
                tg.start_soon(Runner.run, agent, "hello")
            await until_statistics(coordinator, lambda s: s.active == 3 and s.queued == 9)
            await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, None, 3)
            assert fake_provider.in_flight() == 3
            fake_provider.resume("resp-model")
            fake_provider.resume("chat-model")
    assert fake_provider.peak_in_flight() == 3
    assert sorted(s.api for s in fake_provider.seen()) == ["openai"] * 6 + ["responses"] * 6


async def test_a_429_is_parked_and_retried_and_budgets_learned(
    coordinator: AgentCoordinator, client: openai.AsyncOpenAI, fake_provider: FakeProvider
) -> None:
    runner = CoordinatedRunner(coordinator, provider="local")
    quota = Quota(requests_per_minute=600, tokens_per_minute=60_000)
    with anyio.fail_after(20):
        for model, build in (("resp-model", _responses), ("chat-model", _chat)):
            fake_provider.limit(model, quota)
            fake_provider.script(model, Refuse(headers={"retry-after-ms": "20"}))
            result = await runner.run(Agent(name=model, model=build(model, client)), "hello")
            assert result.final_output == "ok"
            assert [s.status for s in fake_provider.seen(model)] == [429, 200]
            entry = coordinator.tuple_statistics(("local", model))
            assert entry is not None
            assert entry.requests_available is not None
            assert entry.tokens_available is not None
    assert coordinator.statistics().active == 0


async def test_a_run_holds_one_permit_its_calls_run_on(
    coordinator: AgentCoordinator, client: openai.AsyncOpenAI, fake_provider: FakeProvider
) -> None:
    runner = CoordinatedRunner(coordinator, provider="local")
    agent = Agent(name="a", model=_responses("resp-model", client))
    assert runner.tuple_of(agent) == ModelTuple("local", "resp-model")
    with anyio.fail_after(20):
        fake_provider.pause("resp-model")
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run, agent, "hello")
            await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, None, 1)
            (entry,) = coordinator.statistics().tuples
            assert (entry.tuple, entry.active, coordinator.statistics().active) == (
                ModelTuple("local", "resp-model"),
                1,
                1,
            )
            fake_provider.resume("resp-model")


@pytest.mark.parametrize("build", [_responses, _chat], ids=["responses", "chat"])
async def test_an_agent_called_as_a_tool_borrows_the_only_slot(
    client: openai.AsyncOpenAI,
    fake_provider: FakeProvider,
    build: Callable[[str, openai.AsyncOpenAI], Model],
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=1)
    runner = CoordinatedRunner(coordinator, provider="local")
    researcher = Agent(name="researcher", model=build("research-model", client))
    lead = Agent(
        name="lead",
        model=build("lead-model", client),
        tools=[runner.as_tool(researcher, tool_name="research", tool_description="Research.")],
    )
    fake_provider.use_tools = True
    fake_provider.reply = "done"
    with anyio.fail_after(30):
        fake_provider.pause("research-model")
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run, lead, "Compare the two designs.")
            await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, "research-model", 1)
            statistics = coordinator.statistics()
            assert (statistics.active, statistics.lent) == (1, 1)  # the lead's slot, lent
            fake_provider.resume("research-model")
        result = await runner.run(lead, "Again.")
    assert result.final_output == "done"
    models = [s.model for s in fake_provider.seen()]
    assert models == ["lead-model", "research-model", "lead-model"] * 2
    assert fake_provider.peak_in_flight() == 1
    assert coordinator.statistics().active == 0


async def test_a_streamed_run_holds_its_permit_for_the_block(
    client: openai.AsyncOpenAI, fake_provider: FakeProvider
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=1)
    runner = CoordinatedRunner(coordinator, provider="local")
    researcher = Agent(name="researcher", model=_responses("research-model", client))
    lead = Agent(
        name="lead",
        model=_responses("lead-model", client),
        tools=[runner.as_tool(researcher, tool_name="research", tool_description="Research.")],
    )
    fake_provider.use_tools = True
    fake_provider.reply = "a streamed answer"
    with anyio.fail_after(30):
        async with runner.run_streamed(lead, "Compare.") as result:
            assert coordinator.statistics().active == 1
            kinds = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in kinds
        assert result.final_output == "a streamed answer"
        assert coordinator.statistics().active == 0
        # Leaving the block early cancels the run and gives the permit back.
        async with runner.run_streamed(lead, "Compare.") as result:
            pass
        assert coordinator.statistics().active == 0


def test_bad_arguments_are_refused(coordinator: AgentCoordinator) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"^coordinated_client\(\) takes an openai"):
        coordinated_client(object(), coordinator)  # type: ignore[arg-type]
    runner = CoordinatedRunner(coordinator, tuple_of=lambda agent: ("p", agent.name))
    assert runner.tuple_of(Agent(name="x")) == ModelTuple("p", "x")
    assert CoordinatedRunner(coordinator).tuple_of(Agent(name="x", model="gpt-x")) == ModelTuple(
        "openai", "gpt-x"
    )
    with pytest.raises(InvalidArgumentTypeError, match=r"^CoordinatedRunner runs agents.Agent"):
        runner.as_tool(object())  # type: ignore[arg-type]

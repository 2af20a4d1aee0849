"""CoordinatedRunnable: agent runs (create_agent, LangGraph nodes) under permits, lent down."""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import anyio
import anyio.to_thread
import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from lovely_coordinator_langchain import CoordinatedRunnable, coordinate
from lovely_coordinator_limits.testing import FakeProvider

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentTypeError,
    ModelTuple,
    create_agent_coordinator,
)

pytestmark = pytest.mark.anyio

PROVIDERS = {"127.0.0.1": "local"}
LEAD = ModelTuple("local", "lead-model")
RESEARCHER = ModelTuple("local", "research-model")


@pytest.fixture
async def lead(fake_provider_url: str) -> AsyncIterator[tuple[AgentCoordinator, Any, Any]]:
    """At cap 1: a lead agent whose one tool asks a researcher agent; both wrapped."""
    coordinator = create_agent_coordinator(max_concurrency=1)

    def chat(model: str) -> ChatOpenAI:
        return ChatOpenAI(model=model, base_url=f"{fake_provider_url}/v1", api_key="test")  # type: ignore[arg-type]

    async with (
        coordinate(chat("lead-model"), coordinator, providers=PROVIDERS) as lead_model,
        coordinate(chat("research-model"), coordinator, providers=PROVIDERS) as research_model,
    ):
        researcher = CoordinatedRunnable(
            create_agent(model=research_model), RESEARCHER, coordinator
        )

        @tool
        async def research(topic: str) -> str:
            """Ask the researcher about a topic."""
            state = await researcher.ainvoke({"messages": [{"role": "user", "content": topic}]})
            return str(state["messages"][-1].content)

        agent = create_agent(model=lead_model, tools=[research])
        yield coordinator, CoordinatedRunnable(agent, LEAD, coordinator), researcher


async def test_a_delegating_agent_completes_at_cap_1(
    fake_provider: FakeProvider, lead: tuple[AgentCoordinator, Any, Any]
) -> None:
    coordinator, agent, _ = lead
    fake_provider.use_tools = True
    fake_provider.reply = "done"
    with anyio.fail_after(30):
        state = await agent.ainvoke({"messages": [{"role": "user", "content": "Compare."}]})
    messages = state["messages"]
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai"]
    assert messages[2].content == "done"  # the researcher's answer, through the tool
    assert [s.model for s in fake_provider.seen()] == ["lead-model", "research-model", "lead-model"]
    assert fake_provider.peak_in_flight() == 1
    assert coordinator.statistics().active == 0


async def test_the_lead_lends_its_permit_while_the_researcher_runs(
    fake_provider: FakeProvider, lead: tuple[AgentCoordinator, Any, Any]
) -> None:
    coordinator, agent, _ = lead
    fake_provider.use_tools = True
    fake_provider.pause("research-model")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.ainvoke, {"messages": [{"role": "user", "content": "Compare."}]})
            await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, "research-model", 1)
            statistics = coordinator.statistics()
            # The lead's permit is lent; the one slot is the researcher's.
            assert (statistics.active, statistics.lent) == (1, 1)
            fake_provider.resume("research-model")
        assert coordinator.statistics().lent == 0


async def test_a_sub_agent_alone_runs_under_its_own_permit(
    fake_provider: FakeProvider, lead: tuple[AgentCoordinator, Any, Any]
) -> None:
    coordinator, _, researcher = lead
    fake_provider.pause("research-model")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(researcher.ainvoke, {"messages": [{"role": "user", "content": "hi"}]})
            await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, "research-model", 1)
            (entry,) = coordinator.statistics().tuples
            # One slot: the run's permit, which its model call runs on.
            assert (entry.tuple, entry.active, coordinator.statistics().active) == (
                RESEARCHER,
                1,
                1,
            )
            fake_provider.resume("research-model")


class _Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


async def test_langgraph_nodes_run_under_permits_lent_by_the_graph(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=1)
    chat = ChatOpenAI(model="node-model", base_url=f"{fake_provider_url}/v1", api_key="test")  # type: ignore[arg-type]
    async with coordinate(chat, coordinator, providers=PROVIDERS) as model:

        def node(name: str, llm: BaseChatModel) -> CoordinatedRunnable:
            async def run(state: _Notes) -> _Notes:
                answer = await llm.ainvoke(f"{name}: {len(state['notes'])} notes so far")
                return {"notes": [f"{name} {answer.content}"]}

            return CoordinatedRunnable(RunnableLambda(run), ("local", "node-model"), coordinator)

        builder = StateGraph(_Notes)
        for name in ("a", "b", "c"):  # three branches at once
            builder.add_node(name, node(name, model))
            builder.add_edge(START, name)
            builder.add_edge(name, END)
        graph = CoordinatedRunnable(builder.compile(), ("local", "graph"), coordinator)
        with anyio.fail_after(30):
            state = await graph.ainvoke({"notes": []})
    assert sorted(state["notes"]) == ["a ok", "b ok", "c ok"]
    assert fake_provider.peak_in_flight() == 1
    assert coordinator.statistics().active == 0


def test_the_wrapper_takes_runnables_and_keeps_their_schemas() -> None:
    coordinator = create_agent_coordinator()
    inner: RunnableLambda[int, int] = RunnableLambda(lambda x: x + 1)
    wrapped = CoordinatedRunnable(inner, ("local", "m"), coordinator)
    assert wrapped.name == inner.get_name()
    assert wrapped.invoke(1) == 2  # sync: no permit, the runnable as it is
    assert wrapped.get_input_schema() is inner.get_input_schema()
    with pytest.raises(
        InvalidArgumentTypeError, match=r"^CoordinatedRunnable wraps a LangChain Runnable$"
    ):
        CoordinatedRunnable(lambda x: x, ("local", "m"), coordinator)  # type: ignore[arg-type]

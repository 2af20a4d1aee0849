"""CoordinatedModel with pydantic-ai's own offline models (no network)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from lovely_coordinator_pydantic_ai import CoordinatedModel, tuple_of
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from lovely_coordinator import ModelTuple, create_agent_coordinator


def test_default_tuple_is_system_and_model_name() -> None:
    model = CoordinatedModel(TestModel(), coordinator=create_agent_coordinator(1))
    assert model.tuple == ModelTuple("test", "test")
    assert tuple_of(FunctionModel(lambda m, i: ModelResponse(parts=[]), model_name="f")) == (
        "function",
        "f",
    )
    custom = CoordinatedModel(
        TestModel(), coordinator=create_agent_coordinator(1), tuple=("openai", "gpt-4o")
    )
    assert custom.tuple == ModelTuple("openai", "gpt-4o")


@pytest.mark.asyncio
@pytest.mark.parametrize("under_a_bash_permit", [False, True])
async def test_each_request_waits_for_a_permit(under_a_bash_permit: bool) -> None:
    """Also when the caller holds a permit of another coordinator (the Bash pool): only a
    permit of the model's own coordinator stands in for the model's."""
    with anyio.fail_after(5):
        coordinator, bash = create_agent_coordinator(1), create_agent_coordinator(1)
        agent = Agent(CoordinatedModel(TestModel(custom_output_text="hi"), coordinator=coordinator))
        outputs: list[str] = []
        held = await coordinator.acquire(("test", "test"))

        async def run() -> None:
            async with contextlib.AsyncExitStack() as stack:
                if under_a_bash_permit:
                    await stack.enter_async_context(bash.permit(("bash", "pool")))
                outputs.append((await agent.run("go")).output)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await wait_all_tasks_blocked()
            assert coordinator.queued_count == 1
            assert outputs == []
            held.release()
        assert outputs == ["hi"]
        assert coordinator.active_count == 0
        assert bash.active_count == 0


@pytest.mark.asyncio
async def test_a_stream_holds_its_permit_while_the_model_streams() -> None:
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(2)
        during: list[int] = []

        async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
            for piece in ["str", "eam", "ed"]:
                during.append(coordinator.active_count)
                yield piece

        model = FunctionModel(stream_function=stream, model_name="streaming")
        agent = Agent(CoordinatedModel(model, coordinator=coordinator))
        async with agent.run_stream("go") as result:
            output = await result.get_output()
        assert output == "streamed"
        assert during == [1, 1, 1]
        assert coordinator.active_count == 0


@pytest.mark.asyncio
async def test_requests_under_a_held_permit_use_it() -> None:
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(1)
        agent = Agent(CoordinatedModel(TestModel(), coordinator=coordinator))
        async with coordinator.permit(("test", "test")):
            await agent.run("go")
            assert coordinator.active_count == 1
        assert coordinator.active_count == 0


def _rate_limited(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise ModelHTTPError(
        429,
        "limited",
        {"error": {"type": "rate_limit_error"}},
        headers={"retry-after": "30"},
    )


@pytest.mark.asyncio
async def test_a_provider_limit_closes_the_tuple() -> None:
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(2)
        model = CoordinatedModel(
            FunctionModel(_rate_limited, model_name="limited"), coordinator=coordinator
        )
        agent = Agent(model)
        before = anyio.current_time()
        with pytest.raises(ModelHTTPError):
            await agent.run("go")
        t = ModelTuple("function", "limited")
        assert not coordinator.is_tuple_open(t)
        reopens_at = coordinator.tuple_reopens_at(t)
        assert reopens_at is not None
        assert before + 30 <= reopens_at <= anyio.current_time() + 30
        assert coordinator.active_count == 0
        state = model.handler.state(t)
        assert state is not None
        assert state.failures == 1


@pytest.mark.asyncio
async def test_an_ordinary_failure_keeps_the_tuple_open() -> None:
    def broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ModelHTTPError(500, "broken", "internal error")

    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(2)
        agent = Agent(
            CoordinatedModel(FunctionModel(broken, model_name="broken"), coordinator=coordinator)
        )
        with pytest.raises(ModelHTTPError):
            await agent.run("go")
        assert coordinator.is_tuple_open(("function", "broken"))
        assert coordinator.active_count == 0

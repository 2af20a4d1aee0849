"""CoordinatedModel with pydantic-ai's own offline models, and with its OpenAI model over the
real openai SDK and the coordinated httpx transport against the local fake provider."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx2
import openai
import pytest
from anyio import wait_all_tasks_blocked
from lovely_coordinator_httpx import CoordinatedTransport
from lovely_coordinator_limits import ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Refuse
from lovely_coordinator_pydantic_ai import CoordinatedModel, estimate_request, tuple_of
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import RequestUsage

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    ModelTuple,
    create_agent_coordinator,
)

pytestmark = pytest.mark.anyio  # on asyncio alone: see conftest.py


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


async def test_a_provider_limit_closes_the_tuple() -> None:
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(2)
        model = CoordinatedModel(
            FunctionModel(_rate_limited, model_name="limited"),
            coordinator=coordinator,
            max_attempts=1,  # here: what one limit does, without the retry
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


async def test_a_429_is_retried_by_the_model_keeping_no_slot() -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(1)
        calls: list[int] = []

        def once_limited(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.append(coordinator.active_count)
            if len(calls) == 1:
                raise ModelHTTPError(429, "limited", "rate limit", headers={"retry-after-ms": "10"})
            return ModelResponse(parts=[TextPart("finally")])

        model = CoordinatedModel(
            FunctionModel(once_limited, model_name="once"), coordinator=coordinator
        )
        assert (await Agent(model).run("go")).output == "finally"
        assert calls == [1, 1]
        assert coordinator.is_tuple_open(model.tuple)
        assert (coordinator.active_count, coordinator.queued_count) == (0, 0)


async def test_ordinary_failures_are_not_retried() -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(1)
        calls: list[int] = []

        def failing(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.append(1)
            raise ModelHTTPError(500, "broken", "internal error")

        model = CoordinatedModel(
            FunctionModel(failing, model_name="failing"), coordinator=coordinator
        )
        with pytest.raises(ModelHTTPError):
            await Agent(model).run("go")
        assert calls == [1]


async def test_absurd_usage_is_charged_as_the_most_a_budget_counts() -> None:
    """Regression: usage above 2**53 made the settlement raise, failing the request."""
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(1)

        def huge(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            return ModelResponse(parts=[TextPart("ok")], usage=RequestUsage(input_tokens=10**30))

        model = CoordinatedModel(FunctionModel(huge, model_name="huge"), coordinator=coordinator)
        coordinator.set_budget(model.tuple, tokens_per_minute=600)
        assert (await Agent(model).run("go")).output == "ok"
        entry = coordinator.tuple_statistics(model.tuple)
        assert entry is not None
        assert entry.tokens_available is not None
        assert entry.tokens_available <= 600 - 2**53 + 60
        assert coordinator.active_count == 0


def test_max_attempts_is_validated() -> None:
    for bad in (0, True, 1.5):
        with pytest.raises(
            InvalidArgumentError, match=r"^max_attempts must be a positive integer$"
        ):
            CoordinatedModel(TestModel(), coordinator=create_agent_coordinator(1), max_attempts=bad)  # type: ignore[arg-type]


def test_the_estimate_counts_the_prompt_and_the_output_limit() -> None:
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("x" * 40)], instructions="y" * 7),
    ]
    assert estimate_request(messages, {"max_tokens": 100}) == 12 + 100  # 48 characters
    assert estimate_request(messages, None) == 12
    assert estimate_request([], None) == 0


@asynccontextmanager
async def _openai_model(
    url: str, coordinator: AgentCoordinator, model: str = "gpt-test"
) -> AsyncIterator[tuple[CoordinatedModel, CoordinatedTransport]]:
    """pydantic-ai's OpenAI model, through the coordinated transport, wrapped: both with
    their default handler."""
    transport = CoordinatedTransport(coordinator, providers={"127.0.0.1": "openai"})
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="local",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=transport),
    )
    async with client:
        chat = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))
        yield CoordinatedModel(chat, coordinator=coordinator), transport


async def test_stacked_on_the_transport_one_handler_and_the_cap_comes_back(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    """Regression (issue 11, bug 2): the transport and the model each made their own handler,
    and after one 429 the tuple stayed capped at 1 for good."""
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        t = ModelTuple("openai", "gpt-test")
        fake_provider.script("gpt-test", Refuse(headers={"retry-after-ms": "20"}))
        async with _openai_model(fake_provider_url, coordinator) as (model, transport):
            assert model.handler is transport.handler
            assert model.handler is ProviderLimitHandler.for_coordinator(coordinator)
            assert model.tuple == t
            # The 429 is retried (by the model, which owns the call) and succeeds.
            assert (await Agent(model).run("go")).output == "ok"
        assert [s.status for s in fake_provider.seen("gpt-test")] == [429, 200]
        # The probe succeeded at the global cap of 2: the episode is over, no cap is left.
        assert model.handler.state(t) is None
        assert all(e.limit is None for e in coordinator.statistics().tuples if e.tuple == t)
        stats = coordinator.statistics()
        assert (stats.active, stats.queued) == (0, 0)


@pytest.mark.parametrize("stream", [False, True])
async def test_stacked_on_the_transport_one_call_counts_once(
    fake_provider: FakeProvider, fake_provider_url: str, stream: bool
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(1)  # a second slot would deadlock at 1
        t = ModelTuple("openai", "gpt-test")
        coordinator.set_budget(t, requests_per_minute=60)
        async with _openai_model(fake_provider_url, coordinator) as (model, _):
            start = anyio.current_time()
            if stream:
                async with Agent(model).run_stream("go") as result:
                    assert await result.get_output() == "ok"
            else:
                assert (await Agent(model).run("go")).output == "ok"
            elapsed = anyio.current_time() - start
        (entry,) = [e for e in coordinator.statistics().tuples if e.tuple == t]
        assert entry.requests_available is not None
        # One draw for the call, however many layers coordinate it (refill: 1 a second).
        assert 59 <= entry.requests_available <= 59 + elapsed + 1e-6
        assert len(fake_provider.seen("gpt-test")) == 1
        assert coordinator.active_count == 0

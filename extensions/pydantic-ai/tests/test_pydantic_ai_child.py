"""ChildAgent: a child's turn contains whatever its agent raises, and stays alive.

Real pydantic-ai agents on its offline FunctionModel (no network).
"""

from __future__ import annotations

import asyncio

import anyio
import pytest
from lovely_coordinator_pydantic_ai import AgentTree, ChildAgent, SubAgentError
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from lovely_coordinator import create_agent_coordinator


class Hostile(BaseException):
    """Not an Exception, not a cancellation: what hostile user code may raise."""


def _raising(error: BaseException) -> FunctionModel:
    calls = {"n": 0}

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls["n"] += 1
        if calls["n"] == 1:
            raise error
        return ModelResponse(parts=[TextPart("recovered")])

    return FunctionModel(respond, model_name="hostile")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "error", [Hostile("boo"), asyncio.CancelledError("raised by the user's code")]
)
async def test_a_turn_contains_what_its_agent_raises(error: BaseException) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        outcomes: list[object] = []
        async with AgentTree(coordinator) as tree:
            child = Agent(tree.wrap(_raising(error)))

            def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                if len(messages) > 1:
                    return ModelResponse(parts=[TextPart("parent done")])
                return ModelResponse(parts=[ToolCallPart("ask", {"task": "t"})])

            root = Agent(tree.wrap(FunctionModel(respond, model_name="root")))
            kept: list[ChildAgent[str]] = []

            @root.tool_plain
            async def ask(task: str) -> str:
                kept.append(tree.start(child, task))
                try:
                    outcomes.append(await kept[0].result())
                except SubAgentError as exc:
                    outcomes.append(exc)
                return "asked"

            assert await tree.run(root, "go", session_id="root") == "parent done"
            (failure,) = outcomes
            # Re-raised in the parent as a SubAgentError: a KeyboardInterrupt-like error or
            # a CancelledError must not look like the parent's own interruption.
            assert isinstance(failure, SubAgentError)
            assert str(failure) == f"Sub-agent raised {type(error).__name__}"
            assert failure.__cause__ is error
            # The child survived its turn and answers follow-ups.
            (resident,) = kept
            assert not resident.dispose_event.is_set()
            assert resident.turns == 1
            assert resident.idle
        assert coordinator.statistics().active == 0

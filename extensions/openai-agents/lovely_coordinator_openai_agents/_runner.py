"""CoordinatedRunner: each agent run under a permit, lent while agents called as tools run.

The SDK's run hooks (``RunHooks``, ``AgentHooks``) are told when an agent, a model call or a
tool starts and ends, but cannot wrap any of them: a hook could take a permit at
``on_agent_start``, but not give it back while a tool runs and take it again after, nor
hold it around a call. So the runner wraps the run itself (``Runner.run`` /
``Runner.run_streamed``) in a permit, current for the run and the tasks the SDK starts in
it, and :meth:`CoordinatedRunner.as_tool` wraps the invocation of an agent called as a
tool: while that sub-agent runs, the calling run's permit is lent, and the sub-agent runs
under a permit of its own. A handoff continues the same run (same task, same permit):
there is nothing to lend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, final

from agents import Agent, FunctionTool, Runner, RunResult, RunResultStreaming
from agents.models import get_default_model
from agents.tool_context import ToolContext

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentTypeError,
    ModelTuple,
    ModelTupleLike,
    as_model_tuple,
    get_agent_coordinator,
)

__all__ = ["CoordinatedRunner", "TupleOf"]

T = TypeVar("T")

TupleOf = Callable[[Agent[Any]], ModelTupleLike]
"""Maps an agent to the tuple its runs' permits are for."""


@final
class CoordinatedRunner:
    """Runs agents with ``agents.Runner``, each run under a permit of the agent's tuple.

    ``await runner.run(agent, input, ...)`` and ``async with runner.run_streamed(agent,
    input, ...) as result:`` take the same arguments as ``Runner.run`` /
    ``Runner.run_streamed``. Each run first lends the permit of the run it is started in
    (if any: an agent run from a tool of another run), then acquires a permit of the
    agent's tuple (in acceptance order, within the caps), runs under it, and releases it.
    The model calls of a coordinated client (:func:`coordinated_client`) then run on that
    permit's slot. Agents called as tools borrow the calling run's slot through
    :meth:`as_tool`, so a tree of agents never deadlocks, even at a cap of 1.

    Args:
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        provider: the provider part of an agent's tuple (``"openai"``).
        tuple_of: overrides the agent → tuple mapping (by default ``(provider, model
            name)``, the model name from ``agent.model`` or the SDK's default model).
        reject_on_closed_tuple: fail at once with ``TupleSuspendedError`` while the agent's
            tuple is closed, rather than wait for it to reopen.
    """

    def __init__(
        self,
        coordinator: AgentCoordinator | None = None,
        *,
        provider: str = "openai",
        tuple_of: TupleOf | None = None,
        reject_on_closed_tuple: bool = False,
    ) -> None:
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.provider = provider
        self._tuple_of = tuple_of
        self.reject_on_closed_tuple = reject_on_closed_tuple

    def tuple_of(self, agent: Agent[Any]) -> ModelTuple:
        """The tuple ``agent``'s runs hold a permit of."""
        if self._tuple_of is not None:
            return as_model_tuple(self._tuple_of(agent))
        model = agent.model
        name = model if isinstance(model, str) else getattr(model, "model", None)
        if not isinstance(name, str) or not name:
            name = get_default_model()
        return ModelTuple(self.provider, name)

    async def run(self, agent: Agent[Any], input: Any, **options: Any) -> RunResult:
        """``Runner.run(agent, input, **options)`` under a permit of the agent's tuple."""
        return await self._under_permit(agent, lambda: Runner.run(agent, input, **options))

    @asynccontextmanager
    async def run_streamed(
        self, agent: Agent[Any], input: Any, **options: Any
    ) -> AsyncIterator[RunResultStreaming]:
        """``Runner.run_streamed(agent, input, **options)`` under a permit, for the block.

        The permit is held from the start of the block to its end (read the events within
        it); a run still going when the block ends is cancelled.
        """
        _check(agent)
        async with (
            self.coordinator.lending(),
            self.coordinator.permit(
                self.tuple_of(agent), reject_on_closed_tuple=self.reject_on_closed_tuple
            ),
        ):
            # The SDK runs the agent in a task it starts now: it inherits the permit.
            result = Runner.run_streamed(agent, input, **options)
            try:
                yield result
            finally:
                if not result.is_complete:
                    result.cancel()

    def as_tool(self, agent: Agent[Any], **as_tool_options: Any) -> FunctionTool:
        """``agent.as_tool(**as_tool_options)``, its runs lending the caller's permit.

        While the tool runs the sub-agent, the permit of the run that called the tool is
        lent, and the sub-agent runs under a permit of its own tuple: at a cap of 1 the
        slot passes to the sub-agent and back.
        """
        _check(agent)
        options = {"tool_name": None, "tool_description": None, **as_tool_options}
        tool = agent.as_tool(**options)
        invoke = tool.on_invoke_tool

        async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> Any:
            return await self._under_permit(agent, lambda: invoke(context, arguments))

        # The tool is ours (made just now): its invoker, error handling included, is kept
        # and called inside the permit.
        tool.on_invoke_tool = on_invoke_tool
        return tool

    async def _under_permit(self, agent: Agent[Any], work: Callable[[], Awaitable[T]]) -> T:
        _check(agent)
        model_tuple = self.tuple_of(agent)

        async def run() -> T:
            async with self.coordinator.permit(
                model_tuple, reject_on_closed_tuple=self.reject_on_closed_tuple
            ):
                return await work()

        return await self.coordinator.with_lent_permit(run)


def _check(agent: object) -> None:
    if not isinstance(agent, Agent):
        raise InvalidArgumentTypeError("CoordinatedRunner runs agents.Agent objects")

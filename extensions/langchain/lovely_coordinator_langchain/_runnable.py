"""CoordinatedRunnable: each run of an agent (any runnable) under a permit, lent to sub-runs.

LangChain's callbacks are told when a run starts and ends, but cannot wrap it: a handler
cannot hold a permit *around* the run, nor give it back while the run waits for a sub-run
and take it again after. A runnable wrapper can. So an agent (a ``create_agent`` graph, a
chain, a LangGraph node) wrapped in :class:`CoordinatedRunnable` runs each ``ainvoke``
under a permit of its tuple, current for the run and every task it starts, so the model
calls it makes through a coordinated client run on that permit's slot. A wrapped runnable
started inside another one's run (a sub-agent called from a tool, a node of a graph
that itself runs under a permit) first lends the enclosing permit, so the parent's slot
serves the sub-run while the parent waits for it: a tree of agents never deadlocks, even
at a cap of 1.
"""

from __future__ import annotations

from typing import Any, final

from langchain_core.runnables import Runnable, RunnableConfig

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentTypeError,
    ModelTupleLike,
    as_model_tuple,
    get_agent_coordinator,
)

__all__ = ["CoordinatedRunnable"]


@final
class CoordinatedRunnable(Runnable[Any, Any]):
    """Runs ``runnable`` under a permit of ``tuple`` for each async run, lending the
    enclosing run's permit (if any) while it runs.

    ``ainvoke`` (and ``abatch``, ``astream``, which LangChain builds on it): lends the
    current permit of the coordinator, if the calling task runs under one, acquires a
    permit of ``tuple`` (in acceptance order, within the caps; it waits while the
    tuple's gate is closed unless ``reject_on_closed_tuple``), runs the runnable under
    it, releases it, and takes the lent one back. Streaming through the wrapper yields
    the output once the run has finished.

    ``invoke`` (sync) runs the runnable as it is: a thread has no permit to hold or lend,
    and each model call of a coordinated client is admitted on its own by the sync
    transport.

    Args:
        runnable: the agent, chain or node to run.
        tuple: the ``(provider, model)`` its permit is for (its main model).
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        reject_on_closed_tuple: fail at once with ``TupleSuspendedError`` while the
            tuple's gate is closed, rather than wait for it to reopen.
        name: the runnable's name in traces; defaults to the wrapped one's.

    Raises:
        InvalidArgumentTypeError: ``runnable`` is not a LangChain ``Runnable``.
        InvalidArgumentError: ``tuple`` is not a valid model tuple.
    """

    def __init__(
        self,
        runnable: Runnable[Any, Any],
        tuple: ModelTupleLike,
        coordinator: AgentCoordinator | None = None,
        *,
        reject_on_closed_tuple: bool = False,
        name: str | None = None,
    ) -> None:
        if not isinstance(runnable, Runnable):
            raise InvalidArgumentTypeError("CoordinatedRunnable wraps a LangChain Runnable")
        self.runnable = runnable
        self.tuple = as_model_tuple(tuple)
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.reject_on_closed_tuple = reject_on_closed_tuple
        self.name = name if name is not None else runnable.get_name()

    @property
    def InputType(self) -> Any:
        return self.runnable.InputType

    @property
    def OutputType(self) -> Any:
        return self.runnable.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.runnable.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.runnable.get_output_schema(config)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return self.runnable.invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        async def run() -> Any:
            async with self.coordinator.permit(
                self.tuple, reject_on_closed_tuple=self.reject_on_closed_tuple
            ):
                return await self.runnable.ainvoke(input, config, **kwargs)

        return await self.coordinator.with_lent_permit(run)

"""ChildAgent: a sub-agent of an AgentTree, answering its first prompt and then follow-ups.

A child lives in a task of its tree. It takes prompts from an unbounded inbox (its first
prompt, then follow-up input through the resident protocol), runs one turn per prompt
under a coordinator permit for its tuple, with the conversation so far, and hands each
result on: the first to a parent that waits for it (:meth:`AgentTree.ask`), every other
one to its parent's notification route.

A turn contains whatever the agent raises (any ``BaseException`` but a real cancellation,
on asyncio told apart from a ``CancelledError`` the user's code raised by the task's
cancellation count): it becomes the turn's result, and the child stays alive. Stopping a
turn (:meth:`ChildAgent.stop`) cancels only that turn; disposing the child
(:meth:`ChildAgent.dispose`) also ends its task and unbinds it from the coordinator.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, final

import anyio
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from lovely_coordinator import AgentCoordinator, ModelTuple

from ._errors import ChildDisposedError, ChildStoppedError, SubAgentError

__all__ = ["ChildAgent", "RunOptions", "Tree"]

OutputT = TypeVar("OutputT")


class Tree(Protocol):
    """What a child needs of its :class:`~._tree.AgentTree` (kept apart, so the two
    modules do not import each other)."""

    @property
    def coordinator(self) -> AgentCoordinator: ...

    def _touch(self, child: ChildAgent[Any]) -> None: ...

    def _run_ended(self, session_id: str) -> None: ...

    async def _deliver(self, child: ChildAgent[Any], content: object) -> None: ...


@final
class RunOptions:
    """What every turn of a session passes to ``Agent.run`` besides the prompt."""

    __slots__ = ("deps", "model_settings", "usage_limits")

    def __init__(
        self, deps: object, usage_limits: UsageLimits | None, model_settings: ModelSettings | None
    ) -> None:
        self.deps = deps
        self.usage_limits = usage_limits
        self.model_settings = model_settings


@final
class ChildAgent(Generic[OutputT]):
    """A running sub-agent: a resident that answers its first prompt and then follow-ups.

    Attributes:
        session_id: its session id (also its resident and notification-route key).
        parent_id: the session that started it.
        depth: its depth (its parent's + 1).
        tuple: the model tuple its turns run under.
        kept: whether it outlives its parent's run (see :class:`AgentTree`).
        dispose_event: set once it is disposed; also the ``dispose`` event of its
            :class:`~lovely_coordinator.SessionContext`.

    Created by :class:`AgentTree`, not directly.
    """

    def __init__(
        self,
        tree: Tree,
        agent: Agent[Any, OutputT],
        options: RunOptions,
        *,
        session_id: str,
        parent_id: str,
        depth: int,
        tuple: ModelTuple,
        kept: bool,
    ) -> None:
        self.session_id = session_id
        self.parent_id = parent_id
        self.depth = depth
        self.tuple = tuple
        self.kept = kept
        self.dispose_event = anyio.Event()
        self._tree = tree
        self._agent = agent
        self._options = options
        self._history: list[ModelMessage] = []
        self._send, self._inbox = anyio.create_memory_object_stream[str](math.inf)
        self._turns = 0
        self._busy = False
        self._first = anyio.Event()
        self._first_output: OutputT | None = None
        self._first_error: BaseException | None = None
        self._awaited = False  # a parent is waiting for the first result right now
        self._turn_scope: anyio.CancelScope | None = None
        self._unbind: list[Callable[[], None]] = []

    @property
    def turns(self) -> int:
        """Turns completed so far (successful or not)."""
        return self._turns

    @property
    def idle(self) -> bool:
        """Whether it is alive, has run its first turn, and is neither running a turn nor
        holding queued input. (A child whose first turn has not begun is not idle: its
        task has not started yet, and its first prompt is still to be answered.)"""
        return (
            not self.dispose_event.is_set()
            and self._turns > 0
            and not self._busy
            and self._send.statistics().current_buffer_used == 0
        )

    async def result(self) -> OutputT:
        """Wait for the first turn and return its output.

        Raises:
            ChildStoppedError: the turn was stopped (or the child disposed) first.
            SubAgentError: the turn raised a ``BaseException`` that is not an
                ``Exception`` (it is the ``__cause__``).
            Exception: whatever the turn raised (a provider limit, for instance).
        """
        await self._first.wait()
        error = self._first_error
        if error is None:
            return self._first_output  # type: ignore[return-value]  # set with the event
        if isinstance(error, Exception):
            raise error
        # Re-raising a KeyboardInterrupt or a CancelledError in the parent's task would
        # make it look interrupted itself.
        raise SubAgentError(f"Sub-agent raised {type(error).__name__}") from error

    def input(self, content: object, delivery: str = "followup", **options: object) -> int:
        """Queue a follow-up prompt; its result goes to the parent's notification route.

        Args:
            content: the prompt (converted with ``str``).
            delivery: ``"followup"``, ``"steer"`` or ``"stdin"``; all queue a new turn.
            options: accepted for the resident protocol and ignored.

        Returns:
            The number of prompts queued behind the child's current work (0 when this
            one was taken at once).

        Raises:
            ChildDisposedError: the child has been disposed.
        """
        try:
            self._send.send_nowait(str(content))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ChildDisposedError("Sub-agent has been disposed") from None
        return self._send.statistics().current_buffer_used

    def stop(self) -> None:
        """Cancel the running turn, if any; the child stays resident for follow-ups."""
        if self._turn_scope is not None:
            self._turn_scope.cancel()

    def dispose(self) -> None:
        """Stop the child for good: cancel its turn, refuse input, and unbind it. Idempotent."""
        if self.dispose_event.is_set():
            return
        self.dispose_event.set()
        self._send.close()
        self.stop()
        for unbind in reversed(self._unbind):
            unbind()
        self._unbind.clear()
        if not self._first.is_set():
            self._first_error = ChildStoppedError("Sub-agent was disposed before it answered")
            self._first.set()

    async def _live(self, prompt: str) -> None:
        try:
            async with self._inbox:
                if self.dispose_event.is_set():
                    return  # disposed before this task even started
                await self._turn(prompt)
                async for next_prompt in self._inbox:
                    await self._turn(next_prompt)
        finally:
            self.dispose()

    async def _turn(self, prompt: str) -> None:
        first = self._turns == 0
        output: OutputT | None = None
        error: BaseException | None = None
        options = self._options
        self._busy = True
        self._tree._touch(self)
        with anyio.CancelScope() as scope:
            self._turn_scope = scope
            try:
                async with self._tree.coordinator.permit(self.tuple):
                    run = await self._agent.run(
                        prompt,
                        message_history=self._history,
                        deps=options.deps,
                        usage_limits=options.usage_limits,
                        model_settings=options.model_settings,
                    )
                self._history = run.all_messages()
                output = run.output
            except BaseException as exc:
                if _cancelled_for_real(exc, scope):
                    raise
                error = exc
            finally:
                self._busy = False
                self._turn_scope = None
                self._tree._run_ended(self.session_id)
        if scope.cancelled_caught:
            error = ChildStoppedError("Sub-agent was stopped before it answered")
        self._turns += 1
        if first and not self._first.is_set():  # dispose() may have settled it already
            self._first_output, self._first_error = output, error
            self._first.set()
            if self._awaited:
                return  # the waiting parent receives it directly
        if not self.dispose_event.is_set():
            await self._tree._deliver(self, error if error is not None else output)


def _cancelled_for_real(exc: BaseException, scope: anyio.CancelScope) -> bool:
    """Whether ``exc`` is a cancellation of this task, not one the agent's code raised."""
    if not isinstance(exc, anyio.get_cancelled_exc_class()):
        return False
    if scope.cancel_called:
        return True
    task = asyncio.current_task()  # pydantic-ai runs on asyncio only
    return task is None or task.cancelling() > 0

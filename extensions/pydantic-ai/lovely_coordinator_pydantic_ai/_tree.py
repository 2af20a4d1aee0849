"""AgentTree: pydantic-ai agents that start sub-agents under one coordinator.

A *session* is one agent conversation known to the coordinator: a root session started
with :meth:`AgentTree.run`, or a child started from inside a session with
:meth:`AgentTree.ask` / :meth:`AgentTree.start` (or the tool from :meth:`AgentTree.tool`).
Each session has a :class:`~lovely_coordinator.SessionContext` bound under its id: its
depth (0 for a root, parent + 1 for a child) and whether it may start sub-agents.

Every turn of a session runs under a coordinator permit for its model tuple. A parent that
waits for a child *lends* its permit meanwhile (``coordinator.with_lent_permit``), so a
tree of agents cannot deadlock at full capacity: the parent's slot goes to the child (or
to earlier work) and the parent queues to take one back before its model loop continues.

Children are residents (``bind_resident``): they stay alive after their first answer, and
``coordinator.get_resident(child_id).input(text, "followup")`` runs another turn with the
conversation so far. Results nobody is waiting for (a detached child's, every follow-up's)
go to the parent through its notification route as a
:class:`~lovely_coordinator.ParentNotification`; a child session's own route steers such
results into the child's conversation as follow-up input.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any, final

import anyio
import anyio.abc
from lovely_coordinator_limits import ModelTupleLike, ProviderLimitHandler, as_model_tuple
from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model

from lovely_coordinator import (
    AgentCoordinator,
    CoordinatorError,
    InvalidArgumentError,
    ModelTuple,
    ParentNotification,
    SessionContext,
    get_agent_coordinator,
)

from ._model import CoordinatedModel, tuple_of

__all__ = [
    "AgentTree",
    "ChildAgent",
    "ChildDisposedError",
    "ChildStoppedError",
    "SpawnRefusedError",
    "SubAgentError",
    "current_session",
]

_session: ContextVar[str | None] = ContextVar(
    "lovely_coordinator_pydantic_ai.session", default=None
)

Route = Callable[[ParentNotification], object]

_log = logging.getLogger("lovely_coordinator_pydantic_ai")


def current_session() -> str | None:
    """The id of the managed session this task runs in, or ``None`` outside any."""
    return _session.get()


class SubAgentError(CoordinatorError):
    """Base class of the sub-agent errors of this package."""


class SpawnRefusedError(SubAgentError, RuntimeError):
    """The current session may not start a sub-agent (not managed, not allowed, too deep)."""


class ChildStoppedError(SubAgentError):
    """The sub-agent's turn was stopped before it produced a result."""


class ChildDisposedError(SubAgentError, RuntimeError):
    """The sub-agent has been disposed and accepts no more input."""


@final
class ChildAgent:
    """A running sub-agent: a resident that answers its first prompt and then follow-ups.

    Attributes:
        session_id: its session id (also its resident and notification-route key).
        parent_id: the session that started it.
        depth: its depth (its parent's + 1).
        tuple: the model tuple its turns run under.
        dispose_event: set once it is disposed; also the ``dispose`` event of its
            :class:`~lovely_coordinator.SessionContext`.

    Created by :class:`AgentTree`, not directly.
    """

    def __init__(
        self,
        tree: AgentTree,
        agent: Agent[None, Any],
        *,
        session_id: str,
        parent_id: str,
        depth: int,
        tuple: ModelTuple,
    ) -> None:
        self.session_id = session_id
        self.parent_id = parent_id
        self.depth = depth
        self.tuple = tuple
        self._tree = tree
        self._agent = agent
        self._history: list[ModelMessage] = []
        self._send, self._inbox = anyio.create_memory_object_stream[str](math.inf)
        self._turns = 0
        self._first = anyio.Event()
        self._first_output: object = None
        self._first_error: BaseException | None = None
        self._awaited = False  # a parent is waiting for the first result right now
        self._turn_scope: anyio.CancelScope | None = None
        self._unbind: list[Callable[[], None]] = []
        self.dispose_event = anyio.Event()

    @property
    def turns(self) -> int:
        """Turns completed so far (successful or not)."""
        return self._turns

    async def result(self) -> object:
        """Wait for the first turn and return its output.

        Raises:
            ChildStoppedError: the turn was stopped (or the child disposed) first.
            Exception: whatever the turn raised (a provider limit, for instance).
        """
        await self._first.wait()
        if self._first_error is not None:
            raise self._first_error
        return self._first_output

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
        """Stop the child for good: cancel its turn, refuse input, and unbind it."""
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
        token = _session.set(self.session_id)
        try:
            async with self._inbox:
                if self.dispose_event.is_set():
                    return  # disposed before this task even started
                await self._turn(prompt)
                async for next_prompt in self._inbox:
                    await self._turn(next_prompt)
        finally:
            _session.reset(token)
            self.dispose()

    async def _turn(self, prompt: str) -> None:
        first = self._turns == 0
        output: object = None
        error: BaseException | None = None
        with anyio.CancelScope() as scope:
            self._turn_scope = scope
            try:
                async with self._tree.coordinator.permit(self.tuple):
                    run = await self._agent.run(prompt, message_history=self._history)
                self._history = run.all_messages()
                output = run.output
            except Exception as exc:
                error = exc
        self._turn_scope = None
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


@final
class AgentTree:
    """Runs pydantic-ai agents as sessions that may start sub-agents (see the module doc).

    Use it as an async context manager: children run as tasks of it and are disposed when
    it exits.

    Args:
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        max_depth: the deepest a child may be (a root is depth 0), an int ≥ 0.
        handler: the limit handler for the models it wraps; defaults to a new one.

    Raises:
        InvalidArgumentError: ``max_depth`` is not an int ≥ 0.
    """

    def __init__(
        self,
        coordinator: AgentCoordinator | None = None,
        *,
        max_depth: int = 2,
        handler: ProviderLimitHandler | None = None,
    ) -> None:
        if type(max_depth) is not int or max_depth < 0:
            raise InvalidArgumentError("max_depth must be a nonnegative integer")
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.max_depth = max_depth
        self.handler = handler if handler is not None else ProviderLimitHandler(self.coordinator)
        self._ids = itertools.count(1)
        self._children: dict[str, ChildAgent] = {}
        self._undelivered: list[ParentNotification] = []
        self._task_group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> AgentTree:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        for child in list(self._children.values()):
            child.dispose()
        assert self._task_group is not None
        try:
            return await self._task_group.__aexit__(exc_type, exc, tb)
        finally:
            self._task_group = None

    def wrap(self, model: Model, *, tuple: ModelTupleLike | None = None) -> CoordinatedModel:
        """``model`` as a :class:`CoordinatedModel` on this tree's coordinator and handler."""
        return CoordinatedModel(
            model, coordinator=self.coordinator, tuple=tuple, handler=self.handler
        )

    def children(self) -> Sequence[ChildAgent]:
        """The live children, in the order they were started."""
        return tuple(self._children.values())

    def undelivered(self) -> Sequence[ParentNotification]:
        """Notifications whose parent had no route bound when they were delivered."""
        return tuple(self._undelivered)

    async def run(
        self,
        agent: Agent[None, Any],
        prompt: str,
        *,
        session_id: str,
        allow_agents: bool = True,
        tuple: ModelTupleLike | None = None,
        on_notification: Route | None = None,
        message_history: Sequence[ModelMessage] | None = None,
    ) -> Any:
        """Run a root session (depth 0) under a permit and return the agent's output.

        Args:
            agent: the agent; its model should be a :class:`CoordinatedModel` (:meth:`wrap`).
            prompt: the user prompt.
            session_id: the session's id (its context and route key).
            allow_agents: whether it may start sub-agents.
            tuple: the tuple its permit is for; by default the agent model's.
            on_notification: bound as its notification route while it runs.
            message_history: earlier messages of the conversation.
        """
        t = _agent_tuple(agent, tuple)
        unbinds = [
            self.coordinator.bind_session_context(session_id, SessionContext(0, allow_agents))
        ]
        if on_notification is not None:
            unbinds.append(self.coordinator.bind_notification_route(session_id, on_notification))
        token = _session.set(session_id)
        try:
            async with self.coordinator.permit(t):
                result = await agent.run(prompt, message_history=message_history)
            return result.output
        finally:
            _session.reset(token)
            for unbind in reversed(unbinds):
                unbind()

    def start(
        self,
        agent: Agent[None, Any],
        prompt: str,
        *,
        allow_agents: bool = True,
        tuple: ModelTupleLike | None = None,
    ) -> ChildAgent:
        """Start a child of the current session, detached: its results arrive by notification.

        Raises:
            SpawnRefusedError: no current session, it may not start agents, or the child
                would be deeper than ``max_depth``.
        """
        return self._spawn(agent, prompt, allow_agents=allow_agents, tuple=tuple, awaited=False)

    async def ask(
        self,
        agent: Agent[None, Any],
        prompt: str,
        *,
        allow_agents: bool = True,
        tuple: ModelTupleLike | None = None,
    ) -> object:
        """Start a child of the current session and wait for its first answer.

        The current permit is lent while waiting. The child stays resident afterwards.

        Raises:
            SpawnRefusedError: as for :meth:`start`.
            Exception: whatever the child's turn raised.
        """
        child = self._spawn(agent, prompt, allow_agents=allow_agents, tuple=tuple, awaited=True)
        try:
            return await self.coordinator.with_lent_permit(child.result)
        finally:
            child._awaited = False

    def tool(
        self,
        agent: Agent[None, Any],
        *,
        name: str = "delegate",
        description: str = "Give a task to a sub-agent and wait for its answer.",
    ) -> Tool[Any]:
        """A pydantic-ai tool that asks a child ``agent`` and returns its answer as text.

        A refusal or a failed child comes back as text too, so the parent's model can react.
        """

        async def delegate(task: str) -> str:
            try:
                return str(await self.ask(agent, task))
            except SpawnRefusedError as exc:
                return f"Refused: {exc}"
            except Exception as exc:
                return f"The sub-agent failed: {type(exc).__name__}: {exc}"

        return Tool(delegate, name=name, description=description, takes_ctx=False)

    def _spawn(
        self,
        agent: Agent[None, Any],
        prompt: str,
        *,
        allow_agents: bool,
        tuple: ModelTupleLike | None,
        awaited: bool,
    ) -> ChildAgent:
        if self._task_group is None:
            raise SpawnRefusedError("AgentTree is not running: use it as an async context manager")
        parent_id = _session.get()
        parent = self.coordinator.get_session_context(parent_id) if parent_id else None
        if parent_id is None or parent is None:
            raise SpawnRefusedError("No managed session: start the parent with AgentTree.run")
        if not parent.allow_agents:
            raise SpawnRefusedError("Sub-agents are not allowed in this session")
        if parent.depth + 1 > self.max_depth:
            raise SpawnRefusedError(f"Sub-agent depth limit reached (max_depth={self.max_depth})")
        t = _agent_tuple(agent, tuple)
        child_id = f"{parent_id}/{next(self._ids)}"
        child = ChildAgent(
            self, agent, session_id=child_id, parent_id=parent_id, depth=parent.depth + 1, tuple=t
        )
        child._awaited = awaited
        context = SessionContext(parent.depth + 1, allow_agents, dispose=child.dispose_event)
        coordinator = self.coordinator
        child._unbind = [
            coordinator.bind_session_context(child_id, context),
            coordinator.bind_resident(child_id, child),
            coordinator.bind_notification_route(child_id, _steer_into(child)),
            lambda: self._forget(child_id),
        ]
        self._children[child_id] = child
        self._task_group.start_soon(child._live, prompt, name=f"sub-agent {child_id}")
        return child

    def _forget(self, child_id: str) -> None:
        self._children.pop(child_id, None)

    async def _deliver(self, child: ChildAgent, content: object) -> None:
        notification = ParentNotification(
            id=f"{child.session_id}#{child.turns}", task_ref=child.session_id, content=content
        )
        route = self.coordinator.get_notification_route(child.parent_id)
        if route is None:
            self._undelivered.append(notification)
            return
        try:
            outcome = route(notification)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            # A broken route must not take the child (or the whole tree) down with it.
            _log.exception("notification route of %s failed", child.parent_id)


def _steer_into(child: ChildAgent) -> Route:
    def steer(notification: ParentNotification) -> None:
        child.input(f"[{notification.task_ref}] {notification.content}", "steer")

    return steer


def _agent_tuple(agent: Agent[None, Any], explicit: ModelTupleLike | None) -> ModelTuple:
    if explicit is not None:
        return as_model_tuple(explicit)
    model = agent.model
    if isinstance(model, CoordinatedModel):
        return model.tuple
    if isinstance(model, Model):
        return tuple_of(model)
    raise SpawnRefusedError("The agent has no model instance: pass tuple=(provider, model)")

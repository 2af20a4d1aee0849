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

Residents. A child is a resident (``bind_resident``) while it lives:
``coordinator.get_resident(child_id).input(text, "followup")`` runs another turn with the
conversation so far. Results nobody is waiting for (a detached child's, every follow-up's)
go to the parent through its notification route as a
:class:`~lovely_coordinator.ParentNotification`; a child session's own route steers such
results into the child's conversation as follow-up input. How long a child lives:

- by default (``keep=False``, as for :meth:`ask` and :meth:`tool`) until its parent's run
  ends — the root's :meth:`run` returning, or the parent child's turn ending — when it is
  disposed and unbound, running or not;
- with ``keep=True`` (the default of :meth:`start`, whose results arrive later by
  notification) until it is disposed or the tree exits, at most ``max_residents`` of them
  at once: a new one beyond that disposes the least recently used idle one, and is
  refused with :class:`SpawnRefusedError` when none is idle.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TypeVar, final, overload

import anyio
import anyio.abc
from lovely_coordinator_limits import ModelTupleLike, ProviderLimitHandler, as_model_tuple
from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    ModelTuple,
    ParentNotification,
    SessionContext,
    UsageError,
    get_agent_coordinator,
)

from ._child import ChildAgent, RunOptions
from ._errors import SpawnRefusedError
from ._model import CoordinatedModel, tuple_of

__all__ = ["AgentTree", "current_session"]

_session: ContextVar[str | None] = ContextVar(
    "lovely_coordinator_pydantic_ai.session", default=None
)

Route = Callable[[ParentNotification], object]
DepsT = TypeVar("DepsT")
OutputT = TypeVar("OutputT")

_log = logging.getLogger("lovely_coordinator.pydantic_ai")
_NOT_RUNNING = "AgentTree is not running: use it as `async with AgentTree(...) as tree:`"


def current_session() -> str | None:
    """The id of the managed session this task runs in, or ``None`` outside any."""
    return _session.get()


@final
class AgentTree:
    """Runs pydantic-ai agents as sessions that may start sub-agents (see the module doc).

    Use it as an async context manager: children run as tasks of it and are disposed when
    it exits. An exception leaving the ``async with`` body leaves it as it is (never
    wrapped in an exception group).

    Args:
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        max_depth: the deepest a child may be (a root is depth 0), an int ≥ 0.
        max_residents: the most kept children alive at once, an int ≥ 0.
        handler: the limit handler for the models it wraps; defaults to the
            coordinator's shared one (``ProviderLimitHandler.for_coordinator``).

    Raises:
        InvalidArgumentError: ``max_depth`` or ``max_residents`` is not an int ≥ 0.
    """

    def __init__(
        self,
        coordinator: AgentCoordinator | None = None,
        *,
        max_depth: int = 2,
        max_residents: int = 16,
        handler: ProviderLimitHandler | None = None,
    ) -> None:
        if type(max_depth) is not int or max_depth < 0:
            raise InvalidArgumentError("max_depth must be a nonnegative integer")
        if type(max_residents) is not int or max_residents < 0:
            raise InvalidArgumentError("max_residents must be a nonnegative integer")
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.max_depth = max_depth
        self.max_residents = max_residents
        self.handler = (
            handler
            if handler is not None
            else ProviderLimitHandler.for_coordinator(self.coordinator)
        )
        self._ids = itertools.count(1)
        self._uses = itertools.count(1)
        # Invariants: every live child is in _children and in _children_of[its parent];
        # a disposed child is in neither (its unbind list forgets it).
        self._children: dict[str, ChildAgent[Any]] = {}
        self._children_of: dict[str, list[ChildAgent[Any]]] = {}
        self._last_used: dict[str, int] = {}
        self._undelivered: list[ParentNotification] = []
        self._task_group: anyio.abc.TaskGroup | None = None
        self._entered = False

    async def __aenter__(self) -> AgentTree:
        if self._entered:
            raise UsageError("This AgentTree has already been entered")
        self._entered = True
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task_group, self._task_group = self._task_group, None
        if task_group is None:
            return
        for child in list(self._children.values()):
            child.dispose()
        # The children contain their own failures, so the group ends with nothing to
        # raise of its own; the body's exception is not handed to it, so it propagates
        # as it is, never wrapped in an exception group.
        task_group.cancel_scope.cancel()
        await task_group.__aexit__(None, None, None)

    def wrap(
        self,
        model: Model,
        *,
        tuple: ModelTupleLike | None = None,
        reject_on_closed_tuple: bool = False,
        max_attempts: int = 5,
    ) -> CoordinatedModel:
        """``model`` as a :class:`CoordinatedModel` on this tree's coordinator and handler."""
        return CoordinatedModel(
            model,
            coordinator=self.coordinator,
            tuple=tuple,
            handler=self.handler,
            reject_on_closed_tuple=reject_on_closed_tuple,
            max_attempts=max_attempts,
        )

    def children(self) -> Sequence[ChildAgent[Any]]:
        """The live children, in the order they were started."""
        return tuple(self._children.values())

    def undelivered(self) -> Sequence[ParentNotification]:
        """Notifications whose parent had no route bound when they were delivered."""
        return tuple(self._undelivered)

    @overload
    async def run(
        self,
        agent: Agent[None, OutputT],
        prompt: str,
        *,
        session_id: str,
        deps: None = None,
        usage_limits: UsageLimits | None = None,
        model_settings: ModelSettings | None = None,
        message_history: Sequence[ModelMessage] | None = None,
        allow_agents: bool = True,
        tuple: ModelTupleLike | None = None,
        on_notification: Route | None = None,
    ) -> OutputT: ...

    @overload
    async def run(
        self,
        agent: Agent[DepsT, OutputT],
        prompt: str,
        *,
        session_id: str,
        deps: DepsT,
        usage_limits: UsageLimits | None = None,
        model_settings: ModelSettings | None = None,
        message_history: Sequence[ModelMessage] | None = None,
        allow_agents: bool = True,
        tuple: ModelTupleLike | None = None,
        on_notification: Route | None = None,
    ) -> OutputT: ...

    async def run(
        self,
        agent: Agent[Any, OutputT],
        prompt: str,
        *,
        session_id: str,
        deps: Any = None,
        usage_limits: UsageLimits | None = None,
        model_settings: ModelSettings | None = None,
        message_history: Sequence[ModelMessage] | None = None,
        allow_agents: bool = True,
        tuple: ModelTupleLike | None = None,
        on_notification: Route | None = None,
    ) -> OutputT:
        """Run a root session (depth 0) under a permit and return the agent's output.

        Its children that were not kept are disposed when it returns (or raises).

        Args:
            agent: the agent; its model should be a :class:`CoordinatedModel` (:meth:`wrap`).
            prompt: the user prompt.
            session_id: the session's id (its context and route key).
            deps, usage_limits, model_settings: passed to ``agent.run``.
            message_history: earlier messages of the conversation.
            allow_agents: whether it may start sub-agents.
            tuple: the tuple its permit is for; by default the agent model's.
            on_notification: bound as its notification route while it runs.

        Raises:
            UsageError: the tree is not running (not entered with ``async with``).
        """
        if self._task_group is None:
            raise UsageError(_NOT_RUNNING)
        t = _agent_tuple(agent, tuple)
        unbinds = [
            self.coordinator.bind_session_context(session_id, SessionContext(0, allow_agents))
        ]
        if on_notification is not None:
            unbinds.append(self.coordinator.bind_notification_route(session_id, on_notification))
        token = _session.set(session_id)
        try:
            async with self.coordinator.permit(t):
                result = await agent.run(
                    prompt,
                    message_history=message_history,
                    deps=deps,
                    usage_limits=usage_limits,
                    model_settings=model_settings,
                )
            return result.output
        finally:
            _session.reset(token)
            self._run_ended(session_id)
            for unbind in reversed(unbinds):
                unbind()

    def start(
        self,
        agent: Agent[Any, OutputT],
        prompt: str,
        *,
        deps: Any = None,
        usage_limits: UsageLimits | None = None,
        model_settings: ModelSettings | None = None,
        allow_agents: bool = True,
        tuple: ModelTupleLike | None = None,
        keep: bool = True,
    ) -> ChildAgent[OutputT]:
        """Start a child of the current session, detached: its results arrive by notification.

        Kept (``keep=True``) by default, so it outlives the parent's run; see the module
        docstring for how long children live.

        Raises:
            UsageError: the tree is not running, or this task runs in no session of it.
            SpawnRefusedError: the session may not start agents, the child would be
                deeper than ``max_depth``, or no room is left among ``max_residents``.
        """
        options = RunOptions(deps, usage_limits, model_settings)
        return self._spawn(agent, prompt, options, allow_agents, tuple, keep, awaited=False)

    async def ask(
        self,
        agent: Agent[Any, OutputT],
        prompt: str,
        *,
        deps: Any = None,
        usage_limits: UsageLimits | None = None,
        model_settings: ModelSettings | None = None,
        allow_agents: bool = True,
        tuple: ModelTupleLike | None = None,
        keep: bool = False,
    ) -> OutputT:
        """Start a child of the current session and wait for its first answer.

        The current permit is lent while waiting. The child takes follow-ups until the
        parent's run ends (or for good with ``keep=True``).

        Raises:
            UsageError, SpawnRefusedError: as for :meth:`start`.
            Exception: whatever the child's turn raised (see :meth:`ChildAgent.result`).
        """
        options = RunOptions(deps, usage_limits, model_settings)
        child = self._spawn(agent, prompt, options, allow_agents, tuple, keep, awaited=True)
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
        keep: bool = False,
    ) -> Tool[Any]:
        """A pydantic-ai tool that asks a child ``agent`` and returns its answer as text.

        A refusal or a failed child comes back as text, so the parent's model can react;
        misuse of the tree (a :class:`~lovely_coordinator.UsageError`) is raised.
        """

        async def delegate(task: str) -> str:
            try:
                return str(await self.ask(agent, task, keep=keep))
            except UsageError:
                raise  # a programmer's error, not something for the model to handle
            except SpawnRefusedError as exc:
                return f"Refused: {exc}"
            except Exception as exc:
                return f"The sub-agent failed: {type(exc).__name__}: {exc}"

        return Tool(delegate, name=name, description=description, takes_ctx=False)

    def _spawn(
        self,
        agent: Agent[Any, OutputT],
        prompt: str,
        options: RunOptions,
        allow_agents: bool,
        explicit: ModelTupleLike | None,
        keep: bool,
        *,
        awaited: bool,
    ) -> ChildAgent[OutputT]:
        task_group = self._task_group
        if task_group is None:
            raise UsageError(_NOT_RUNNING)
        parent_id = _session.get()
        parent = self.coordinator.get_session_context(parent_id) if parent_id else None
        if parent_id is None or parent is None:
            raise UsageError("No session of this AgentTree: start the parent with tree.run")
        if not parent.allow_agents:
            raise SpawnRefusedError("Sub-agents are not allowed in this session")
        if parent.depth + 1 > self.max_depth:
            raise SpawnRefusedError(f"Sub-agent depth limit reached (max_depth={self.max_depth})")
        t = _agent_tuple(agent, explicit)
        if keep:
            self._make_room()
        child_id = f"{parent_id}/{next(self._ids)}"
        child = ChildAgent(
            self,
            agent,
            options,
            session_id=child_id,
            parent_id=parent_id,
            depth=parent.depth + 1,
            tuple=t,
            kept=keep,
        )
        child._awaited = awaited
        context = SessionContext(parent.depth + 1, allow_agents, dispose=child.dispose_event)
        coordinator = self.coordinator
        child._unbind = [
            coordinator.bind_session_context(child_id, context),
            coordinator.bind_resident(child_id, child),
            coordinator.bind_notification_route(child_id, _steer_into(child)),
            lambda: self._forget(child),
        ]
        self._children[child_id] = child
        self._children_of.setdefault(parent_id, []).append(child)
        self._touch(child)
        task_group.start_soon(_in_session, child, prompt, name=f"sub-agent {child_id}")
        return child

    def _make_room(self) -> None:
        kept = [c for c in self._children.values() if c.kept]
        if len(kept) < self.max_residents:
            return
        idle = [c for c in kept if c.idle]
        if not idle:
            raise SpawnRefusedError(
                f"Too many resident sub-agents are busy (max_residents={self.max_residents})"
            )
        oldest = min(idle, key=lambda c: self._last_used.get(c.session_id, 0))
        _log.info("disposing idle resident sub-agent %s to make room", oldest.session_id)
        oldest.dispose()

    def _touch(self, child: ChildAgent[Any]) -> None:
        self._last_used[child.session_id] = next(self._uses)

    def _run_ended(self, session_id: str) -> None:
        """A run of ``session_id`` ended: its children that were not kept go."""
        for child in list(self._children_of.get(session_id, ())):
            if not child.kept:
                child.dispose()

    def _forget(self, child: ChildAgent[Any]) -> None:
        self._children.pop(child.session_id, None)
        self._last_used.pop(child.session_id, None)
        siblings = self._children_of.get(child.parent_id)
        if siblings is not None:
            siblings.remove(child)
            if not siblings:
                del self._children_of[child.parent_id]

    async def _deliver(self, child: ChildAgent[Any], content: object) -> None:
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


async def _in_session(child: ChildAgent[Any], prompt: str) -> None:
    # The task's context is a copy of the spawner's: set the child's own session in it.
    _session.set(child.session_id)
    await child._live(prompt)


def _steer_into(child: ChildAgent[Any]) -> Route:
    def steer(notification: ParentNotification) -> None:
        child.input(f"[{notification.task_ref}] {notification.content}", "steer")

    return steer


def _agent_tuple(agent: Agent[Any, Any], explicit: ModelTupleLike | None) -> ModelTuple:
    if explicit is not None:
        return as_model_tuple(explicit)
    model = agent.model
    if isinstance(model, CoordinatedModel):
        return model.tuple
    if isinstance(model, Model):
        return tuple_of(model)
    raise InvalidArgumentError("The agent has no model instance: pass tuple=(provider, model)")

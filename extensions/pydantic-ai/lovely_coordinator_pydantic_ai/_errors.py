"""The errors of this package, all :class:`~lovely_coordinator.CoordinatorError` s::

    SubAgentError (CoordinatorError)
    ├── SpawnRefusedError (RuntimeError)   this session may not start that sub-agent now
    ├── ChildStoppedError                  the sub-agent stopped before it answered
    └── ChildDisposedError (RuntimeError)  the sub-agent was disposed; no more input

Misuse of the tree itself (running it without ``async with``) is the core's
``UsageError``, raised where it happens and never handed to a model as a tool result.
"""

from __future__ import annotations

from lovely_coordinator import CoordinatorError

__all__ = ["ChildDisposedError", "ChildStoppedError", "SpawnRefusedError", "SubAgentError"]


class SubAgentError(CoordinatorError):
    """Base class of the sub-agent errors of this package."""


class SpawnRefusedError(SubAgentError, RuntimeError):
    """The current session may not start a sub-agent: not allowed, too deep, or too many.

    A refusal is something a model can react to, so :meth:`AgentTree.tool` returns it to
    the model as text.
    """


class ChildStoppedError(SubAgentError):
    """The sub-agent's turn was stopped before it produced a result."""


class ChildDisposedError(SubAgentError, RuntimeError):
    """The sub-agent has been disposed and accepts no more input."""

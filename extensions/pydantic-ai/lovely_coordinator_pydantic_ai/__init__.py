"""pydantic-ai integration for lovely-coordinator.

- :class:`CoordinatedModel` wraps a pydantic-ai model so every request (streamed or not)
  runs under a coordinator permit for its ``(provider, model)`` tuple, and reports
  provider limits to a :class:`~lovely_coordinator_limits.ProviderLimitHandler`.
- :class:`AgentTree` runs agents as managed sessions that start sub-agents: depth limits,
  permit lending while a parent waits, results through notification routes, and children
  resident for follow-up input until their parent's run ends (or, kept, within a bound).
"""

from ._child import ChildAgent as ChildAgent
from ._errors import ChildDisposedError as ChildDisposedError
from ._errors import ChildStoppedError as ChildStoppedError
from ._errors import SpawnRefusedError as SpawnRefusedError
from ._errors import SubAgentError as SubAgentError
from ._model import CoordinatedModel as CoordinatedModel
from ._model import estimate_request as estimate_request
from ._model import tuple_of as tuple_of
from ._tree import AgentTree as AgentTree
from ._tree import current_session as current_session

__all__ = [
    "AgentTree",
    "ChildAgent",
    "ChildDisposedError",
    "ChildStoppedError",
    "CoordinatedModel",
    "SpawnRefusedError",
    "SubAgentError",
    "current_session",
    "estimate_request",
    "tuple_of",
]

"""OpenAI Agents SDK integration for lovely-coordinator.

- :func:`coordinated_client` derives an ``AsyncOpenAI`` whose every model call (chat
  completions and the Responses API) is one ``coordinator.request()``: within the caps and
  budgets, 429s parked and retried, budgets learned, usage settled.
- :class:`CoordinatedRunner` runs each agent run (``run``, ``run_streamed``) under a permit
  of the agent's tuple, and :meth:`CoordinatedRunner.as_tool` makes agents called as tools
  borrow the calling run's permit, so a tree of agents never deadlocks.
"""

from ._client import coordinated_client as coordinated_client
from ._runner import CoordinatedRunner as CoordinatedRunner
from ._runner import TupleOf as TupleOf

__all__ = ["CoordinatedRunner", "TupleOf", "coordinated_client"]

"""LangChain integration for lovely-coordinator.

- :func:`coordinate` gives a ``ChatOpenAI`` or ``ChatAnthropic`` model coordinated SDK
  clients in one call: each model call is one ``coordinator.request()`` within the caps
  and budgets, 429s parked and retried, budgets learned, usage settled.
- :class:`CoordinatedRunnable` runs each run of an agent, chain or LangGraph node under a
  permit, lending the enclosing run's permit to it, so sub-agents never deadlock.
- :class:`CoordinatedRateLimiter` is LangChain's ``BaseRateLimiter`` drawing requests
  from a tuple's budget: the weaker option (no release hook, so no cap and no tokens).
"""

from ._clients import CoordinatedChat as CoordinatedChat
from ._clients import coordinate as coordinate
from ._limiter import CoordinatedRateLimiter as CoordinatedRateLimiter
from ._runnable import CoordinatedRunnable as CoordinatedRunnable

__all__ = ["CoordinatedChat", "CoordinatedRateLimiter", "CoordinatedRunnable", "coordinate"]

"""CoordinatedRateLimiter: LangChain's rate-limiter interface, drawing from a tuple's budget.

The weaker of the two ways in. ``BaseRateLimiter`` has one hook, ``acquire`` /
``aacquire``, called before each model call and told nothing else: not the prompt, not
when the call ends. So the limiter can take one request from the tuple's budget and wait
for the tuple's gate, but it cannot hold a slot for the call (there is no release hook),
charge the call's tokens, settle its usage, learn the budget from the response's headers,
or park and retry a 429. Calls under it are bounded by the requests-per-minute budget
only, never by the caps. Prefer :func:`~lovely_coordinator_langchain.coordinate`, which
does all of that at the transport; use this where a model only takes a rate limiter.
"""

from __future__ import annotations

from typing import final

from langchain_core.rate_limiters import BaseRateLimiter

from lovely_coordinator import (
    AdmissionTimeoutError,
    AgentCoordinator,
    ModelTupleLike,
    as_model_tuple,
    get_agent_coordinator,
)

__all__ = ["CoordinatedRateLimiter"]


@final
class CoordinatedRateLimiter(BaseRateLimiter):
    """A LangChain rate limiter taking one request from ``tuple``'s budget per call.

    ``await aacquire()`` enters and leaves one ``coordinator.request(tuple)`` at once: it
    waits, in acceptance order with every other waiter, until the tuple's gate is open,
    its budget holds one request and a slot is free at that moment; it draws the request
    (no tokens) and holds nothing. With ``blocking=False`` it draws only when the gate is
    open and the budget holds a request now, and returns whether it did.

    The sync ``acquire()`` does the same in a thread without an event loop
    (``coordinator.request_sync``).

    Pass it as a model's ``rate_limiter=`` and set the budget (``set_budget``) yourself.

    Args:
        tuple: the ``(provider, model)`` whose budget the calls draw from.
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
    """

    def __init__(self, tuple: ModelTupleLike, coordinator: AgentCoordinator | None = None) -> None:
        self.tuple = as_model_tuple(tuple)
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()

    def acquire(self, *, blocking: bool = True) -> bool:
        if not blocking and not self._available():
            return False
        try:
            with self.coordinator.request_sync(self.tuple, timeout=None if blocking else 0):
                pass
        except AdmissionTimeoutError:  # not blocking, and a slot was not free at once
            return False
        return True

    async def aacquire(self, *, blocking: bool = True) -> bool:
        if not blocking and not self._available():
            return False
        async with self.coordinator.request(self.tuple):
            pass
        return True

    def _available(self) -> bool:
        statistics = self.coordinator.tuple_statistics(self.tuple)
        if statistics is None:
            return True  # nothing known of the tuple: open, no budget
        requests = statistics.requests_available
        return statistics.open and (requests is None or requests >= 1)

"""ProviderLimitHandler: turns provider limits into closed tuple gates, with a half-open probe."""

from __future__ import annotations

import math
from dataclasses import dataclass
from random import Random
from typing import final

import anyio

from lovely_coordinator import AgentCoordinator, InvalidArgumentError, ModelTuple

from ._backoff import Backoff
from ._breaker import PROBE_LIMIT, Breaker, Close
from ._classify import is_provider_limit
from ._delay import retry_delay
from ._tuples import ModelTupleLike, as_model_tuple

__all__ = ["LimitState", "ProviderLimitHandler"]

_RETRY_AFTER_MESSAGE = "retry_after must be a finite number of seconds >= 0 or None"


@final
@dataclass(frozen=True, slots=True)
class LimitState:
    """A snapshot of one tuple's limit episode.

    Attributes:
        tuple: the model tuple.
        failures: limits that closed the gate in this episode (1 after the first).
        closed_at: when the handler last closed the gate (anyio clock).
        reopens_at: when the gate reopens by itself, or ``None`` if it is open (half-open:
            the next request is the probe) or closed without a timer.
        saved_limit: the tuple cap that is restored when the episode ends.
    """

    tuple: ModelTuple
    failures: int
    closed_at: float | None
    reopens_at: float | None
    saved_limit: int | None


@final
class ProviderLimitHandler:
    """Closes a ``(provider, model)`` gate on a provider limit and reopens it carefully.

    On a limit the tuple is closed for the provider's requested wait (``retry-after`` and
    friends, see :func:`retry_delay`) or, without one, an exponential backoff with jitter;
    its cap is set to one request. When the coordinator reopens the gate by itself the
    tuple is *half-open*: one request goes through. Its success restores the previous cap
    and resets the backoff; another limit closes the gate again, for longer.

    Integrations call :meth:`observe` with failures (or :meth:`report_limit` when they
    classified the response themselves) and :meth:`report_success` after a successful
    request. All methods are synchronous and must be called from the coordinator's event
    loop thread.

    Args:
        coordinator: the coordinator whose gates this handler manages.
        backoff: delays without a server hint; its ``max_delay`` also caps server hints.
        rng: the jitter's random source (pass a seeded one for reproducible delays).
    """

    def __init__(
        self,
        coordinator: AgentCoordinator,
        *,
        backoff: Backoff | None = None,
        rng: Random | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._breaker = Breaker(backoff or Backoff(), rng or Random())

    @property
    def coordinator(self) -> AgentCoordinator:
        """The coordinator whose gates this handler closes."""
        return self._coordinator

    def observe(
        self, t: ModelTupleLike, error: BaseException, /, *, started_at: float | None = None
    ) -> bool:
        """Report a failed request on ``t``; close its gate if ``error`` is a provider limit.

        Args:
            t: the model tuple.
            error: what the request raised.
            started_at: when the request started (see :meth:`report_limit`).

        Returns:
            Whether ``error`` was a provider limit.

        Raises:
            InvalidArgumentError: ``t`` is not a valid model tuple.
        """
        t = as_model_tuple(t)
        if not is_provider_limit(error):
            return False
        self.report_limit(t, retry_after=retry_delay(error), started_at=started_at)
        return True

    def report_limit(
        self,
        t: ModelTupleLike,
        /,
        *,
        retry_after: float | None = None,
        started_at: float | None = None,
    ) -> float | None:
        """Report that a request on ``t`` hit a provider limit.

        Args:
            t: the model tuple.
            retry_after: the server's requested wait in seconds, if it gave one.
            started_at: when the request started (``anyio.current_time()``), if known. A
                request admitted before the handler last closed the gate was not the
                half-open probe: its limit can push the reopen later but does not count
                as a failed probe.

        Returns:
            The closure applied, in seconds, or ``None`` when the gate was already closed
            for this episode and nothing changed.

        Raises:
            InvalidArgumentError: ``t`` is not a valid model tuple, or ``retry_after`` is
                not a finite number ≥ 0.
        """
        t = as_model_tuple(t)
        if retry_after is not None and not _is_delay(retry_after):
            raise InvalidArgumentError(_RETRY_AFTER_MESSAGE)
        coordinator = self._coordinator
        decision = self._breaker.on_limit(
            t,
            hint=retry_after,
            gate_open=coordinator.is_tuple_open(t),
            current_limit=self._tuple_limit(t),
            started_at=started_at,
        )
        if decision is None:
            return None
        self._apply(t, decision)
        return decision.reopen_after

    def report_success(self, t: ModelTupleLike, /, *, started_at: float | None = None) -> None:
        """Report that a request on ``t`` succeeded.

        Args:
            t: the model tuple.
            started_at: when the request started (``anyio.current_time()``). A request
                admitted before the handler last closed the gate proves nothing and is
                ignored; pass ``None`` if unknown.

        Raises:
            InvalidArgumentError: ``t`` is not a valid model tuple.
        """
        t = as_model_tuple(t)
        restore = self._breaker.on_success(
            t, gate_open=self._coordinator.is_tuple_open(t), started_at=started_at
        )
        if restore is not None:
            self._coordinator.set_tuple_limit(t, restore.limit)

    def state(self, t: ModelTupleLike, /) -> LimitState | None:
        """The tuple's open limit episode, or ``None`` when it has none."""
        t = as_model_tuple(t)
        episode = self._breaker.episode(t)
        if episode is None:
            return None
        reopens_at = self._coordinator.tuple_reopens_at(t)
        return LimitState(t, episode.failures, episode.closed_at, reopens_at, episode.saved_limit)

    def _apply(self, t: ModelTuple, decision: Close) -> None:
        coordinator = self._coordinator
        coordinator.close_tuple(t, reopen_after=decision.reopen_after)
        coordinator.set_tuple_limit(t, PROBE_LIMIT)
        self._breaker.closed(t, anyio.current_time())

    def _tuple_limit(self, t: ModelTuple) -> int | None:
        # The public API has no per-tuple getter for the cap; the statistics snapshot lists
        # every capped tuple, so a missing entry means "no cap".
        for entry in self._coordinator.statistics().tuples:
            if entry.tuple == t:
                limit: int | None = entry.limit
                return limit
        return None


def _is_delay(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )

"""ProviderLimitHandler: turns provider limits into closed tuple gates, with a half-open probe."""

from __future__ import annotations

import functools
import logging
import math
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from random import Random
from typing import Any, ClassVar, TypeVar, cast, final

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
)
from lovely_coordinator._agents.admission import attached

from ._backoff import Backoff
from ._breaker import Breaker, Close
from ._classify import is_provider_limit
from ._delay import retry_delay
from ._draw import Draw, ModelRequestLike
from ._learn import BudgetLearner
from ._ratelimit import rate_limits_from_headers
from ._tuples import ModelTupleLike, as_model_tuple

__all__ = ["LimitState", "ProviderLimitHandler"]

_log = logging.getLogger("lovely_coordinator.limits")

F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """Run the handler method under the handler's lock."""

    @functools.wraps(method)
    def run(self: ProviderLimitHandler, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(F, run)


_RETRY_AFTER_MESSAGE = "retry_after must be a finite number of seconds >= 0 or None"


@final
@dataclass(frozen=True, slots=True)
class LimitState:
    """A snapshot of one tuple's limit episode.

    Attributes:
        tuple: the model tuple.
        failures: limits that closed the gate in this episode (1 after the first).
        closed_at: when the handler last closed the gate (the coordinator's clock).
        reopens_at: when the gate reopens by itself, or ``None`` if it is open (half-open:
            the next request is the probe) or closed without a timer.
        saved_limit: the tuple cap that is restored when the episode ends.
        cap: while recovering (the probe succeeded), the cap in force, growing by one per
            round of successes; ``None`` while closed or probing.
    """

    tuple: ModelTuple
    failures: int
    closed_at: float | None
    reopens_at: float | None
    saved_limit: int | None
    cap: int | None = None


@final
class ProviderLimitHandler:
    """Closes a ``(provider, model)`` gate on a provider limit and reopens it carefully.

    On a limit the tuple is closed for the provider's requested wait (``retry-after`` and
    friends, see :func:`retry_delay`) or, without one, an exponential backoff with jitter;
    its cap is set to one request. When the coordinator reopens the gate by itself the
    tuple is *half-open*: one request goes through. Its success starts the recovery: the
    cap grows back by one after each round of successes (as many as the cap) until it is
    the cap from before the episode (additive increase: restoring it all at once lets
    every queued request through together and invites the next storm). Another limit
    while probing closes the gate again, for longer; while recovering, it halves the cap.

    Integrations call :meth:`observe` with failures (or :meth:`report_limit` when they
    classified the response themselves) and :meth:`report_success` after a successful
    request. All methods are synchronous and thread-safe (one lock): the process-global
    coordinator serves event loops and blocking callers in many threads. Times
    (``started_at``, ``closed_at``) are on the coordinator's clock, the anyio clock of its
    home loop, which every thread can read.

    It also learns budgets: integrations :meth:`track` each request the coordinator
    admits and hand each response's headers to :meth:`learn`, which sets the tuple's
    budget from the provider's announced limits (this process's share of them, see
    ``_share``) unless the user set one, and lowers what is available to what the
    provider says remains (``coordinator.learn_budget``).

    Use one handler per coordinator: :meth:`for_coordinator` returns the shared one, which
    every first-party extension uses unless given another. Two handlers closing and
    capping the same tuples would each restore a cap the other had lowered, or never.

    Closures and recoveries are logged to ``lovely_coordinator.limits`` (INFO; the
    recovery steps at DEBUG): the tuple, the reason, how long and until when. Nothing of
    a request or a credential is ever logged.

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
        self._coordinator_ref: Callable[[], AgentCoordinator | None] = lambda: coordinator
        self._breaker = Breaker(backoff or Backoff(), rng or Random())
        self._learners: dict[ModelTuple, BudgetLearner] = {}
        # Invariant: one entry per tracked request that its owner has not finished, keyed
        # by identity (the draw holds the request, so its id cannot be reused meanwhile).
        self._draws: dict[int, Draw] = {}
        # Held around every method: they read the coordinator and then act on it. Taken
        # before the coordinator's own lock, never after (the coordinator never calls in).
        self._lock = threading.RLock()

    _shared: ClassVar[weakref.WeakKeyDictionary[AgentCoordinator, ProviderLimitHandler]] = (
        weakref.WeakKeyDictionary()
    )
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def for_coordinator(cls, coordinator: AgentCoordinator) -> ProviderLimitHandler:
        """The coordinator's shared handler, created with the default backoff at first use.

        Every extension uses this one unless passed ``handler=``; pass the same handler to
        all of them if you construct your own. It lives as long as the coordinator.

        Raises:
            InvalidArgumentTypeError: ``coordinator`` is not an ``AgentCoordinator``.
        """
        if not isinstance(coordinator, AgentCoordinator):
            raise InvalidArgumentTypeError("coordinator must be an AgentCoordinator")
        with cls._shared_lock:  # the process-global coordinator may be used from threads
            handler = cls._shared.get(coordinator)
            if handler is None:
                handler = cls._shared[coordinator] = cls(coordinator)
                # Held weakly, or the mapping's value would keep its own key alive forever.
                handler._coordinator_ref = weakref.ref(coordinator)
            return handler

    @property
    def coordinator(self) -> AgentCoordinator:
        """The coordinator whose gates this handler closes."""
        coordinator = self._coordinator_ref()
        # Only a shared handler holds its coordinator weakly, and it is only reachable
        # through for_coordinator(coordinator) or an object that holds the coordinator too.
        assert coordinator is not None, "the coordinator of a shared handler was collected"
        return coordinator

    @_locked
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
        reason = type(error).__name__
        self.report_limit(t, retry_after=retry_delay(error), started_at=started_at, reason=reason)
        return True

    @_locked
    def report_limit(
        self,
        t: ModelTupleLike,
        /,
        *,
        retry_after: float | None = None,
        started_at: float | None = None,
        reason: str = "provider limit",
    ) -> float | None:
        """Report that a request on ``t`` hit a provider limit.

        Args:
            t: the model tuple.
            retry_after: the server's requested wait in seconds, if it gave one.
            started_at: when the request started (the coordinator's clock), if known. A
                request admitted before the handler last closed the gate was not the
                half-open probe: its limit can push the reopen later but does not count
                as a failed probe.
            reason: what the limit was, for the log (``"HTTP 429"``, an error's class name).

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
        coordinator = self.coordinator
        decision = self._breaker.on_limit(
            t,
            hint=retry_after,
            gate_open=coordinator.is_tuple_open(t),
            current_limit=self._tuple_limit(t),
            started_at=started_at,
        )
        if decision is None:
            return None
        self._apply(t, decision, reason)
        return decision.reopen_after

    @_locked
    def report_success(self, t: ModelTupleLike, /, *, started_at: float | None = None) -> None:
        """Report that a request on ``t`` succeeded.

        Args:
            t: the model tuple.
            started_at: when the request started (the coordinator's clock). A request
                admitted before the handler last closed the gate proves nothing and is
                ignored; pass ``None`` if unknown.

        Raises:
            InvalidArgumentError: ``t`` is not a valid model tuple.
        """
        t = as_model_tuple(t)
        coordinator = self.coordinator
        restore = self._breaker.on_success(
            t,
            gate_open=coordinator.is_tuple_open(t),
            started_at=started_at,
            ceiling=coordinator.max_concurrency,
        )
        if restore is None:
            return
        coordinator.set_tuple_limit(t, restore.limit)
        if restore.done:
            _log.info("%s recovered: cap restored to %s", _name(t), restore.limit)
        else:
            _log.debug("%s recovering: cap raised to %d", _name(t), restore.limit)

    @_locked
    def track(self, request: ModelRequestLike, /) -> tuple[Draw, bool]:
        """Track a request the coordinator admitted, or find the draw a layer above made.

        Args:
            request: what ``coordinator.request()`` returned.

        Returns:
            The request's :class:`Draw`, and whether this call made it. The caller that
            made it *owns* the call: it alone retries it after a limit, and it calls
            :meth:`finish` when the call is over. A layer that finds the draw of another
            (its ``request()`` joined an enclosing one) settles and learns through it but
            leaves retries to the owner.
        """
        found = self._draws.get(id(request))
        if found is not None and found.request is request:
            return found, False
        learner = self._learners.get(request.tuple)
        if learner is None:
            learner = self._learners[request.tuple] = BudgetLearner()
        draw = Draw(request, learner, now(self.coordinator), self._lock)
        self._draws[id(request)] = draw
        return draw, True

    @_locked
    def finish(self, draw: Draw, /) -> None:
        """Stop tracking ``draw``'s request (its owner's call is over). Idempotent."""
        key = id(draw.request)
        if self._draws.get(key) is draw:
            del self._draws[key]

    @_locked
    def learn(self, draw: Draw, headers: Mapping[str, str], /) -> None:
        """Learn the tuple's budget from the rate-limit headers of a response to ``draw``.

        Does nothing when the headers report no limits.
        """
        limits = rate_limits_from_headers(headers)
        if limits.empty:
            return
        t = draw.tuple
        coordinator = self.coordinator
        hook = attached(coordinator)
        if hook is not None:
            # A fleet (RedisFleet) shares the provider's budget between the processes: it
            # learns the provider's own figures, not this process's share of them, with
            # the request they answer (what it admitted since, the provider had not seen).
            hook.learn(
                t,
                limits.requests and limits.requests.per_minute,
                limits.tokens and limits.tokens.per_minute,
                limits.requests and limits.requests.remaining,
                limits.tokens and limits.tokens.remaining,
                answering=draw.request,
            )
            return
        entry = coordinator.tuple_statistics(t)
        available = (
            (None, None) if entry is None else (entry.requests_available, entry.tokens_available)
        )
        # Calls waiting on this tuple: its demand is more than its budget lets through.
        hungry = entry is not None and entry.queued > 0
        learner = self._learners[t]
        learned = learner.learn(
            limits, draw.marks, at=now(self.coordinator), available=available, hungry=hungry
        )
        if learned.empty:
            return
        coordinator.learn_budget(
            t,
            requests_per_minute=learned.requests_per_minute,
            tokens_per_minute=learned.tokens_per_minute,
            requests_remaining=learned.requests_remaining,
            tokens_remaining=learned.tokens_remaining,
        )
        if not learner.announced:
            learner.announced = True
            _log.info(
                "%s budget learned from the provider's headers: %s requests, %s tokens a minute",
                _name(t),
                _format_limit(limits.requests.per_minute if limits.requests else None),
                _format_limit(limits.tokens.per_minute if limits.tokens else None),
            )

    @_locked
    def state(self, t: ModelTupleLike, /) -> LimitState | None:
        """The tuple's open limit episode, or ``None`` when it has none."""
        t = as_model_tuple(t)
        episode = self._breaker.episode(t)
        if episode is None:
            return None
        reopens_at = self.coordinator.tuple_reopens_at(t)
        return LimitState(
            t, episode.failures, episode.closed_at, reopens_at, episode.saved_limit, episode.cap
        )

    def _apply(self, t: ModelTuple, decision: Close, reason: str) -> None:
        coordinator = self.coordinator
        coordinator.close_tuple(t, reopen_after=decision.reopen_after)
        if decision.limit is not None:
            coordinator.set_tuple_limit(t, decision.limit)
        self._breaker.closed(t, now(self.coordinator))
        _log.info(
            "%s closed for %.3g s (reopens at %s on the anyio clock), cap %s: %s",
            _name(t),
            decision.reopen_after,
            _format_time(coordinator.tuple_reopens_at(t)),
            self._tuple_limit(t),
            reason,
        )

    def _tuple_limit(self, t: ModelTuple) -> int | None:
        entry = self.coordinator.tuple_statistics(t)  # None: not listed, so no cap
        return None if entry is None else entry.limit


def now(coordinator: AgentCoordinator) -> float:
    """The coordinator's clock (its home loop's anyio clock), read from any thread."""
    return coordinator._clock.now()


def _format_limit(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _name(t: ModelTuple) -> str:
    return f"{t.provider}/{t.model}"


def _format_time(at: float | None) -> str:
    return "never (until opened)" if at is None else f"{at:.3f}"


def _is_delay(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )

"""From a response's rate-limit headers to the budget a coordinator should hold, per tuple.

:class:`BudgetLearner` keeps, for one tuple, a :class:`~._share.ShareEstimator` per budget
dimension (requests, tokens) and turns each response's :class:`~._ratelimit.RateLimits`
into a :class:`Learned` decision: the per-minute rate to refill at and the most it may
still spend now (its share of what the provider says remains, less what it drew since).
The handler passes that to ``coordinator.learn_budget``, which leaves the rate alone where
the user set a budget explicitly and only ever lowers what is available.

The rate is this process's share of the announced limit, nudged by how full the
provider's bucket is (its capacity is ``remaining + reset * refill``): up when it holds
more than a small *reserve* (:data:`RESERVE`, a tenth of it), down when it holds less.
Lowering to what remains only ever lowers, so without the nudge every cautious mistake
(a share estimated too small, a request counted twice) would leave provider quota unused
for good; with it, the processes together drain the bucket down to the reserve, which
then absorbs the jitter of concurrent requests instead of a 429. The nudge is bounded
(:data:`NUDGE`) and vanishes when the bucket sits at the reserve.

Pure: the caller passes the clock and the marks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from ._ratelimit import Limit, RateLimits
from ._share import ShareEstimator

__all__ = ["GAIN", "NUDGE", "RESERVE", "BudgetLearner", "Learned", "Marks"]

RESERVE = 0.1
"""The part of the provider's bucket the learned rate steers towards keeping."""
GAIN = 2.0
"""How strongly the rate follows the bucket's distance from the reserve."""
NUDGE = (0.5, 1.5)
"""The least and most the rate is multiplied by."""


@final
@dataclass(frozen=True, slots=True)
class Marks:
    """What the process had drawn in all, per dimension, when it sent one request."""

    requests: float
    tokens: float


@final
@dataclass(frozen=True, slots=True)
class Learned:
    """Arguments for ``coordinator.learn_budget``; ``None``: leave that part alone."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    requests_remaining: float | None = None
    tokens_remaining: float | None = None

    @property
    def empty(self) -> bool:
        """Whether there is nothing to learn."""
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.requests_remaining is None
            and self.tokens_remaining is None
        )


@final
class BudgetLearner:
    """One tuple's learned budget: a share estimate per dimension (see ``_share``)."""

    def __init__(self, *, window: float = 1.0, smoothing: float = 0.5) -> None:
        self.requests = ShareEstimator(window=window, smoothing=smoothing)
        self.tokens = ShareEstimator(window=window, smoothing=smoothing)

    def draw(self, tokens: int) -> Marks:
        """Record one admitted request charging ``tokens``; returns its marks."""
        return Marks(self.requests.draw(1), self.tokens.draw(tokens))

    def learn(self, limits: RateLimits, marks: Marks, *, at: float) -> Learned:
        """What one response (to the request with ``marks``) teaches about the budget."""
        rpm, requests_left = _dimension(self.requests, limits.requests, marks.requests, at)
        tpm, tokens_left = _dimension(self.tokens, limits.tokens, marks.tokens, at)
        return Learned(rpm, tpm, requests_left, tokens_left)


def _dimension(
    estimator: ShareEstimator, limit: Limit | None, mark: float, at: float
) -> tuple[float | None, float | None]:
    if limit is None:
        return None, None
    per_minute = limit.per_minute
    remaining: float | None = None
    if limit.remaining is not None:
        if per_minute is not None:
            remaining = estimator.observe(
                at=at,
                remaining=limit.remaining,
                per_minute=per_minute,
                reset=limit.reset,
                mark=mark,
            )
        else:
            # No rate to reason with: what remains, less what was drawn since, is all.
            remaining = max(0.0, limit.remaining - max(0.0, estimator.drawn - mark))
    if per_minute is None:
        return None, remaining
    rate = per_minute * estimator.share
    if limit.remaining is not None and limit.reset is not None:
        capacity = limit.remaining + limit.reset * per_minute / 60.0
        if capacity > 0:
            fill = limit.remaining / capacity
            rate *= min(NUDGE[1], max(NUDGE[0], 1.0 + GAIN * (fill - RESERVE)))
    return rate, remaining

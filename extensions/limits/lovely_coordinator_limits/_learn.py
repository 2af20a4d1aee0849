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
(:data:`NUDGE`) and vanishes when the bucket sits at the reserve. How the rate and the
allowance reach the coordinator's bucket: see :class:`Dimension`.

Pure: the caller passes the clock and the marks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from ._ratelimit import Limit, RateLimits
from ._share import ShareEstimator

__all__ = ["GAIN", "NUDGE", "RESERVE", "BudgetLearner", "Dimension", "Learned", "Marks"]

RESERVE = 0.1
"""The part of the provider's bucket the learned rate steers towards keeping."""
GAIN = 4.0
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
class Dimension:
    """One budget dimension (requests or tokens) of one tuple, as this process sees it.

    Besides the share estimate it keeps this process's *allowance*: what it may still
    spend if it refills at its share of the provider's rate (nudged towards the reserve),
    drawn down by every draw at once, and never above its share of what the provider says
    remains (less what it drew since). Each observation lowers the coordinator's bucket to
    the allowance and moves the bucket's rate towards the share.

    Moving the rate is careful, because a coordinator budget keeps what was *spent* when
    its per-minute amount changes: what is available moves by the change. A higher rate
    therefore comes with the available amount restated (lowered back to what it was, or
    to the allowance); a lower one only as far as the lowering to the allowance absorbs
    (a cut deeper than that would leave a debt that takes the new, lower rate a long
    while to repay). The allowance keeps the process at its share meanwhile.
    """

    def __init__(self, *, window: float, smoothing: float) -> None:
        self._estimator = ShareEstimator(window=window, smoothing=smoothing)
        # Invariants: level and stamp are None until the first observation; rate is the
        # per-minute amount last learned (None before).
        self._level: float | None = None
        self._stamp: float | None = None
        self._rate: float | None = None

    @property
    def share(self) -> float:
        """This process's estimated share of the provider's budget."""
        return self._estimator.share

    @property
    def drawn(self) -> float:
        """Everything this process has drawn so far."""
        return self._estimator.drawn

    @property
    def allowance(self) -> float | None:
        """What this process may still spend, as of the last observation and draws since."""
        return self._level

    def draw(self, amount: float) -> float:
        """Record a draw; returns its mark."""
        if self._level is not None:
            self._level -= amount
        return self._estimator.draw(amount)

    def adjust(self, delta: float) -> None:
        """Correct what was drawn (usage settled, or refused by the provider)."""
        if self._level is not None:
            self._level -= delta
        self._estimator.adjust(delta)

    def observe(
        self, limit: Limit, mark: float, at: float, available: float | None, hungry: bool = False
    ) -> tuple[float | None, float | None]:
        """The per-minute rate and remaining amount to learn from one response's ``limit``.

        ``available`` is what the coordinator's bucket holds now (``None``: no budget);
        ``hungry``: calls are waiting for it (see ``_share``).
        """
        per_minute = limit.per_minute
        if limit.remaining is None:
            # A limit alone: a budget at it, once (the share needs remaining amounts).
            if self._rate is not None or per_minute is None:
                return None, None
            self._rate = per_minute
            return per_minute, None
        if per_minute is None:
            # No rate to reason with: what remains, less what was drawn since, is all.
            return None, max(0.0, limit.remaining - max(0.0, self.drawn - mark))
        left = self._estimator.observe(
            at=at,
            remaining=limit.remaining,
            per_minute=per_minute,
            reset=limit.reset,
            mark=mark,
            hungry=hungry,
        )
        desired = per_minute * self._estimator.share * _nudge(limit, per_minute)
        if self._level is None or self._stamp is None:
            allowance = left
        else:
            grown = self._level + desired / 60.0 * max(0.0, at - self._stamp)
            allowance = min(grown, left)
        self._level, self._stamp = allowance, at
        old = self._rate
        if old is None or available is None:
            rate, remaining = desired, allowance
        elif desired >= old:
            rate, remaining = desired, min(allowance, available)
        else:
            rate, remaining = max(desired, old - max(0.0, available - allowance)), allowance
        self._rate = rate
        return rate, max(0.0, remaining)


def _nudge(limit: Limit, per_minute: float) -> float:
    if limit.remaining is None or limit.reset is None:
        return 1.0
    capacity = limit.remaining + limit.reset * per_minute / 60.0
    if capacity <= 0:
        return 1.0
    fill = limit.remaining / capacity
    return min(NUDGE[1], max(NUDGE[0], 1.0 + GAIN * (fill - RESERVE)))


@final
class BudgetLearner:
    """One tuple's learned budget: a :class:`Dimension` each for requests and tokens."""

    def __init__(self, *, window: float = 0.5, smoothing: float = 0.5) -> None:
        self.requests = Dimension(window=window, smoothing=smoothing)
        self.tokens = Dimension(window=window, smoothing=smoothing)
        self.announced = False  # whether the handler has logged the first learned budget

    def draw(self, tokens: int) -> Marks:
        """Record one admitted request charging ``tokens``; returns its marks."""
        return Marks(self.requests.draw(1), self.tokens.draw(tokens))

    def learn(
        self,
        limits: RateLimits,
        marks: Marks,
        *,
        at: float,
        available: tuple[float | None, float | None] = (None, None),
        hungry: bool = False,
    ) -> Learned:
        """What one response (to the request with ``marks``) teaches about the budget.

        ``available`` is what the coordinator's buckets hold now (requests, tokens);
        ``hungry``: calls of this tuple are waiting for the budget now.
        """
        rpm, requests_left = (
            self.requests.observe(limits.requests, marks.requests, at, available[0], hungry)
            if limits.requests is not None
            else (None, None)
        )
        tpm, tokens_left = (
            self.tokens.observe(limits.tokens, marks.tokens, at, available[1], hungry)
            if limits.tokens is not None
            else (None, None)
        )
        return Learned(rpm, tpm, requests_left, tokens_left)

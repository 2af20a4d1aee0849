"""One tuple's budget: what its model requests may draw, and when they may draw it.

A :class:`Budget` is the arithmetic of CONTRACT §5's budgets, apart from any queue: two
token buckets (``bucket.Bucket``), of requests and of tokens per minute, either of which
may be absent, and which of them were set explicitly (``set_budget``) rather than
learned from a provider (``learn_budget``, which never overrides an explicit one). It
knows nothing of tickets, lines or order: the scheduler asks it whether a request of so
many tokens fits now (:meth:`Budget.ready_at`), draws, refunds and settles, and keeps
the ordering (which request is held back, until when) itself. So it can be tested alone,
as aiolimiter tests its bucket. The clock is the caller's: every method takes ``now``.

A tuple without a budget has none (``TupleState.budget is None``): a budget exists
exactly while one of its buckets does.
"""

from __future__ import annotations

from typing import Final, final

from .bucket import Bucket

__all__ = ["EXPLICIT_REQUESTS", "EXPLICIT_TOKENS", "Budget"]

# Bits of ``Budget.explicit``: the dimensions set_budget set (learn_budget leaves them).
EXPLICIT_REQUESTS: Final = 1
EXPLICIT_TOKENS: Final = 2


@final
class Budget:
    """The request and token buckets of one tuple (see the module docstring).

    Invariants: ``requests`` or ``tokens`` is not None (an empty budget is no budget);
    a bit of ``explicit`` is set only while its bucket exists.
    """

    __slots__ = ("explicit", "requests", "tokens")

    def __init__(self, requests: Bucket | None, tokens: Bucket | None, explicit: int) -> None:
        self.requests = requests
        self.tokens = tokens
        self.explicit = explicit

    def __repr__(self) -> str:
        return f"<Budget requests={self.requests} tokens={self.tokens}>"

    # -- changing it ------------------------------------------------------------------------

    @staticmethod
    def set(
        budget: Budget | None, requests: float | None, tokens: float | None, now: float
    ) -> Budget | None:
        """``budget`` with both dimensions set explicitly (None removes one; both None,
        the budget). A new dimension starts full; a changed one keeps what was spent."""
        if requests is None and tokens is None:
            return None
        old_requests = None if budget is None else budget.requests
        old_tokens = None if budget is None else budget.tokens
        explicit = (EXPLICIT_REQUESTS if requests is not None else 0) | (
            EXPLICIT_TOKENS if tokens is not None else 0
        )
        return Budget(
            _resized(old_requests, requests, now), _resized(old_tokens, tokens, now), explicit
        )

    @staticmethod
    def learn(
        budget: Budget | None,
        requests: float | None,
        tokens: float | None,
        requests_remaining: float | None,
        tokens_remaining: float | None,
        now: float,
    ) -> Budget | None:
        """``budget`` after what a provider reported: per-minute limits where none was set
        explicitly (a new rate keeps what is available, at most its capacity), and what
        remains (which only ever lowers what is available, in a dimension it has)."""
        if budget is None:
            if requests is None and tokens is None:
                return None
            budget = Budget(None, None, 0)
        if requests is not None and not budget.explicit & EXPLICIT_REQUESTS:
            budget.requests = _rerated(budget.requests, requests, now)
        if tokens is not None and not budget.explicit & EXPLICIT_TOKENS:
            budget.tokens = _rerated(budget.tokens, tokens, now)
        if requests_remaining is not None and budget.requests is not None:
            budget.requests.lower_to(requests_remaining, now)
        if tokens_remaining is not None and budget.tokens is not None:
            budget.tokens.lower_to(tokens_remaining, now)
        return budget

    # -- drawing ----------------------------------------------------------------------------

    def holds(self, tokens: int, now: float) -> bool:
        """Whether a request of ``tokens`` tokens may draw at ``now``."""
        requests, bucket = self.requests, self.tokens
        if requests is not None and not requests.holds(1, now):
            return False
        return bucket is None or bucket.holds(tokens, now)

    def ready_at(self, tokens: int, now: float) -> float:
        """When a request of ``tokens`` tokens may draw (``now`` if it may already)."""
        ready = now
        requests, bucket = self.requests, self.tokens
        if requests is not None and not requests.holds(1, now):
            ready = requests.ready_at(1, now)
        if bucket is not None and not bucket.holds(tokens, now):
            ready = max(ready, bucket.ready_at(tokens, now))
        return ready

    def draw(self, tokens: int, now: float) -> None:
        """A request of ``tokens`` tokens draws (the caller checked it may)."""
        if self.requests is not None:
            self.requests.draw(1, now)
        if self.tokens is not None:
            self.tokens.draw(tokens, now)

    def refund(self, tokens: int, now: float) -> None:
        """Give back what a request of ``tokens`` tokens drew (it was never made)."""
        if self.requests is not None:
            self.requests.adjust(-1, now)
        if self.tokens is not None and tokens:
            self.tokens.adjust(-tokens, now)

    def settle(self, change: int, now: float) -> bool:
        """Charge (``change > 0``) or refund a request's token usage beyond its charge;
        whether anything changed (there is a token bucket and a change)."""
        if not change or self.tokens is None:
            return False
        self.tokens.adjust(change, now)
        return True

    def shift(self, delta: float) -> None:
        """Restate the buckets on a clock ``delta`` seconds ahead (the same instants)."""
        for bucket in (self.requests, self.tokens):
            if bucket is not None:
                bucket.shift(delta)


def _resized(bucket: Bucket | None, per_minute: float | None, now: float) -> Bucket | None:
    if per_minute is None:
        return None
    if bucket is None:
        return Bucket(per_minute, now)
    bucket.resize(per_minute, now)
    return bucket


def _rerated(bucket: Bucket | None, per_minute: float, now: float) -> Bucket:
    if bucket is None:
        return Bucket(per_minute, now)
    bucket.rerate(per_minute, now)
    return bucket

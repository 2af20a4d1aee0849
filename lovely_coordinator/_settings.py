"""The scheduler's settings: the global cap, tuple caps, gates and budgets.

Each call here changes one setting and then grants whatever that lets run, in order, before
it returns (so a raised cap or an opened gate is work-conserving at once). Arguments are
already valid: the coordinator validates them. See ``_scheduler.py`` for the rules as a
whole and ``_engine.py`` for the grant loop.
"""

from __future__ import annotations

import heapq
from typing import Final

from ._bucket import Bucket
from ._engine import GATE, Engine
from ._errors import TupleSuspendedError
from ._lines import Ticket, TupleState
from ._types import ModelTuple

__all__ = ["EXPLICIT_REQUESTS", "EXPLICIT_TOKENS", "SUSPENDED_MESSAGE", "Settings"]

SUSPENDED_MESSAGE: Final = (
    "Provider/model is suspended by a provider limit; foreground work cannot wait for recovery"
)

# Bits of ``TupleState.explicit``: the dimensions set_budget set (learn_budget leaves them).
EXPLICIT_REQUESTS: Final = 1
EXPLICIT_TOKENS: Final = 2


class Settings(Engine):
    """Limits, gates and budgets on top of the grant loop."""

    __slots__ = ()

    # -- caps ---------------------------------------------------------------------------------

    def set_limit(self, limit: int) -> None:
        """Change the global cap. Growing grants at once, in order; shrinking revokes nothing."""
        self.limit = limit
        self._drain()
        self._changed()

    def set_tuple_limit(self, model_tuple: ModelTuple, limit: int | None) -> None:
        """Cap (or, with None, uncap) a tuple. A raised cap grants at once."""
        state = self._state(model_tuple)
        state.limit = limit
        self._wake_tuple(state)
        self._forget_if_idle(state)
        self._changed()

    # -- gates --------------------------------------------------------------------------------

    def is_open(self, model_tuple: ModelTuple, now: float | None) -> bool:
        """Whether the gate is open at ``now`` (a pure read: a timed closure whose instant
        has passed counts as open even before its wake-up ran)."""
        state = self._tuples.get(model_tuple)
        if state is None or state.open:
            return True
        return state.reopens_at is not None and now is not None and state.reopens_at <= now

    def close(self, model_tuple: ModelTuple, reopens_at: float | None) -> None:
        """Close the tuple's gate and fail its ``reject`` waiters. Grants nothing.

        A closure is never shortened: closing a closed tuple keeps the later of the two
        reopen times, and a closure without a reopen time (None) lasts until :meth:`open`.
        """
        state = self._state(model_tuple)
        if state.open:
            state.open = False
            state.reopens_at = reopens_at
        elif reopens_at is None:
            state.reopens_at = None
        elif state.reopens_at is not None and reopens_at > state.reopens_at:
            state.reopens_at = reopens_at
        if state.reopens_at is not None and state.reopens_at == reopens_at:
            self._wakeup_seq += 1
            heapq.heappush(self._wakeups, (reopens_at, self._wakeup_seq, GATE, state))
        foreground = state.foreground
        if foreground:
            state.foreground = None
            for ticket in sorted(foreground, key=_key):
                parker = self._discard(ticket)
                error = TupleSuspendedError(SUSPENDED_MESSAGE)
                if parker is not None:
                    parker.fail(error)
                else:
                    ticket.error = error
        self._changed()

    def open(self, model_tuple: ModelTuple) -> None:
        """Open the tuple's gate (fine when open); its waiters may be granted at once."""
        state = self._tuples.get(model_tuple)
        if state is None or state.open:
            return
        state.open = True
        state.reopens_at = None  # its wake-up is dead now
        self._wake_tuple(state)
        self._forget_if_idle(state)
        self._changed()

    # -- budgets --------------------------------------------------------------------------------

    def set_budget(
        self, model_tuple: ModelTuple, requests: float | None, tokens: float | None
    ) -> None:
        """Set both budget dimensions of a tuple (None removes one).

        A new dimension starts full; a changed one keeps what was spent. Requests waiting
        on the budget are re-examined at once (their wake-up may move either way).
        """
        state = self._state(model_tuple)
        now = self._clock()
        state.request_bucket = _resized(state.request_bucket, requests, now)
        state.token_bucket = _resized(state.token_bucket, tokens, now)
        state.explicit = (EXPLICIT_REQUESTS if requests is not None else 0) | (
            EXPLICIT_TOKENS if tokens is not None else 0
        )
        self._budget_moved(state)

    def learn_budget(
        self,
        model_tuple: ModelTuple,
        requests: float | None,
        tokens: float | None,
        requests_remaining: float | None,
        tokens_remaining: float | None,
    ) -> None:
        """What a provider reported: per-minute limits where none was set explicitly, and
        what remains (which only ever lowers what is available)."""
        state = self._state(model_tuple)
        now = self._clock()
        if requests is not None and not state.explicit & EXPLICIT_REQUESTS:
            state.request_bucket = _resized(state.request_bucket, requests, now)
        if tokens is not None and not state.explicit & EXPLICIT_TOKENS:
            state.token_bucket = _resized(state.token_bucket, tokens, now)
        if requests_remaining is not None and state.request_bucket is not None:
            state.request_bucket.lower_to(requests_remaining, now)
        if tokens_remaining is not None and state.token_bucket is not None:
            state.token_bucket.lower_to(tokens_remaining, now)
        self._budget_moved(state)

    def settle(self, ticket: Ticket, tokens: int) -> None:
        """A request's real token usage replaces its charge: refund or charge the difference."""
        change = tokens - ticket.tokens
        ticket.tokens = tokens
        state = ticket.tuple_state
        bucket = state.token_bucket
        if change and bucket is not None:
            bucket.adjust(change, self._clock())
            self._budget_moved(state)

    def _budget_moved(self, state: TupleState) -> None:
        # The front's instant may have moved either way: forget the block and let the
        # requests try again in order (the front re-blocks with its new instant).
        if state.block is not None:
            self._unblock(state)
        else:
            self._wake_tuple(state)
        self._forget_if_idle(state)
        self._changed()


def _resized(bucket: Bucket | None, per_minute: float | None, now: float) -> Bucket | None:
    if per_minute is None:
        return None
    if bucket is None:
        return Bucket(per_minute, now)
    bucket.resize(per_minute, now)
    return bucket


def _key(ticket: Ticket) -> tuple[int, int]:
    return (ticket.order, ticket.seq)

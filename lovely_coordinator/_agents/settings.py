"""The scheduler's settings and time: the global cap, tuple caps, gates, budgets, wake-ups.

Each call here changes one setting and then grants whatever that lets run, in order, before
it returns (so a raised cap or an opened gate is work-conserving at once). Arguments are
already valid: the coordinator validates them. See ``scheduler.py`` for the rules as a
whole, ``engine.py`` for the grant loop, ``lending.py`` for lends, covers and leaving,
``budgets.py`` for a budget's arithmetic and ``wakeups.py`` for the wake-up heap.
"""

from __future__ import annotations

import logging
from typing import Final

from .._base.errors import TupleSuspendedError
from .._base.types import ModelTuple
from .budgets import Budget
from .events import GATES, gate_reopened
from .instruments import REJECTED
from .lending import Lending
from .tickets import RequestTicket, Ticket, TupleState
from .wakeups import DUE_SLACK, GATE

__all__ = ["SUSPENDED_MESSAGE", "Settings"]

SUSPENDED_MESSAGE: Final = (
    "Provider/model is suspended by a provider limit; foreground work cannot wait for recovery"
)


class Settings(Lending):
    """Limits, gates, budgets and time on top of lending and the grant loop."""

    __slots__ = ()

    # -- caps ---------------------------------------------------------------------------------

    def set_limit(self, limit: int) -> None:
        """Change the global cap. Growing grants at once, in order; shrinking revokes nothing."""
        self.limit = limit
        self._drain()
        self._changed()

    def set_tuple_limit(self, model_tuple: ModelTuple, limit: int | None) -> None:
        """Cap (or, with None, uncap) a tuple. A raised cap grants at once."""
        state = self.tuples.state(model_tuple)
        state.limit = limit
        self._wake_tuple(state)
        self.tuples.forget_if_idle(state)
        self._changed()

    # -- gates --------------------------------------------------------------------------------

    def is_open(self, model_tuple: ModelTuple, now: float | None) -> bool:
        """Whether the gate is open at ``now`` (a pure read: a timed closure whose instant
        has passed counts as open even before its wake-up ran)."""
        state = self.tuples.states.get(model_tuple)
        if state is None or state.open:
            return True
        return state.reopens_at is not None and now is not None and state.reopens_at <= now

    def close(self, model_tuple: ModelTuple, reopens_at: float | None) -> None:
        """Close the tuple's gate and fail its ``reject`` waiters. Grants nothing.

        A closure is never shortened: closing a closed tuple keeps the later of the two
        reopen times, and a closure without a reopen time (None) lasts until :meth:`open`.
        """
        state = self.tuples.state(model_tuple)
        if state.open:
            state.open = False
            state.reopens_at = reopens_at
        elif reopens_at is None:
            state.reopens_at = None
        elif state.reopens_at is not None and reopens_at > state.reopens_at:
            state.reopens_at = reopens_at
        if state.reopens_at is not None and state.reopens_at == reopens_at:
            self.wakeups.add(reopens_at, GATE, state)
        # Nothing of a closed tuple draws: its budget's wake-up would grant nothing. The
        # front blocks again, at its instant then, when the gate opens.
        state.block = state.block_until = None
        foreground = state.foreground
        if foreground:
            state.foreground = None
            for ticket in sorted(foreground, key=_key):
                parker = self._discard(ticket, REJECTED)
                error = TupleSuspendedError(SUSPENDED_MESSAGE)
                if parker is not None:
                    parker.fail(error)
                else:
                    ticket.error = error
        self._changed()

    def open(self, model_tuple: ModelTuple) -> None:
        """Open the tuple's gate (fine when open); its waiters may be granted at once."""
        state = self.tuples.states.get(model_tuple)
        if state is None or state.open:
            return
        state.open = True
        state.reopens_at = None  # its wake-up is dead now
        self._wake_tuple(state)
        self.tuples.forget_if_idle(state)
        self._changed()

    # -- budgets --------------------------------------------------------------------------------

    def set_budget(
        self, model_tuple: ModelTuple, requests: float | None, tokens: float | None
    ) -> None:
        """Set both budget dimensions of a tuple (None removes one).

        A new dimension starts full; a changed one keeps what was spent. Requests waiting
        on the budget are re-examined at once (their wake-up may move either way).
        """
        state = self.tuples.state(model_tuple)
        state.budget = Budget.set(state.budget, requests, tokens, self._clock())
        self._budget_moved(state)

    def learn_budget(
        self,
        model_tuple: ModelTuple,
        requests: float | None,
        tokens: float | None,
        requests_remaining: float | None,
        tokens_remaining: float | None,
    ) -> None:
        """What a provider reported: per-minute limits where none was set explicitly (a
        new rate keeps what is available, at most its capacity), and what remains (which
        only ever lowers what is available)."""
        state = self.tuples.state(model_tuple)
        state.budget = Budget.learn(
            state.budget, requests, tokens, requests_remaining, tokens_remaining, self._clock()
        )
        self._budget_moved(state)

    def settle(self, ticket: RequestTicket, tokens: int) -> None:
        """A request's real token usage replaces its charge: refund or charge the difference."""
        change = tokens - ticket.tokens
        ticket.tokens = tokens
        # The tuple's bookkeeping now: a request settled after its exit may have outlived
        # the state it was granted on (an idle tuple is forgotten; see _forget_if_idle).
        state = self.tuples.states.get(ticket.tuple_state.tuple)
        if state is None:
            return  # idle: no budget to charge
        ticket.tuple_state = state
        budget = state.budget
        if change and budget is not None and budget.settle(change, self._clock()):
            self._budget_moved(state)

    def refund(self, ticket: RequestTicket) -> None:
        """Give back what a granted request drew: it was cancelled before it resumed."""
        state = ticket.tuple_state
        if state.budget is None:
            return
        state.budget.refund(ticket.tokens, self._clock())
        self._budget_moved(state)

    def _budget_moved(self, state: TupleState) -> None:
        # The front's instant may have moved either way: forget the block and let the
        # requests try again in order (the front re-blocks with its new instant).
        if state.block is not None:
            self._unblock(state)
        else:
            self._wake_tuple(state)
        self.tuples.forget_if_idle(state)
        self._changed()

    # -- time -----------------------------------------------------------------------------------

    def advance(self) -> bool:
        """Apply every wake-up that is due on the clock; True if any was.

        Timed gates reopen (a closure is never cut short: only its own wake-up opens it),
        budget blocks end and their requests try again.
        """
        woken: dict[TupleState, None] = {}
        for kind, state in self.wakeups.pop_due(self._clock() + DUE_SLACK):
            if kind == GATE:
                state.open = True
                state.reopens_at = None
                if GATES.isEnabledFor(logging.INFO):
                    gate_reopened(state.tuple, "reopen time reached")
            else:
                state.block = None
                state.block_until = None
            woken[state] = None
        if not woken:
            return False
        # Everything due happened at once: grant in order across all of it, not one
        # wake-up after the other (a later one could hold a better key).
        for state in woken:
            self._offer_all(state)
        self._drain()
        for state in woken:
            self.tuples.forget_if_idle(state)
        self._changed()
        return True

    def shift_time(self, delta: float) -> None:
        """Restate every stored instant on a clock ``delta`` seconds ahead (the same
        instants, new numbers: the coordinator moved to another event loop's clock)."""
        for state in self.tuples.states.values():
            if state.reopens_at is not None:
                state.reopens_at += delta
            if state.block_until is not None:
                state.block_until += delta
            if state.budget is not None:
                state.budget.shift(delta)
        self.wakeups.shift(delta)


def _key(ticket: Ticket) -> tuple[int, int]:
    return (ticket.order, ticket.seq)

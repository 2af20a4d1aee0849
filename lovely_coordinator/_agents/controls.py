"""The coordinator's settings: the cap, tuple caps, gates and budgets (CONTRACT §1, §5).

Plain synchronous methods of ``AgentCoordinator`` (:class:`CoordinatorControls` is that
half of its public API, over the core it owns): each validates its arguments, then
changes one setting under the core's lock, and the scheduler grants whatever that lets
run before the call returns.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from .._base.types import ModelTuple, ModelTupleLike, as_model_tuple
from .._base.validate import as_index, as_optional_index, as_seconds
from .admission import attached
from .events import GATES, gate_closed, gate_reopened

if TYPE_CHECKING:
    from .core import CoordinatorCore

__all__ = ["LIMIT_MESSAGE", "CoordinatorControls"]

LIMIT_MESSAGE: Final = "max_concurrency must be a positive integer"
_TUPLE_LIMIT_MESSAGE: Final = "Tuple limit must be a positive integer or None"
_REOPEN_MESSAGE: Final = "reopen_after must be a finite number of seconds >= 0"
_BUDGET_MESSAGE: Final = "Budget must be a positive finite number or None"
_REMAINING_MESSAGE: Final = "Remaining budget must be a finite number >= 0 or None"


def _budget(value: object) -> float | None:
    return None if value is None else as_seconds(value, _BUDGET_MESSAGE, positive=True)


def _remaining(value: object) -> float | None:
    return None if value is None else as_seconds(value, _REMAINING_MESSAGE)


class CoordinatorControls:
    """The settings half of ``AgentCoordinator``'s public API (over its ``_core``)."""

    _core: CoordinatorCore

    # -- settings --------------------------------------------------------------------------------

    def next_acceptance_order(self) -> int:
        """The next acceptance order: 1, 2, 3, … and always above every order seen."""
        with self._core._lock:
            return self._core._scheduler.next_order()

    def set_max_concurrency(self, limit: int) -> None:
        """Change the global cap. Growing grants waiters at once, in order; shrinking
        revokes nothing (``active_count`` may stay above the cap until permits end).

        Raises:
            InvalidArgumentError: ``limit`` is not an int ≥ 1; the cap is unchanged.
        """
        value = as_index(limit, LIMIT_MESSAGE)
        with self._core._lock:
            self._core._scheduler.set_limit(value)

    def set_tuple_limit(self, t: ModelTupleLike, limit: int | None) -> None:
        """Cap how many slots of tuple ``t`` may be taken at once (None: no cap).

        A waiter whose tuple is at its cap is skipped, never blocking other tuples.
        Lowering a cap revokes nothing; raising or removing it grants at once.

        Raises:
            InvalidArgumentError: a bad tuple, or ``limit`` not None or an int ≥ 1.
        """
        model_tuple = as_model_tuple(t)
        value = as_optional_index(limit, _TUPLE_LIMIT_MESSAGE)
        with self._core._lock:
            self._core._scheduler.set_tuple_limit(model_tuple, value)

    def close_tuple(self, t: ModelTupleLike, *, reopen_after: float | None = None) -> None:
        """Close tuple ``t``'s gate: its waiters stay queued but are not granted.

        Queued waiters on ``t`` that asked ``reject_on_closed_tuple=True`` (inactive
        reservations included) fail with :class:`TupleSuspendedError`. Running permits are
        untouched and nothing is granted. A closure is never shortened: with
        ``reopen_after`` the gate reopens by itself that many seconds from now, unless it
        is already closed until later or until further notice; without it, the gate
        stays closed until :meth:`open_tuple`.

        A timed reopen outlives the event loop it was armed on: when the coordinator is
        next used from another loop (a later ``anyio.run``), the reopen moves there for
        the time that remains, or happens at once if its time has passed. (Across loops
        the remaining time is real time; a trio ``MockClock`` does not carry over.)

        Raises:
            InvalidArgumentError: a bad tuple, or ``reopen_after`` not a finite number ≥ 0
                (nothing changed).
        """
        model_tuple = as_model_tuple(t)
        after = None if reopen_after is None else as_seconds(reopen_after, _REOPEN_MESSAGE)
        with self._core._lock:
            self._core._follow()
            now = self._core._clock.now()
            at = None if after is None else now + after
            if not GATES.isEnabledFor(logging.INFO):
                self._core._scheduler.close(model_tuple, at)
                return
            before = self._gate(model_tuple)
            self._core._scheduler.close(model_tuple, at)
            gate_closed(
                model_tuple,
                before,
                self._gate(model_tuple),
                now + self._core._clock.here_minus_home(),
            )

    def _gate(self, model_tuple: ModelTuple) -> tuple[bool, float | None]:
        # (open, reopens_at on the caller's clock), for the log (under the lock).
        state = self._core._scheduler.tuple_state(model_tuple)
        if state is None or state.open:
            return True, None
        at = state.reopens_at
        return False, None if at is None else at + self._core._clock.here_minus_home()

    def open_tuple(self, t: ModelTupleLike) -> None:
        """Open tuple ``t``'s gate (fine when open); its waiters may be granted at once.

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        with self._core._lock:
            was_open = self._core._scheduler.is_open(model_tuple, None)
            self._core._scheduler.open(model_tuple)
        if not was_open and GATES.isEnabledFor(logging.INFO):
            gate_reopened(model_tuple, "open_tuple")

    def is_tuple_open(self, t: ModelTupleLike) -> bool:
        """Whether tuple ``t``'s gate is open (a pure read).

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        with self._core._lock:
            return self._core._scheduler.is_open(model_tuple, self._core._clock.now())

    def tuple_reopens_at(self, t: ModelTupleLike) -> float | None:
        """When tuple ``t``'s gate reopens by itself, on the anyio clock of the calling
        event loop (outside any loop: of the coordinator's home loop); None when open or
        closed until :meth:`open_tuple`. A pure read.

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        with self._core._lock:
            now = self._core._clock.now()
            if self._core._scheduler.is_open(model_tuple, now):
                return None
            state = self._core._scheduler.tuple_state(model_tuple)
            at = None if state is None else state.reopens_at
            return None if at is None else at + self._core._clock.here_minus_home()

    def set_budget(
        self,
        t: ModelTupleLike,
        *,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
    ) -> None:
        """Budget tuple ``t``'s model requests (CONTRACT §5): token buckets of requests
        and of tokens per minute, refilled continuously and full when first set.

        ``None`` removes a dimension; both ``None`` removes the budget. A changed budget
        keeps what was already spent. Permits never draw from a budget.

        Raises:
            InvalidArgumentError: a bad tuple, or a value that is not a finite number
                > 0 (``bool`` is not a number here); nothing changed.
        """
        model_tuple = as_model_tuple(t)
        requests, tokens = _budget(requests_per_minute), _budget(tokens_per_minute)
        with self._core._lock:
            self._core._follow()
            self._core._scheduler.set_budget(model_tuple, requests, tokens)

    def learn_budget(
        self,
        t: ModelTupleLike,
        *,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        requests_remaining: float | None = None,
        tokens_remaining: float | None = None,
    ) -> None:
        """Correct tuple ``t``'s budget from what the provider reports (for extensions).

        A per-minute limit sets that dimension's budget unless :meth:`set_budget` set it
        explicitly (then the explicit one stands); a new learned rate keeps what is
        available (at most the new capacity), so a rate that moves with every response
        never turns into a debt. A remaining amount lowers what is available to at most
        that (it never raises it), in a dimension that has a budget. Processes that share
        one provider quota converge through this without any shared store.

        Raises:
            InvalidArgumentError: a bad tuple, a limit that is not a finite number > 0 or
                a remaining amount that is not a finite number ≥ 0; nothing changed.
        """
        model_tuple = as_model_tuple(t)
        requests, tokens = _budget(requests_per_minute), _budget(tokens_per_minute)
        left_requests, left_tokens = _remaining(requests_remaining), _remaining(tokens_remaining)
        hook = attached(self)
        if hook is not None:  # a fleet: the provider's budget is the fleet's (admission.py)
            hook.learn(model_tuple, requests, tokens, left_requests, left_tokens)
            return
        with self._core._lock:
            self._core._follow()
            self._core._scheduler.learn_budget(
                model_tuple, requests, tokens, left_requests, left_tokens
            )

"""The coordinator's log records (CONTRACT §7): gates and budgets.

Records go to children of the ``lovely_coordinator`` logger (stdlib ``logging``; the
library installs no handler): ``lovely_coordinator.gates`` and
``lovely_coordinator.budgets``. Each carries its facts as ``extra`` attributes too
(``model_tuple``, ``reopens_at``, ``reopens_in``, ``reason``, ``dimension``, ...) for
structured handlers. Nothing here ever sees a request's payload or a credential.

Every function is called only where the event already is off the hot path (a gate
changes, a budget starts to hold requests back), and the callers check
``isEnabledFor`` first, so a disabled logger costs one cached lookup.

Levels: a gate closing, staying closed for longer, or reopening is INFO (an incident a
person wants to see); a budget holding requests back is DEBUG (routine pacing, one record
each time the budget's front request has to wait, with the instant it can go).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from .._base.types import ModelTuple

if TYPE_CHECKING:
    from .tickets import Ticket, TupleState

__all__ = [
    "BUDGETS",
    "GATES",
    "budget_exhausted",
    "gate_closed",
    "gate_reopened",
]

GATES: Final = logging.getLogger("lovely_coordinator.gates")
BUDGETS: Final = logging.getLogger("lovely_coordinator.budgets")


def _until(reopens_at: float | None, now: float) -> str:
    if reopens_at is None:
        return "until open_tuple() opens it"
    return f"until {reopens_at:.2f} (in {max(0.0, reopens_at - now):.1f} s)"


def gate_closed(
    model_tuple: ModelTuple,
    before: tuple[bool, float | None],
    after: tuple[bool, float | None],
    now: float,
) -> None:
    """``close_tuple`` ran: ``before``/``after`` are ``(open, reopens_at)`` on the caller's
    clock, ``now`` is that clock's time."""
    was_open, was_at = before
    _, at = after
    facts = {
        "model_tuple": model_tuple,
        "reopens_at": at,
        "reopens_in": None if at is None else max(0.0, at - now),
        "reason": "close_tuple",
    }
    if was_open:
        GATES.info("gate of %s closed %s", model_tuple, _until(at, now), extra=facts)
    elif at != was_at:
        GATES.info("gate of %s stays closed, now %s", model_tuple, _until(at, now), extra=facts)
    elif GATES.isEnabledFor(logging.DEBUG):
        GATES.debug(
            "gate of %s was already closed %s; a closure is never shortened",
            model_tuple,
            _until(at, now),
            extra=facts,
        )


def gate_reopened(model_tuple: ModelTuple, reason: str) -> None:
    """A closed gate opened: ``reason`` is ``"open_tuple"`` or ``"reopen time reached"``."""
    GATES.info(
        "gate of %s reopened (%s)",
        model_tuple,
        reason,
        extra={
            "model_tuple": model_tuple,
            "reopens_at": None,
            "reopens_in": None,
            "reason": reason,
        },
    )


def budget_exhausted(state: TupleState, front: Ticket, ready: float, now: float) -> None:
    """The budget of ``state``'s tuple cannot hold request ``front`` before ``ready``
    (on the scheduler's clock, whose time is ``now``): it and every later request of the
    tuple wait until then."""
    short = []
    requests, tokens = state.request_bucket, state.token_bucket
    if requests is not None and not requests.holds(1, now):
        short.append(f"requests: {requests.available(now):.1f} left of {requests.capacity:g}")
    if tokens is not None and not tokens.holds(front.tokens, now):
        short.append(
            f"tokens: {front.tokens} needed, {tokens.available(now):.0f} left "
            f"of {tokens.capacity:g}"
        )
    dimension = " and ".join(part.split(":", 1)[0] for part in short)
    BUDGETS.debug(
        "budget of %s exhausted (%s); its requests wait until %.2f (in %.1f s)",
        state.tuple,
        "; ".join(short),
        ready,
        ready - now,
        extra={
            "model_tuple": state.tuple,
            "dimension": dimension,
            "ready_at": ready,
            "ready_in": ready - now,
        },
    )

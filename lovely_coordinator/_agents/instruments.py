"""Instruments: what a metrics or tracing library is told about the coordinator's waits.

An :class:`Instrument` is registered with ``AgentCoordinator.add_instrument`` and is told
about the *permit lifecycle*: a caller starts to wait (its acquire, request, reservation or
reacquire could not be granted at once and queued), and the wait ends — ``granted``,
``cancelled`` (the caller gave up: a cancel scope, ``reservation.cancel()``, a permit
released while it waited to reacquire) or ``rejected`` (the coordinator refused it: a
closed gate with ``reject_on_closed_tuple``, ``max_queued``). Every wait ends exactly once;
a call granted at once, or refused before it took a place, has an end without a start.
It is also told the tokens model requests settle. Everything else an instrument may want
(counts, gates, budgets) is a pure read of ``statistics()``, taken whenever it likes.

Cost: the scheduler holds ``None`` while nothing is registered, and its hot paths test
only that. Only the hooks a subclass overrides are called. Wait times are measured with
``time.monotonic()`` from the moment the ticket queued, which the scheduler records only
where a ticket really queues (never on the uncontended path).

Hooks run synchronously, under the coordinator's lock, *inside* the scheduling call that
caused them, often in another task than the waiter (a grant happens in the task that
freed the slot); ``wait_started`` alone always runs in the waiting caller's own context.
They must be quick and must not call the coordinator's scheduling methods (reading
``statistics()`` is fine). Whatever a hook raises is logged and swallowed: it can never
corrupt a scheduling decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING, Final, Literal, final

from .._base.types import ModelTuple

if TYPE_CHECKING:
    from .tickets import Ticket

__all__ = ["CANCELLED", "GRANTED", "REJECTED", "Dispatch", "Instrument", "WaitOutcome"]

_log = logging.getLogger("lovely_coordinator.instruments")

WaitOutcome = Literal["granted", "cancelled", "rejected"]
"""How a wait ended."""

GRANTED: Final = "granted"
CANCELLED: Final = "cancelled"
REJECTED: Final = "rejected"


class Instrument:
    """The base class of a coordinator instrument: override the hooks you need, and
    register it with ``AgentCoordinator.add_instrument``.

    It is told the *permit lifecycle*: a caller starts to wait (an acquire, model request,
    reservation or reacquire that could not be granted at once queued), and its wait ends
    ``granted``, ``cancelled`` (the caller gave up: a cancel scope,
    ``reservation.cancel()``, a permit released while waiting to reacquire) or
    ``rejected`` (refused: a closed gate with ``reject_on_closed_tuple``,
    ``max_queued``). Every wait ends exactly once; a call granted or refused at once has
    an end (after 0.0 s) without a start. Wait times are ``time.monotonic()`` seconds
    from the moment it queued. Counts, gates and budgets are pure reads of
    ``statistics()``, to take whenever the instrument likes.

    ``wait`` identifies one wait: the same object is passed to :meth:`wait_started` and
    :meth:`wait_ended`, so it can key a dict (hashable, compared by identity). It is
    opaque: do not inspect it or keep it after :meth:`wait_ended`. It is ``None`` for a
    call refused before it took a place.

    Hooks run synchronously, under the coordinator's lock, inside the scheduling call
    that caused them and often in another task than the waiter (a grant happens in the
    task that freed the slot); :meth:`wait_started` always runs in the waiting caller's
    own context. They must be quick and must not call the coordinator's scheduling
    methods (reading ``statistics()`` is fine). Whatever a hook raises is logged and
    swallowed. Only the hooks a subclass overrides are called.
    """

    def wait_started(self, wait: object, model_tuple: ModelTuple) -> None:
        """A caller queued for ``model_tuple`` (called in the caller's own context)."""

    def wait_ended(
        self, wait: object, model_tuple: ModelTuple, outcome: WaitOutcome, waited: float
    ) -> None:
        """A wait ended after ``waited`` seconds (0.0 for a call granted or refused at once)."""

    def tokens_settled(self, model_tuple: ModelTuple, tokens: int) -> None:
        """A model request settled ``tokens`` more tokens than it had settled before.

        Summed, these give each request's largest settlement: a request that settles once
        reports exactly its usage; one that settles a growing total reports the growth;
        a settlement lower than an earlier one reports nothing (a counter never goes down).
        """


_WaitStarted = Callable[[object, ModelTuple], object]
_WaitEnded = Callable[[object, ModelTuple, WaitOutcome, float], object]
_TokensSettled = Callable[[ModelTuple, int], object]


def _overrides(instrument: Instrument, name: str) -> bool:
    return getattr(type(instrument), name) is not getattr(Instrument, name)


@final
class Dispatch:
    """The registered instruments, as the scheduler calls them (``Engine.observer``).

    Immutable: registering or removing an instrument builds a new one (under the lock), so
    a hook that registers another cannot change the loop it runs in.
    """

    __slots__ = ("_ended", "_settled", "_started", "entries")

    def __init__(self, entries: tuple[tuple[object, Instrument], ...]) -> None:
        self.entries = entries  # (registration token, instrument), in registration order
        instruments = [instrument for _token, instrument in entries]
        self._started: tuple[_WaitStarted, ...] = tuple(
            i.wait_started for i in instruments if _overrides(i, "wait_started")
        )
        self._ended: tuple[_WaitEnded, ...] = tuple(
            i.wait_ended for i in instruments if _overrides(i, "wait_ended")
        )
        self._settled: tuple[_TokensSettled, ...] = tuple(
            i.tokens_settled for i in instruments if _overrides(i, "tokens_settled")
        )

    def started(self, ticket: Ticket) -> None:
        """``ticket`` queued (its ``since`` is set)."""
        model_tuple = ticket.tuple_state.tuple
        for hook in self._started:
            try:
                hook(ticket, model_tuple)
            except BaseException:  # a hook runs inside a scheduling call: contain all
                _log.exception("lovely_coordinator: instrument hook %r failed", hook)

    def ended(self, ticket: Ticket, outcome: WaitOutcome) -> None:
        """``ticket``'s wait ended (before its state changed, so its tuple is still its own)."""
        if not self._ended:
            return
        since = ticket.since
        waited = 0.0 if since is None else max(0.0, monotonic() - since)
        self._end(ticket, ticket.tuple_state.tuple, outcome, waited)

    def refused(self, model_tuple: ModelTuple) -> None:
        """A call was rejected before it took a place."""
        self._end(None, model_tuple, REJECTED, 0.0)

    def _end(
        self, wait: object, model_tuple: ModelTuple, outcome: WaitOutcome, waited: float
    ) -> None:
        for hook in self._ended:
            try:
                hook(wait, model_tuple, outcome, waited)
            except BaseException:
                _log.exception("lovely_coordinator: instrument hook %r failed", hook)

    def settled(self, model_tuple: ModelTuple, tokens: int) -> None:
        """A request settled ``tokens`` more than before (see ``Instrument.tokens_settled``)."""
        for hook in self._settled:
            try:
                hook(model_tuple, tokens)
            except BaseException:
                _log.exception("lovely_coordinator: instrument hook %r failed", hook)

"""The library's one wait mechanism: a one-shot rendezvous between sync state and a task.

Every blocking operation in the library has the same shape. A pure, synchronous state
machine decides who gets what (a slot, a turn, a lease) and hands it over *directly*, by
calling :meth:`Parker.grant` while it updates its own state, so nobody can barge in between
the decision and the waiter's resumption. The waiting task only ever ``await``\\ s
:meth:`Parker.wait`.

Cancellation is the hard part, and it is handled here once:

* cancelled while still pending → ``on_abort()`` runs, so the state machine drops the
  queue entry;
* cancelled after the grant but before the task resumed (possible on asyncio, and on any
  backend when the grant lands during the final checkpoint) → ``on_undo(value)`` runs, so
  the state machine hands the grant on to the next waiter instead of leaking it.

Both callbacks are synchronous and run before the cancellation propagates, so there is
no window in which the grant belongs to nobody.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Generic, TypeVar, final

import anyio

__all__ = ["Parker"]

T = TypeVar("T")

_PENDING: Final = 0
_GRANTED: Final = 1
_FAILED: Final = 2
_CLOSED: Final = 3  # the waiter left (cancelled) and its callbacks already ran


@final
class Parker(Generic[T]):
    """One task parked until a synchronous owner grants it a value or fails it.

    Invariants:
        * ``_state`` only moves forward: PENDING → GRANTED | FAILED, and then → CLOSED
          only when the waiter was cancelled.
        * ``grant``/``fail`` are called at most once, and only while PENDING.
        * After ``wait`` returns or raises, the owner never needs to look at this parker
          again: either the value was delivered, or exactly one of ``on_abort`` /
          ``on_undo`` ran.
    """

    __slots__ = ("_error", "_event", "_state", "_value")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._state = _PENDING
        self._value: T | None = None
        self._error: BaseException | None = None

    @property
    def pending(self) -> bool:
        """True until the owner grants or fails this waiter (or the waiter leaves)."""
        return self._state == _PENDING

    def grant(self, value: T) -> None:
        """Hand ``value`` to the waiter. Sync; the owner's state already reflects it."""
        assert self._state == _PENDING, "a parker is granted at most once"
        self._state = _GRANTED
        self._value = value
        self._event.set()

    def fail(self, error: BaseException) -> None:
        """Make the waiter raise ``error``. Sync; the waiter holds nothing afterwards."""
        assert self._state == _PENDING, "a parker is resolved at most once"
        self._state = _FAILED
        self._error = error
        self._event.set()

    async def wait(
        self,
        on_abort: Callable[[], object],
        on_undo: Callable[[T], object],
    ) -> T:
        """Wait for the grant and return its value, or raise the failure.

        Args:
            on_abort: called if the wait is cancelled before any grant; it must remove
                this waiter from the owner's queue.
            on_undo: called with the granted value if the wait is cancelled after the
                grant; it must give the value back (hand it to the next waiter).
        """
        try:
            await self._event.wait()
        except BaseException:
            state = self._state
            self._state = _CLOSED
            if state == _PENDING:
                on_abort()
            elif state == _GRANTED:
                value, self._value = self._value, None
                on_undo(value)  # type: ignore[arg-type]
            raise
        if self._state == _FAILED:
            error, self._error = self._error, None
            assert error is not None
            raise error
        value = self._value
        self._value = None
        return value  # type: ignore[return-value]

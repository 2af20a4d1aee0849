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

How the task sleeps is the backend's own cheapest primitive, the one its locks use: a
bare future on asyncio, ``wait_task_rescheduled`` on trio. Both are cancelled by anyio
cancel scopes like any other wait. (An ``anyio.Event`` would do the same job through
three more objects and two more coroutine frames per waiter; parked waiters are the
coordinator's hot path and its memory, so the difference matters there.)
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar, final

__all__ = ["Parker"]

T = TypeVar("T")

_PENDING: Final = 0
_GRANTED: Final = 1
_FAILED: Final = 2
_CLOSED: Final = 3  # the waiter left (cancelled) and its callbacks already ran

_sniffio_thread: Any
try:
    # trio sets ``thread_local.name = "trio"`` while it runs a task (sniffio's protocol).
    from sniffio import thread_local as _sniffio_thread
except ModuleNotFoundError:  # pragma: no cover - trio requires sniffio, so: asyncio only
    _sniffio_thread = type("_NoTrio", (), {"name": None})()


@final
class Parker(Generic[T]):
    """One task parked until a synchronous owner grants it a value or fails it.

    Invariants:
        * ``_state`` only moves forward: PENDING → GRANTED | FAILED, and then → CLOSED
          only when the waiter was cancelled.
        * ``grant``/``fail`` are called at most once, and only while PENDING.
        * ``_sleeper`` is the asyncio future or trio task that a resolution must wake,
          while the waiter sleeps; None before it sleeps and after it was woken.
        * After ``wait`` returns or raises, the owner never needs to look at this parker
          again: either the value was delivered, or exactly one of ``on_abort`` /
          ``on_undo`` ran.
    """

    __slots__ = ("_error", "_sleeper", "_state", "_value")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: T | None = None
        self._error: BaseException | None = None
        self._sleeper: Any = None

    @property
    def pending(self) -> bool:
        """True until the owner grants or fails this waiter (or the waiter leaves)."""
        return self._state == _PENDING

    def grant(self, value: T) -> None:
        """Hand ``value`` to the waiter. Sync; the owner's state already reflects it."""
        assert self._state == _PENDING, "a parker is granted at most once"
        self._state = _GRANTED
        self._value = value
        self._wake()

    def fail(self, error: BaseException) -> None:
        """Make the waiter raise ``error``. Sync; the waiter holds nothing afterwards."""
        assert self._state == _PENDING, "a parker is resolved at most once"
        self._state = _FAILED
        self._error = error
        self._wake()

    def _wake(self) -> None:
        sleeper = self._sleeper
        if sleeper is None:
            return  # not asleep yet: wait() will see the state and not sleep
        self._sleeper = None
        if isinstance(sleeper, asyncio.Future):
            if not sleeper.done():  # a cancellation may have resolved it already
                sleeper.set_result(None)
        else:
            sys.modules["trio"].lowlevel.reschedule(sleeper)

    async def wait(
        self,
        on_abort: Callable[[], object],
        on_undo: Callable[[T], object],
    ) -> T:
        """Wait for the grant and return its value, or raise the failure.

        Always a checkpoint: it yields (and may be cancelled) even when the outcome is
        already there.

        Args:
            on_abort: called if the wait is cancelled before any grant; it must remove
                this waiter from the owner's queue.
            on_undo: called with the granted value if the wait is cancelled after the
                grant; it must give the value back (hand it to the next waiter).
        """
        try:
            # The sleep is inlined (not a helper coroutine): one frame less per waiter.
            if _sniffio_thread.name == "trio":
                lowlevel = sys.modules["trio"].lowlevel
                if self._state != _PENDING:
                    await lowlevel.checkpoint()  # resolved already: just the checkpoint
                else:
                    self._sleeper = lowlevel.current_task()
                    await lowlevel.wait_task_rescheduled(self._trio_abort)
            elif self._state != _PENDING:
                await asyncio.sleep(0)  # resolved already: just the checkpoint
            else:
                future = asyncio.get_running_loop().create_future()
                self._sleeper = future
                await future
        except BaseException:
            state = self._state
            self._state = _CLOSED
            self._sleeper = None
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

    def _trio_abort(self, _: object) -> object:
        self._sleeper = None  # cancelled: nothing may reschedule the task any more
        return sys.modules["trio"].lowlevel.Abort.SUCCEEDED

"""The library's one wait mechanism: a one-shot rendezvous between sync state and a task.

Every blocking operation in the library has the same shape. A pure, synchronous state
machine decides who gets what (a slot, a turn, a lease) and hands it over *directly*, by
calling :meth:`Parker.grant` while it updates its own state, so nobody can barge in between
the decision and the waiter's resumption. The waiting task only ever ``await``\\ s
:meth:`Parker.wait`.

Cancellation is the hard part, and it is handled here once:

* cancelled while still pending → the owner's ``abort()`` runs, so the state machine
  drops the queue entry;
* cancelled after the grant but before the task resumed (possible on asyncio, and on any
  backend when the grant lands during the final checkpoint) → the owner's
  ``undo(value)`` runs, so the state machine hands the grant on to the next waiter
  instead of leaking it.

Both callbacks are synchronous and run before the cancellation propagates, so there is
no window in which the grant belongs to nobody. When the owner's state is shared between
threads (a coordinator used from event loops in several threads), the owner passes its
lock: the cancelled waiter then reads the outcome and runs its callback under that lock,
so a grant made by another thread at the same moment is either seen (and undone) or not
made at all (and the entry dropped) — never lost.

How the task sleeps is the backend's own cheapest primitive, the one its locks use: a
bare future on asyncio, ``wait_task_rescheduled`` on trio. Both are cancelled by anyio
cancel scopes like any other wait. A grant from another thread wakes the task through its
loop's thread-safe entry (``call_soon_threadsafe``, the trio token).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import types
from collections.abc import Awaitable, Generator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final, Generic, Protocol, TypeVar

from .backend import trio_running

__all__ = ["PENDING", "CancelHandler", "Parker", "Wakeable", "checkpoint"]

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
K = TypeVar("K")
K_contra = TypeVar("K_contra", contravariant=True)


class Wakeable(Protocol):
    """What an owner needs of a parked waiter it resolves (:class:`Parker` fits)."""

    def grant(self, value: bool) -> None: ...

    def fail(self, error: BaseException) -> None: ...


class CancelHandler(Protocol[K_contra, T_contra]):
    """What a parker tells its owner when its wait is cancelled (see :meth:`Parker.wait`)."""

    def _parker_abort(self, key: K_contra, /) -> object: ...

    def _parker_undo(self, key: K_contra, value: T_contra, /) -> object: ...


PENDING: Final = 0  # (exported for subclasses whose __init__ sets the fields inline)
_PENDING: Final = PENDING
_GRANTED: Final = 1
_FAILED: Final = 2
_CLOSED: Final = 3  # the waiter left (cancelled) and its callbacks already ran

_NO_LOCK: Final = nullcontext()


class Parker(Generic[T]):
    """One task parked until a synchronous owner grants it a value or fails it.

    A base class, so that the owner's record of a waiter can *be* its parker (the
    coordinator's tickets are: one object per waiter instead of two); on its own it is a
    plain one-shot parker.

    Invariants:
        * ``_state`` only moves forward: PENDING → GRANTED | FAILED, and then → CLOSED
          only when the waiter was cancelled.
        * ``grant``/``fail`` are called at most once, and only while PENDING.
        * ``_sleeper`` is the asyncio future or trio task that a resolution must wake,
          while the waiter sleeps; None before it sleeps and after it was woken.
        * ``_home`` is, for a trio sleeper, ``(trio token, thread id)``: how to wake it
          from another thread.
        * After ``wait`` returns or raises, the owner never needs to look at this parker
          again: either the value was delivered, or exactly one of ``abort`` /
          ``undo`` ran.
    """

    __slots__ = ("_error", "_home", "_sleeper", "_state", "_value")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: T | None = None
        self._error: BaseException | None = None
        self._sleeper: Any = None
        self._home: tuple[Any, int] | None = None

    @property
    def pending(self) -> bool:
        """True until the owner grants or fails this waiter (or the waiter leaves)."""
        return self._state == _PENDING

    def grant(self, value: T) -> None:
        """Hand ``value`` to the waiter. Sync; the owner's state already reflects it."""
        assert self._state == _PENDING, "a parker is granted at most once"
        self._state = _GRANTED
        self._value = value
        if self._sleeper is not None:
            self._wake()

    def fail(self, error: BaseException) -> None:
        """Make the waiter raise ``error``. Sync; the waiter holds nothing afterwards."""
        assert self._state == _PENDING, "a parker is resolved at most once"
        self._state = _FAILED
        self._error = error
        if self._sleeper is not None:
            self._wake()

    def _wake(self) -> None:
        sleeper = self._sleeper
        self._sleeper = None
        if isinstance(sleeper, asyncio.Future):
            loop = sleeper.get_loop()
            if loop is asyncio._get_running_loop():
                if not sleeper.done():  # a cancellation may have resolved it already
                    sleeper.set_result(None)
            else:
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody to wake
                    loop.call_soon_threadsafe(_resolve, sleeper)
            return
        home = self._home
        assert home is not None
        if home[1] == threading.get_ident() and trio_running():
            sys.modules["trio"].lowlevel.reschedule(sleeper)
        else:
            with contextlib.suppress(RuntimeError):  # trio.RunFinishedError: nobody to wake
                home[0].run_sync_soon(self._trio_wake_later, sleeper)

    def _trio_wake_later(self, task: Any) -> None:
        # Runs in the trio thread. If the task was cancelled meanwhile (_trio_abort ran),
        # it is no longer parked and must not be rescheduled.
        home = self._home
        if home is not None and home[0] is not None:
            self._home = (None, home[1])
            sys.modules["trio"].lowlevel.reschedule(task)

    async def wait(
        self,
        owner: CancelHandler[K, T],
        key: K,
        lock: AbstractContextManager[object] = _NO_LOCK,
    ) -> T:
        """Wait for the grant and return its value, or raise the failure.

        Always a checkpoint: it yields (and may be cancelled) even when the outcome is
        already there. The whole wait is these three steps; a hot caller may inline them
        (``await p.sleep(lock)``, ``p.cancelled(...)`` on any exception, ``p.outcome()``)
        to save this coroutine's frame per parked waiter.

        Args:
            owner: told if the wait is cancelled: ``owner._parker_abort(key)`` before any
                grant (it must remove this waiter from its queue),
                ``owner._parker_undo(key, value)`` after the grant (it must give the value
                back: hand it to the next waiter). The owner and a key rather than two
                callbacks: parked waiters are the coordinator's memory, and this costs
                none of it.
            key: what the owner needs to know which waiter left (a ticket).
            lock: the owner's lock, held while a cancelled wait decides between the two
                (the grant may come from another thread).
        """
        try:
            await self.sleep(lock)
        except BaseException:
            self.cancelled(owner, key, lock)
            raise
        return self.outcome()

    def sleep(self, lock: AbstractContextManager[object] = _NO_LOCK) -> Awaitable[object]:
        """What the waiter awaits: the sleep until the grant, or (resolved already) just a
        checkpoint. The backend's own cheapest wait: a bare future on asyncio,
        ``wait_task_rescheduled`` on trio; whether to sleep is decided under ``lock``."""
        if trio_running():
            lowlevel = sys.modules["trio"].lowlevel
            if self._state == _PENDING:
                with lock:  # decided under the lock: a grant may come from a thread
                    if self._state == _PENDING:
                        self._home = (lowlevel.current_trio_token(), threading.get_ident())
                        self._sleeper = lowlevel.current_task()
                        return lowlevel.wait_task_rescheduled(self._trio_abort)  # type: ignore[no-any-return]
            return lowlevel.checkpoint()  # type: ignore[no-any-return]
        if self._state != _PENDING:
            return _checkpoint()  # resolved already: just the checkpoint
        future = asyncio.get_running_loop().create_future()
        with lock:
            if self._state == _PENDING:
                self._sleeper = future
            else:
                future.set_result(None)
        return future

    def cancelled(
        self, owner: CancelHandler[K, T], key: K, lock: AbstractContextManager[object] = _NO_LOCK
    ) -> None:
        """The wait was cancelled (or failed): tell the owner, before the exception
        propagates, whether to drop the queued waiter or to undo its grant."""
        with lock:
            state = self._state
            self._state = _CLOSED
            self._sleeper = None
            if state == _PENDING:
                owner._parker_abort(key)
            elif state == _GRANTED:
                value, self._value = self._value, None
                owner._parker_undo(key, value)  # type: ignore[arg-type]

    def outcome(self) -> T:
        """After the sleep: the granted value, or the failure raised."""
        if self._state == _FAILED:
            error, self._error = self._error, None
            assert error is not None
            raise error
        value = self._value
        self._value = None
        return value  # type: ignore[return-value]

    def _trio_abort(self, _: object) -> object:
        # Cancelled: nothing may reschedule the task any more, not even a wake from
        # another thread that is already on its way (see _trio_wake_later).
        self._sleeper = None
        home = self._home
        if home is not None:
            self._home = (None, home[1])
        return sys.modules["trio"].lowlevel.Abort.SUCCEEDED


def checkpoint() -> Awaitable[object]:
    """A schedule point where a cancellation lands, nothing more: the backend's own
    (``trio.lowlevel.checkpoint``; a bare yield on asyncio), without anyio's look-up of
    the running library. For a caller that must be cancellable *before* it takes a
    place anywhere (see ``PermitContext.__aenter__``)."""
    if trio_running():
        return sys.modules["trio"].lowlevel.checkpoint()  # type: ignore[no-any-return]
    return _checkpoint()


@types.coroutine
def _checkpoint() -> Generator[None, None, None]:
    # asyncio.sleep(0) without its outer coroutine: a bare yield, which the task takes as
    # "run me again soon" and where a cancellation lands (one frame less per acquire).
    yield


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

"""``request_sync()``: the blocking twin of ``request()``, for threads without an event loop.

A sync SDK client called from a thread pool has no event loop to park on, yet its calls
must be admitted by the same scheduler, in the same line, as the async ones. The
coordinator's waits and timers live on event loops (``_base/waiter``, ``timers``), so a
blocking admission borrows one: a private daemon thread runs an asyncio loop (the
*helper loop*, one per process, started on first use) on which every blocking admission
is made, exactly as an async caller on a loop of another thread would make it. The
calling thread only waits on a ``threading.Event``.

One admission, step by step:

1. The caller thread hands :meth:`_Admission.start` to the helper loop and waits.
2. ``start`` enqueues the ticket synchronously (the helper loop adopts the coordinator
   if it has no live home loop, else visits it as a guest, so timed wake-ups always have
   a loop to run on). Granted at once, or refused (``TupleSuspendedError``,
   ``CoordinatorBusyError``): done, whatever the timeout — a timeout of 0 admits exactly
   what can be admitted at once, never racing anything.
3. Otherwise a task on the helper loop awaits the ticket's parker. The deadline is that
   task's own timer, so the parker's cancellation protocol (abort a queued ticket, undo a
   grant that raced the cancel, refunding its draw) does the clean-up. The task is never
   cancelled from outside before its first step: an abandoned admission (the waiting
   thread interrupted, ``KeyboardInterrupt``) only sets a flag that the task checks first
   (a task cancelled before it ran would leave its ticket queued forever).
4. The task's end sets the event; the caller thread returns the request or raises.

The exit releases the ticket directly from the caller thread (the core is thread-safe).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Final, final

from .._base.backend import current_loop
from .._base.errors import AdmissionTimeoutError, UsageError
from .._base.types import ModelTuple
from .._base.validate import as_seconds
from .admission import admit_blocking
from .requests import ModelRequest
from .tickets import GRANTED, RequestTicket

if TYPE_CHECKING:
    from .core import CoordinatorCore

__all__ = ["TIMEOUT_MESSAGE", "BlockingRequestContext", "as_timeout", "helper_loop"]

TIMEOUT_MESSAGE: Final = "timeout must be a nonnegative number of seconds or None"
_IN_LOOP_MESSAGE: Final = (
    "request_sync() blocks its thread, and this thread runs an event loop: "
    "use `async with coordinator.request(...)` here"
)


def as_timeout(value: object) -> float | None:
    """A timeout: ``None`` (wait as long as it takes), or seconds ≥ 0 (infinity: ``None``)."""
    if value is None:
        return None
    if isinstance(value, float) and value == math.inf:
        return None
    return as_seconds(value, TIMEOUT_MESSAGE)


# -- the helper loop ----------------------------------------------------------------------------


@final
class _HelperLoop:
    """The process's daemon asyncio loop for blocking admissions (restarted after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            loop = self._loop
            if loop is None or self._pid != os.getpid():
                loop = self._loop = self._start()
                self._pid = os.getpid()
            return loop

    @staticmethod
    def _start() -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        loop.call_soon(ready.set)
        thread = threading.Thread(
            target=loop.run_forever, name="lovely-coordinator-blocking", daemon=True
        )
        thread.start()
        ready.wait()  # running: it is alive for the core (_backend.loop_alive) from now on
        return loop


_helper = _HelperLoop()


def helper_loop() -> asyncio.AbstractEventLoop:
    """The helper loop, started on first use."""
    return _helper.get()


# -- one admission ------------------------------------------------------------------------------


@final
class _Admission:
    """One blocking admission, made on the helper loop (see the module docstring).

    Invariants: ``done`` is set exactly once, after ``ticket`` (granted) or ``error`` was
    recorded; the waiting task starts only from ``start``, and nothing but its own
    deadline or the ``abandoned`` flag it reads first ever cancels it.
    """

    __slots__ = (
        "_core",
        "_deadline",
        "_order",
        "_reject",
        "_t",
        "_task",
        "_tokens",
        "abandoned",
        "done",
        "error",
        "ticket",
    )

    def __init__(
        self,
        core: CoordinatorCore,
        t: ModelTuple,
        tokens: int,
        order: int | None,
        reject: bool,
        deadline: float | None,
    ) -> None:
        self._core = core
        self._t = t
        self._tokens = tokens
        self._order = order
        self._reject = reject
        self._deadline = deadline  # on time.monotonic(): the helper loop's clock
        self._task: asyncio.Task[None] | None = None
        self.abandoned = False
        self.done = threading.Event()
        self.ticket: RequestTicket | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        """On the helper loop: take a place in line; granted at once, done at once."""
        if self.abandoned:
            self.done.set()
            return
        ticket = RequestTicket(self._reject, self._tokens)
        try:
            self._core._enqueue_request(ticket, self._t, self._order, None)
        except BaseException as exc:  # refused: TupleSuspendedError, CoordinatorBusyError
            self.error = exc
            self.done.set()
            return
        if ticket.state == GRANTED:
            self.ticket = ticket  # (its checkpoint is never awaited: nothing to undo)
            self.done.set()
            return
        self._task = asyncio.get_running_loop().create_task(self._wait(ticket))

    async def _wait(self, ticket: RequestTicket) -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        expiry = None
        if self.abandoned:
            task.cancel()  # the parker's own clean-up runs at its first await
        elif self._deadline is not None:
            expiry = loop.call_at(self._deadline, self._expire, task)
        try:
            await ticket.wait(self._core, ticket, self._core._lock)
        except asyncio.CancelledError:
            if not self.abandoned:
                self.error = AdmissionTimeoutError()
        except BaseException as exc:  # failed while queued: the gate closed on a reject
            self.error = exc
        else:
            self.ticket = ticket
        finally:
            if expiry is not None:
                expiry.cancel()
            self.done.set()

    def _expire(self, task: asyncio.Task[None]) -> None:
        task.cancel()

    def abandon(self) -> None:
        """On the helper loop: the waiting thread left; give everything back."""
        self.abandoned = True
        task = self._task
        if task is not None:
            task.cancel()  # its clean-up sets ``done``
        else:
            # Started and done already, or never scheduled (the thread was interrupted
            # before its start was): a start scheduled earlier has run, callbacks are FIFO.
            self.done.set()


@final
class BlockingRequestContext:
    """What ``AgentCoordinator.request_sync`` returns: ``with`` it around one call."""

    __slots__ = ("_core", "_entered", "_order", "_reject", "_request", "_t", "_timeout", "_tokens")

    def __init__(
        self,
        core: CoordinatorCore,
        t: ModelTuple,
        tokens: int,
        order: int | None,
        reject: bool,
        timeout: float | None,
    ) -> None:
        self._core = core
        self._t = t
        self._tokens = tokens
        self._order = order
        self._reject = reject
        self._timeout = timeout
        self._entered = False
        self._request: ModelRequest | None = None

    def __enter__(self) -> ModelRequest:
        if self._entered:
            raise UsageError("a request_sync() context manager can be entered only once")
        if current_loop() is not None:
            raise UsageError(_IN_LOOP_MESSAGE)
        self._entered = True
        timeout = self._timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        outside, order = admit_blocking(  # a fleet's admission first (see admission)
            self._core, self._t, self._tokens, self._order, self._reject, deadline
        )
        try:
            ticket = self._admit(order, deadline)
        except BaseException:
            if outside is not None:
                outside.release(used=False)
            raise
        self._request = ModelRequest(self._core, ticket, outside)
        return self._request

    def _admit(self, order: int | None, deadline: float | None) -> RequestTicket:
        admission = _Admission(self._core, self._t, self._tokens, order, self._reject, deadline)
        loop = helper_loop()
        try:
            # Inside the ``try``: an interruption may land in ``call_soon_threadsafe`` itself,
            # after the start was scheduled (its wake-up write) or before.
            loop.call_soon_threadsafe(admission.start)
            admission.done.wait()
        except BaseException:
            # Interrupted (KeyboardInterrupt): the admission is given up, and whatever it
            # was granted meanwhile goes back before the interruption propagates.
            loop.call_soon_threadsafe(admission.abandon)
            admission.done.wait()
            if admission.ticket is not None:
                self._core._parker_undo(admission.ticket, True)
            raise
        if admission.error is not None:
            error, admission.error = admission.error, None
            raise error
        ticket = admission.ticket
        assert ticket is not None
        return ticket

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        request = self._request
        assert request is not None
        self._core._release(request._ticket)
        if request._outer is not None:
            request._outer.release(used=True)

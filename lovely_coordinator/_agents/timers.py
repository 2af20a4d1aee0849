"""The coordinator's clock and its one timer, which survive a change of event loop.

The scheduler keeps instants (timed reopens, budget wake-ups, bucket refills) on one
clock: the anyio clock of the coordinator's *home* loop, the event loop that last
adopted it. A process-global coordinator outlives event loops (one ``anyio.run`` after
another; trio's clock even starts at a random offset in every run), and may be used from
loops in several threads at once:

* Used from a new loop while the home loop has ended (the same thread runs a new loop,
  or the home loop stopped), the new loop adopts the coordinator: every stored instant is
  restated on its clock (``Scheduler.shift_time``; the time that remains is real time, so
  a trio ``MockClock`` does not carry over) and the timer is re-armed there.
* Used from a loop in another thread while the home loop still runs, the home loop
  stays home: that thread reads the home clock through ``time.monotonic()`` plus the
  home clock's offset from it (exact between asyncio loops, whose clocks *are*
  ``time.monotonic()``), and timers are armed on the home loop through its thread-safe
  entry.
* When the home loop ends with the timer pending (its shutdown reports the timer), a
  loop of another thread that has used the coordinator or parked a waiter on it adopts
  it at once, so its waiters never wait for a wake-up that died with its loop. The clock
  remembers the last few such loops (*guests*).
* A home loop may also end without saying so (closed without ``shutdown_asyncgens``, or
  left stopped: its timer's end is never seen), or its thread may block (user error, but
  not the other threads' waiters' fault). So while guests exist, a *backup* wake-up runs
  from a thread of the coordinator's own, ``BACKUP_DELAY`` after each instant: if the
  home timer has not applied what is due by then, the backup does (under the lock, as
  the home timer would; grants reach the waiters' loops through their thread-safe
  entries). ``BACKUP_DELAY`` is 0.05 s: far above how late a live loop's timer fires
  (its clock's resolution and one turn of the loop, a millisecond or so), so a healthy
  home loop is never raced, and small beside the waits it ends (refills and reopens of
  seconds): a waiter of a live loop is woken at most 0.05 s after its instant, whatever
  became of home.

:class:`WakeupTimer` is the single timer: armed at ``Scheduler.next_wakeup()`` on the
home loop, re-armed whenever that instant changes, and firing ``advance``;
:class:`Backup` is its thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, final

from .._base.backend import (
    Timer,
    call_at,
    call_soon_on,
    current_loop,
    current_time_or_none,
    loop_alive,
)

__all__ = ["BACKUP_DELAY", "Backup", "LoopClock", "WakeupTimer"]

# How long after an instant the backup applies what the home timer has not (see above).
BACKUP_DELAY: Final = 0.05


@final
class LoopClock:
    """The coordinator's time: its home loop's anyio clock (see the module docstring).

    Attributes:
        home: the home loop's identity, or None before any loop used the coordinator.
        offset: the home clock minus ``time.monotonic()``, as last measured on it.
    """

    __slots__ = ("_here", "_thread", "gone", "guests", "home", "offset")

    def __init__(self) -> None:
        self.home: object | None = None
        self.offset = 0.0
        self._thread: int | None = None
        # The last other loop whose clock was compared with home, and its offset from
        # time.monotonic(): measured once, so repeated reads restate times identically.
        self._here: tuple[object, float] | None = None
        self.gone = False  # the home loop shut down with a timer pending
        self.guests: dict[object, None] = {}  # loops of other threads that used it

    def now(self) -> float:
        """The home clock's current time, from whichever thread asks."""
        if self.home is not None and current_loop() is self.home:
            now = current_time_or_none()
            if now is not None:
                self.offset = now - time.monotonic()  # follows a clock that jumps (MockClock)
                return now
        return time.monotonic() + self.offset

    def here_minus_home(self) -> float:
        """How far the calling loop's clock is ahead of the home clock (0 on home)."""
        loop = current_loop()
        if self.home is None or loop is None or loop is self.home:
            return 0.0
        cached = self._here
        if cached is None or cached[0] is not loop:
            here = current_time_or_none()
            assert here is not None  # a loop is running
            cached = self._here = (loop, here - time.monotonic())
        return cached[1] - self.offset

    def on_home(self) -> bool:
        """Whether the caller runs on the home loop."""
        return self.home is not None and current_loop() is self.home

    def visit(self) -> None:
        """Remember the calling loop, if it is not home, as a guest (under the lock).

        Called by a waiter that parks, too: a loop that waits on the coordinator must
        take the timer over when home ends, even if no wake-up existed when it came.
        """
        loop = current_loop()
        if loop is None or loop is self.home:
            return
        guests = self.guests
        guests.pop(loop, None)
        guests[loop] = None
        if len(guests) > 8:
            del guests[next(iter(guests))]

    def follow(self) -> float | None:
        """Adopt the calling loop as home if the home loop is gone (or there is none).

        Returns:
            How far ahead the new clock is of the old one (for ``shift_time``), or None
            when nothing changed.
        """
        loop = current_loop()
        home = self.home
        if loop is None or loop is home:
            return None
        if home is not None:
            same_thread = self._thread == threading.get_ident()
            if not same_thread and not self.gone and loop_alive(home):
                self.visit()
                return None  # the home loop runs on in its thread: it stays home
        now = current_time_or_none()
        assert now is not None  # a loop is running
        offset = now - time.monotonic()
        delta = 0.0 if home is None else offset - self.offset
        self.home, self.offset, self._thread = loop, offset, threading.get_ident()
        self.gone = False
        self.guests.pop(loop, None)
        return delta


@final
class WakeupTimer:
    """One timer at the scheduler's next wake-up, on the home loop.

    Args:
        clock: the coordinator's clock (which says where home is).
        fire: called on the home loop when the timer is due (it advances the scheduler).
        lock: the coordinator's lock, held around every arming decision.
    """

    __slots__ = ("_adopt", "_backup", "_clock", "_fire", "_handle", "_lock", "_loop", "armed_at")

    def __init__(
        self,
        clock: LoopClock,
        fire: Callable[[], None],
        lock: threading.RLock,
        adopt: Callable[[], None] = lambda: None,
    ) -> None:
        self._clock = clock
        self._fire = fire
        self._adopt = adopt
        self._lock = lock
        self._handle: Timer | None = None
        self._loop: object | None = None
        self.armed_at: float | None = None
        self._backup = Backup(fire, lock)

    def rearm(self, instant: float | None) -> None:
        """Make ``instant`` (on the home clock; None: none) the armed time. Under the lock."""
        clock = self._clock
        if instant is None or not clock.guests:
            self._backup.set(None)
        else:  # waiters of other threads may depend on it: the backup (module docstring)
            self._backup.set(time.monotonic() + (instant - clock.now()) + BACKUP_DELAY)
        home = clock.home
        if instant == self.armed_at and self._loop is home:
            return
        self._cancel()
        if instant is None or home is None:
            return  # with no home yet, the first loop to adopt the coordinator arms it
        self.armed_at = instant
        self._loop = home
        if self._clock.on_home():
            self._handle = call_at(instant, self._due, self._lost)
        elif not call_soon_on(home, self._arm_on_home):
            self.armed_at = self._loop = None  # the home loop ended: the next one arms

    def _arm_on_home(self) -> None:
        # Asked from another thread; runs on the home loop. Arm for whatever is armed by
        # now (later changes may have moved it; they asked again if so).
        with self._lock:
            if self._loop is not current_loop() or self._handle is not None:
                return
            if self.armed_at is not None:
                self._handle = call_at(self.armed_at, self._due, self._lost)

    def _cancel(self) -> None:
        handle, loop = self._handle, self._loop
        self._handle = self._loop = self.armed_at = None
        if handle is None:
            return
        if loop is current_loop():
            handle.cancel()
        else:
            call_soon_on(loop, handle.cancel)  # a timer is cancelled on its own loop

    def _lost(self) -> None:
        # The home loop shuts down with this timer pending: a loop of another thread
        # that uses the coordinator adopts it (and the timer), or the next one to come.
        with self._lock:
            self._handle = self._loop = self.armed_at = None
            self._clock.gone = True
            for guest in list(self._clock.guests):
                if loop_alive(guest) and call_soon_on(guest, self._adopt):
                    return

    def _due(self) -> None:
        with self._lock:
            self._handle = self._loop = self.armed_at = None
            self._fire()


@final
class Backup:
    """The backup wake-up: a daemon thread that calls ``fire`` (under ``lock``) at a
    ``time.monotonic()`` deadline, if one is set; it exists only while one is.

    ``fire`` applies what is due and nothing else, so a backup that finds the home timer
    already did is a no-op.
    """

    __slots__ = ("_deadline", "_fire", "_lock", "_thread", "_wake")

    def __init__(self, fire: Callable[[], None], lock: threading.RLock) -> None:
        self._fire = fire
        self._lock = lock
        self._wake = threading.Condition(lock)
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None

    def set(self, deadline: float | None) -> None:
        """Fire at ``deadline`` (None: never). Under the lock."""
        if deadline == self._deadline:
            return
        self._deadline = deadline
        if deadline is None:
            self._wake.notify()  # the thread ends
        elif self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="lovely_coordinator backup wake-up", daemon=True
            )
            self._thread.start()
        else:
            self._wake.notify()

    def _run(self) -> None:
        with self._lock:
            while self._deadline is not None:
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                self._deadline = None
                self._fire()  # may set the next deadline
            self._thread = None

"""Every public exception of the library, in one tree.

Every exception the library raises on purpose derives from :class:`CoordinatorError`, so
one ``except CoordinatorError`` catches all of them. A class also derives from the builtin
whose meaning it shares::

    CoordinatorError (Exception)
    ├── InvalidArgumentError (ValueError)      a bad argument; nothing was changed
    │   ├── InvalidArgumentTypeError (TypeError)   ... of the wrong type
    │   └── LanesConfigInvalid                 an invalid lanes setting
    │       └── LanesConfigTypeError (also InvalidArgumentTypeError)
    │                                          ... of the wrong type (a non-callable)
    ├── UsageError (RuntimeError)              the API was used in a way it cannot be
    ├── CoordinatorBusyError                   max_queued waiters already wait
    ├── AdmissionTimeoutError (TimeoutError)   request_sync(): not admitted within its timeout
    ├── TupleSuspendedError                    the provider/model gate is closed
    ├── ReservationCancelledError              the reservation was cancelled
    ├── ReservationUsedError (RuntimeError)    run() called twice on one reservation
    ├── PermitReleasedError                    released while waiting to reacquire
    ├── IncompatibleCoordinatorError (RuntimeError)
    │                                          an incompatible copy of the library made
    │                                          the process-global coordinator
    ├── LaneQueueFull                          lanes: wake() found max_queued lanes waiting
    ├── LanesClosed                            lanes: wake() after close()
    ├── QueueFullError                         turns: the conversation's queue is full
    ├── DrainingError                          turns: submit after drain(), or refused by it
    ├── CoordinationUnavailableError           turns: the locker could not grant a lease
    ├── ConversationBusyError                  turns: multitask="reject" on a busy conversation
    ├── TurnInterrupted                        turns: cancelled by an interrupt or shutdown
    ├── TurnDropped                            turns: run(): dropped before it started
    ├── LeaseLostError                         turns: the lease was lost while running
    ├── StaleFenceError                        redis: a write under a superseded fence
    └── UnsupportedServerError                 redis: the server is too old

Cancellation is never wrapped: it is the backend's own exception, always.

Shared by every copy of the library
-----------------------------------
A process may hold two copies of this package (a vendored one, a reloaded one). They share
the process-global coordinator, so an error raised by one copy's code must be caught by the
other copy's ``except CoordinatorError``. The classes are therefore published once per
process on a sentinel module in ``sys.modules`` (like the coordinator itself, see
``_agents/process_global.py``), and a later copy of the *same* :data:`ERRORS_VERSION`
adopts the published classes instead of its own (the rebinding at the end of this module).
A copy of another version keeps its own classes: their constructors may differ, so sharing
them could break the code that raises them.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Final

__all__ = [
    "ERRORS_VERSION",
    "AdmissionTimeoutError",
    "ConversationBusyError",
    "CoordinationUnavailableError",
    "CoordinatorBusyError",
    "CoordinatorError",
    "DrainingError",
    "IncompatibleCoordinatorError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "LaneQueueFull",
    "LanesClosed",
    "LanesConfigInvalid",
    "LanesConfigTypeError",
    "LeaseLostError",
    "PermitReleasedError",
    "QueueFullError",
    "ReservationCancelledError",
    "ReservationUsedError",
    "StaleFenceError",
    "TupleSuspendedError",
    "TurnDropped",
    "TurnInterrupted",
    "UnsupportedServerError",
    "UsageError",
]

ERRORS_VERSION: Final = 4
"""The shape of this tree (names, bases, constructors). Bumped whenever any of it changes."""

SENTINEL_KEY: Final = "__lovely_coordinator_process_global_errors__"


class CoordinatorError(Exception):
    """Base class of every exception the library raises on purpose."""


class InvalidArgumentError(CoordinatorError, ValueError):
    """An argument was out of range or malformed. The call changed nothing.

    Attributes:
        errors: for an invalid configuration, pydantic's structured details
            (``ValidationError.errors()``); otherwise empty.
    """

    def __init__(self, message: str, *, errors: list[Any] | None = None) -> None:
        super().__init__(message)
        self.errors: list[Any] = list(errors or ())


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument had the wrong type (for example ``True`` where an ``int`` is required).

    It is still an :class:`InvalidArgumentError`, so callers that catch that (or
    ``ValueError``) see it too; ``except TypeError`` also works.
    """


class LanesConfigInvalid(InvalidArgumentError):
    """The lanes' configuration is invalid; nothing was created.

    ``errors`` carries pydantic's structured details when they exist. A lanes argument of
    the wrong type (a non-callable ``activate``) raises a subclass that is also an
    :class:`InvalidArgumentTypeError`.
    """


class LanesConfigTypeError(LanesConfigInvalid, InvalidArgumentTypeError):
    """A lanes argument had the wrong type: ``activate`` or ``on_exit`` is not callable.

    Both a :class:`LanesConfigInvalid` and an :class:`InvalidArgumentTypeError` (so also a
    ``TypeError``); nothing was created.
    """


class UsageError(CoordinatorError, RuntimeError):
    """The API was used in a way that cannot work, where no more precise error is named.

    Entering a single-use context manager twice, submitting to a ``TurnRegistry`` or
    waking lanes before entering them (or from a thread other than their event loop's), a
    turn waiting on its own conversation, using a coordinator from a thread it cannot
    serve. The message says what and why.
    """


class CoordinatorBusyError(CoordinatorError):
    """``max_queued`` waiters already wait; the request took no place and no order."""

    def __init__(self, message: str = "too many requests are already waiting for a permit") -> None:
        super().__init__(message)


class AdmissionTimeoutError(CoordinatorError, TimeoutError):
    """A blocking request (``request_sync``) was not admitted within its timeout; it
    holds nothing and drew nothing."""

    def __init__(self, message: str = "the request was not admitted within its timeout") -> None:
        super().__init__(message)


class TupleSuspendedError(CoordinatorError):
    """The work's ``(provider, model)`` gate is closed and the caller chose not to wait."""


class ReservationCancelledError(CoordinatorError):
    """The reservation was cancelled before its work could run."""


class ReservationUsedError(CoordinatorError, RuntimeError):
    """:meth:`AgentReservation.run` was called a second time."""


class PermitReleasedError(CoordinatorError):
    """The permit was released while a lend was waiting to take its slot back."""


class IncompatibleCoordinatorError(CoordinatorError, RuntimeError):
    """The process-global sentinel was written by an incompatible copy of the library."""


# -- lanes -----------------------------------------------------------------------------------


class LaneQueueFull(CoordinatorError):
    """``wake`` found an idle lane and ``max_queued`` lanes already waiting. Nothing changed.

    Attributes:
        key: the lane that could not be queued.
        max_queued: the configured bound on waiting lanes.
    """

    def __init__(self, key: str, max_queued: int) -> None:
        super().__init__(f"Lane queue is full ({max_queued} waiting); cannot queue lane {key!r}")
        self.key = key
        self.max_queued = max_queued

    def __reduce__(self) -> tuple[type[LaneQueueFull], tuple[str, int]]:
        return type(self), (self.key, self.max_queued)


class LanesClosed(CoordinatorError):
    """``wake`` was called after the lanes were closed. Nothing changed.

    Attributes:
        key: the lane that was woken.
    """

    def __init__(self, key: str) -> None:
        super().__init__(f"Lanes are closed; cannot wake lane {key!r}")
        self.key = key

    def __reduce__(self) -> tuple[type[LanesClosed], tuple[str]]:
        return type(self), (self.key,)


# -- turns -----------------------------------------------------------------------------------
# Each has a fixed default message (the first four are the contract's exact messages); the
# message stays an argument so the exceptions pickle and copy like any other.


class QueueFullError(CoordinatorError):
    """Too many turns already wait for this conversation; the submission changed nothing."""

    def __init__(
        self, message: str = "too many turns are already queued for this conversation"
    ) -> None:
        super().__init__(message)


class DrainingError(CoordinatorError):
    """The registry is shutting down; the caller should retry on another server."""

    def __init__(self, message: str = "this server is shutting down; retry the turn") -> None:
        super().__init__(message)


class CoordinationUnavailableError(CoordinatorError):
    """The locker failed to grant the conversation's lease, so the turn did not run."""

    def __init__(
        self,
        message: str = (
            "this conversation could not be locked across server replicas; retry the turn shortly"
        ),
    ) -> None:
        super().__init__(message)


class ConversationBusyError(CoordinatorError):
    """``multitask="reject"`` while a turn runs or waits; the submission changed nothing."""

    def __init__(
        self, message: str = "a turn is already running or queued for this conversation"
    ) -> None:
        super().__init__(message)


class TurnInterrupted(CoordinatorError):
    """The turn was stopped before it finished, by a newer turn or by shutdown."""

    def __init__(self, message: str = "the turn was interrupted before it finished") -> None:
        super().__init__(message)


class TurnDropped(CoordinatorError):
    """The job was dropped before its turn started; it never ran."""

    def __init__(self, message: str = "the turn was dropped before it started") -> None:
        super().__init__(message)


class LeaseLostError(CoordinatorError):
    """The conversation's lease was lost while the turn ran, so the turn was stopped."""

    def __init__(
        self, message: str = "the conversation's lease was lost while the turn was running"
    ) -> None:
        super().__init__(message)


# -- redis -----------------------------------------------------------------------------------


class StaleFenceError(CoordinatorError):
    """A write (or a fenced read) carried a fence lower than one the store already accepted.

    Its holder lost the lease and somebody newer has claimed the store since; nothing was
    applied.

    Attributes:
        fence: the refused fence.
        high_water: the highest fence accepted so far.
    """

    def __init__(self, fence: int, high_water: int) -> None:
        super().__init__(f"fence {fence} is stale: the store already accepted fence {high_water}")
        self.fence = fence
        self.high_water = high_water

    def __reduce__(self) -> tuple[type[StaleFenceError], tuple[int, int]]:
        return type(self), (self.fence, self.high_water)


class UnsupportedServerError(CoordinatorError):
    """The Redis server is older than the oldest version the scripts support.

    Raised at the first use of a client, before anything is written. The message names the
    version found.

    Attributes:
        server: ``"Redis"``, ``"Valkey"``, or the name the server reports itself by.
        version: the version it reports.
    """

    def __init__(self, server: str, version: str) -> None:
        super().__init__(
            f"{server} {version} is not supported: lovely_coordinator.redis needs "
            "Redis >= 7.0 or Valkey >= 7.2"
        )
        self.server = server
        self.version = version

    def __reduce__(self) -> tuple[type[UnsupportedServerError], tuple[str, str]]:
        return type(self), (self.server, self.version)


# -- one set of classes per process ----------------------------------------------------------


def _share_classes() -> None:
    """Publish this copy's classes, or adopt those another copy of this version published."""
    mine = {name: globals()[name] for name in __all__ if name != "ERRORS_VERSION"}
    sentinel = sys.modules.get(SENTINEL_KEY)
    if sentinel is None:
        fresh = types.ModuleType(SENTINEL_KEY, "The exception classes of lovely-coordinator.")
        fresh.ERRORS_VERSION = ERRORS_VERSION  # type: ignore[attr-defined]
        fresh.classes = mine  # type: ignore[attr-defined]
        sentinel = sys.modules.setdefault(SENTINEL_KEY, fresh)  # atomic: one copy wins
    if getattr(sentinel, "ERRORS_VERSION", None) != ERRORS_VERSION:
        return  # another version's tree: keep ours (see the module docstring)
    published = getattr(sentinel, "classes", None)
    if not isinstance(published, dict) or set(published) != set(mine):
        return
    if not all(isinstance(cls, type) and issubclass(cls, Exception) for cls in published.values()):
        return
    # Rebinding the module's names is what makes ``from ._errors import X`` (which runs
    # after this module finished importing) hand every other module the shared class.
    globals().update(published)


_share_classes()

"""The exceptions of the agent coordinator.

Every public exception of the library derives from :class:`CoordinatorError`, so one
``except CoordinatorError`` catches anything the library raises on purpose. The tree is
kept flat; a class also derives from the builtin whose meaning it shares::

    CoordinatorError (Exception)
    ├── InvalidArgumentError (ValueError)   a bad argument; nothing was changed
    │   └── InvalidArgumentTypeError (TypeError)   ... of the wrong type
    ├── TupleSuspendedError                 the provider/model gate is closed
    ├── ReservationCancelledError           the reservation was cancelled
    ├── ReservationUsedError (RuntimeError) run() called twice on one reservation
    ├── PermitReleasedError                 released while waiting to reacquire
    └── IncompatibleCoordinatorError (RuntimeError)
                                            another copy of the library left an
                                            incompatible process-global sentinel

Cancellation is never wrapped: it is the backend's own exception, always.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CoordinatorError",
    "IncompatibleCoordinatorError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "PermitReleasedError",
    "ReservationCancelledError",
    "ReservationUsedError",
    "TupleSuspendedError",
]


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

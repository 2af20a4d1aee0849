"""The exceptions of the turn queues (CONTRACT §3).

All of them derive from :class:`~lovely_coordinator.CoordinatorError`::

    CoordinatorError
    ├── QueueFullError                 submit: the conversation's queue is at max_queued
    ├── DrainingError                  submit after drain(), or a turn refused by it
    ├── CoordinationUnavailableError   a turn refused: the locker could not grant a lease
    ├── ConversationBusyError          submit with multitask="reject" on a busy conversation
    ├── TurnInterrupted                a turn cancelled by multitask="interrupt" or shutdown
    ├── TurnDropped                    run(): the job was dropped before it started
    └── LeaseLostError                 a turn cancelled because its lease was lost

Each has a fixed default message (the first four are the contract's exact messages); the
message stays an argument so the exceptions pickle and copy like any other.
"""

from __future__ import annotations

from ._errors import CoordinatorError

__all__ = [
    "ConversationBusyError",
    "CoordinationUnavailableError",
    "DrainingError",
    "LeaseLostError",
    "QueueFullError",
    "TurnDropped",
    "TurnInterrupted",
]


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
    """The turn was cancelled before it finished, by a newer turn or by shutdown."""

    def __init__(self, message: str = "the turn was interrupted before it finished") -> None:
        super().__init__(message)


class TurnDropped(CoordinatorError):
    """The job was dropped before its turn started; it never ran."""

    def __init__(self, message: str = "the turn was dropped before it started") -> None:
        super().__init__(message)


class LeaseLostError(CoordinatorError):
    """The conversation's lease was lost while the turn ran, so the turn was cancelled."""

    def __init__(
        self, message: str = "the conversation's lease was lost while the turn was running"
    ) -> None:
        super().__init__(message)

"""One activation per key under a global concurrency cap (CONTRACT §2).

A *key* (a room, a mailbox, a resident agent) is woken whenever it has new input; its
``activate(key)`` then runs once more, never twice at the same time, while
``max_concurrent`` bounds how many keys run at once and ``max_queued`` bounds how many
wait. Every activation is reported once to ``on_exit``, with an :data:`Exit`: one of
``ActivationSucceeded``, ``ActivationFailed`` or ``ActivationInterrupted``::

    def report(outcome: Exit) -> None:
        if isinstance(outcome, ActivationFailed):
            log.warning("%s failed", outcome.key, exc_info=outcome.cause)

Exceptions::

    CoordinatorError
    ├── InvalidArgumentError (ValueError)
    │   └── LanesConfigInvalid        an invalid setting; nothing was created (a TypeError
    │                                 too when activate/on_exit is not callable)
    ├── UsageError (RuntimeError)     a create_lanes() context manager entered twice, or
    │                                 wake() from a thread other than the event loop's
    ├── LaneQueueFull                 wake(): max_queued lanes already wait
    └── LanesClosed                   wake() after close()

Whatever an activation or ``on_exit`` raises is contained: reported as
``ActivationFailed`` or logged, never raised into the lanes or the block (only
``KeyboardInterrupt`` and ``SystemExit`` propagate, after being reported).
"""

from ._base.errors import LaneQueueFull as LaneQueueFull
from ._base.errors import LanesClosed as LanesClosed
from ._base.errors import LanesConfigInvalid as LanesConfigInvalid
from ._lanes.runner import Lanes as Lanes
from ._lanes.runner import create_lanes as create_lanes
from ._lanes.state import LaneSnapshot as LaneSnapshot
from ._lanes.state import LanesStatus as LanesStatus
from ._lanes.types import Activation as Activation
from ._lanes.types import ActivationFailed as ActivationFailed
from ._lanes.types import ActivationInterrupted as ActivationInterrupted
from ._lanes.types import ActivationSucceeded as ActivationSucceeded
from ._lanes.types import Exit as Exit
from ._lanes.types import LanesConfig as LanesConfig
from ._lanes.types import current_activation as current_activation

__all__ = [
    "Activation",
    "ActivationFailed",
    "ActivationInterrupted",
    "ActivationSucceeded",
    "Exit",
    "LaneQueueFull",
    "LaneSnapshot",
    "Lanes",
    "LanesClosed",
    "LanesConfig",
    "LanesConfigInvalid",
    "LanesStatus",
    "create_lanes",
    "current_activation",
]

"""The lanes' configuration and the outcomes ``on_exit`` receives (CONTRACT §2).

Plain values, apart from the runner in :mod:`._lanes`: a frozen, validated
:class:`LanesConfig` (errors are :class:`LanesConfigInvalid`, never bare pydantic ones),
the three frozen outcome records, whose union is :data:`Exit`, and the
:class:`Activation` an activation sees of itself through :func:`current_activation`.
"""

from __future__ import annotations

import contextvars
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, ClassVar, Final, final

from .._base.config import NonNegativeIndex, PositiveIndex, PositiveSeconds, ValidatedConfig
from .._base.errors import InvalidArgumentError, LanesConfigInvalid
from .state import StopReason

__all__ = [
    "Activation",
    "ActivationFailed",
    "ActivationInterrupted",
    "ActivationSucceeded",
    "Exit",
    "LanesConfig",
    "current_activation",
    "current_activation_var",
]


class LanesConfig(ValidatedConfig):
    """How lanes admit work. Frozen and validated on construction.

    Attributes:
        max_concurrent: activations running at once across all keys (an int ≥ 1).
        max_queued: lanes that may wait for a slot (an int ≥ 0), or None for no bound;
            without a bound the queue still holds at most one entry per key.
        turn_timeout: seconds an activation may run before it is interrupted (finite,
            > 0), counted from the activation's own start, or None for no limit.

    Raises:
        LanesConfigInvalid: any field is invalid, whichever pydantic entry point
            validated it (never a bare pydantic error).
    """

    _error_class: ClassVar[type[InvalidArgumentError]] = LanesConfigInvalid
    _label: ClassVar[str] = "lanes config"

    max_concurrent: PositiveIndex
    max_queued: NonNegativeIndex | None = None
    turn_timeout: PositiveSeconds | None = None

    def __init__(self, **data: Any) -> None:
        # Declared here (not only on the base) so type checkers take ``**data`` as the
        # signature rather than one synthesized from the fields: wrong values are ours
        # to refuse at run time.
        super().__init__(**data)


@final
@dataclass(frozen=True, slots=True)
class ActivationSucceeded:
    """The activation's body returned (and its finalizers did not raise)."""

    key: str


@final
@dataclass(frozen=True, slots=True)
class ActivationFailed:
    """The body raised ``cause`` by itself, or a finalizer raised ``cause``.

    A finalizer's error replaces the body's outcome, whatever that was.
    """

    key: str
    cause: BaseException


@final
@dataclass(frozen=True, slots=True)
class ActivationInterrupted:
    """The lanes stopped the body while it ran, or before ``activate`` was called.

    A stop that lands while the body runs decides the outcome, however the body then
    ends (a plain ``try/finally`` in the body is part of the body). ``reason`` is the
    first stop: ``"cancel"``, ``"close"`` or ``"timeout"``.
    """

    key: str
    reason: StopReason


@final
@dataclass(frozen=True, slots=True)
class Activation:
    """The running activation, as seen from inside it (:func:`current_activation`).

    Attributes:
        key: the lane.
        started_at: ``anyio.current_time()`` when the activation started; the turn
            timeout counts from here.
        exit_stack: finalizers pushed here run after the body, shielded from stops. A
            stop landing while they run keeps the body's own outcome; a finalizer that
            raises makes the outcome ``ActivationFailed`` with only that error.
    """

    key: str
    started_at: float
    exit_stack: AsyncExitStack


current_activation_var: Final = contextvars.ContextVar[Activation | None](
    "lovely_coordinator.lanes.current_activation", default=None
)


def current_activation() -> Activation | None:
    """The activation whose body (or a task started in it) is running, else None."""
    return current_activation_var.get()


Exit = ActivationSucceeded | ActivationFailed | ActivationInterrupted
"""How an activation ended, as ``on_exit`` receives it (annotate ``on_exit`` with it)."""

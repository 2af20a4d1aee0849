"""What a cross-replica lock must offer the turn queues, and their fixed numbers.

The protocols are structural: :class:`~lovely_coordinator.redis.RedisLocker` implements
:class:`Locker` without importing it, and so can any other lock service. Nothing here
runs; the registry (:mod:`.queues`) and the jobs (:mod:`.job`) use these shapes.
"""

from __future__ import annotations

from typing import Final, Protocol

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "RELEASE_TIMEOUT",
    "Lease",
    "LeaseSignal",
    "Locker",
]

DEFAULT_MAX_QUEUED: Final = 10
"""How many turns may wait behind the running one in a conversation, by default."""

RELEASE_TIMEOUT: Final = 30.0
"""Seconds a lease's release may take before it is abandoned (and left to lapse)."""


class LeaseSignal(Protocol):
    """What :attr:`Lease.lost` must offer; :class:`anyio.Event` is one."""

    def is_set(self) -> bool: ...

    async def wait(self) -> object: ...


class Lease(Protocol):
    """A held cross-replica lock on one conversation."""

    @property
    def fence(self) -> int:
        """The fencing token of this grant; strictly increases per conversation."""
        ...

    @property
    def lost(self) -> LeaseSignal:
        """Set once the lease can no longer be shown to be held; the turn is then cancelled."""
        ...

    async def release(self) -> None:
        """Give the lease up; idempotent."""
        ...


class Locker(Protocol):
    """Serializes a conversation's turns across server replicas (one lease per turn)."""

    async def acquire(self, conversation_id: str) -> Lease:
        """Wait (cancellably) until this replica holds the conversation's lease.

        An exception means the lease could not be had; the turn is then refused with
        :class:`~lovely_coordinator.turns.CoordinationUnavailableError`.
        """
        ...

"""Turns under a cross-replica lease: acquire, watch for loss, run, release.

The locker and its leases are user code as much as the turn is, and whatever they raise
is contained the same way: an acquisition that fails (or returns None) refuses the turn
with :class:`CoordinationUnavailableError` (with the failure as its cause), a lease granted
after its acquisition was cancelled (by ``drain()`` or a stop) is given back unused, a
release that fails or hangs is logged and abandoned (the lease lapses by itself), and a
lease that cannot be read or watched counts as lost. Only ``KeyboardInterrupt`` and
``SystemExit`` propagate.
"""

from __future__ import annotations

import logging
from typing import Any, final

import anyio
from anyio.abc import TaskGroup

from .._base.errors import (
    CoordinationUnavailableError,
    CoordinatorError,
    DrainingError,
    LeaseLostError,
    UsageError,
)
from .._base.outcomes import failures_of, is_fatal
from . import types as _turns_types
from .job import Job
from .types import Lease, Locker

__all__ = ["LeasedTurns"]

_log = logging.getLogger("lovely_coordinator.turns")


@final
class LeasedTurns:
    """Takes a registry's turns under the leases of one :class:`Locker`."""

    __slots__ = ("_acquiring", "_locker")

    def __init__(self, locker: Locker) -> None:
        self._locker = locker
        # The cancel scopes of the acquisitions in progress, which drain() cancels.
        self._acquiring: dict[Job[Any], anyio.CancelScope] = {}

    def __len__(self) -> int:
        """How many lease acquisitions are in progress."""
        return len(self._acquiring)

    def cancel_acquisitions(self) -> None:
        """Cancel every acquisition in progress; their turns are refused (draining)."""
        for scope in self._acquiring.values():
            scope.cancel()

    async def take(self, conversation_id: str, job: Job[Any], draining: bool) -> None:
        """Take ``job``'s turn under a lease, inside the job's own cancel scope."""
        if draining:
            job._refuse(DrainingError())
            return
        lease = await self._acquire(conversation_id, job)
        if lease is None:  # refused or stopped: the outcome is recorded
            return
        try:
            try:
                fence = lease.fence
                lost = lease.lost.is_set()
            except BaseException as exc:
                if is_fatal(exc):
                    raise
                _log.error(
                    "the lease of conversation %r cannot be read", conversation_id, exc_info=exc
                )
                lost = True
            if lost:
                job._lose_lease()
                return
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(_cancel_on_loss, lease, job, task_group, conversation_id)
                await job._call(fence, conversation_id)
                task_group.cancel_scope.cancel()
        finally:
            await _release(lease, conversation_id)

    async def _acquire(self, conversation_id: str, job: Job[Any]) -> Lease | None:
        """The conversation's lease, or None when the turn was refused or stopped."""
        refusal: CoordinatorError
        lease: Lease | None = None
        with anyio.CancelScope() as acquiring:
            self._acquiring[job] = acquiring
            try:
                lease = await self._locker.acquire(conversation_id)
                if lease is None:  # a locker's "no" must not pass for a lease
                    raise TypeError("the locker's acquire() returned None instead of a lease")
            except BaseException as exc:
                if is_fatal(exc):
                    raise
                if job._stopped:  # interrupted, or the registry's block was left
                    job._end_stopped()
                    return None
                if acquiring.cancel_called:
                    refusal = DrainingError()  # drain() cancelled the acquisition
                elif isinstance(exc, UsageError):
                    refusal = exc  # a misuse (the locker on the wrong loop): retrying won't help
                else:
                    refusal = CoordinationUnavailableError()
                    refusal.__cause__ = exc
                    _log.warning(
                        "could not lock conversation %r for a turn", conversation_id, exc_info=exc
                    )
            finally:
                del self._acquiring[job]
                if not self._acquiring:
                    self._acquiring = {}  # give a burst's dict capacity back
        if lease is not None:
            if not (job._stopped or acquiring.cancel_called):
                return lease
            # A locker that caught the cancellation of its acquisition and granted anyway:
            # the stop (or the drain) still decides, so the body never runs, and the lease
            # goes straight back.
            await _release(lease, conversation_id)
            if job._stopped:
                job._end_stopped()
                return None
            refusal = DrainingError()
        job._refuse(refusal)
        return None


async def _cancel_on_loss(
    lease: Lease, job: Job[Any], watching: TaskGroup, conversation_id: str
) -> None:
    try:
        await lease.lost.wait()
    except BaseException as exc:
        if is_fatal(exc) or (
            failures_of(exc) is None and (watching.cancel_scope.cancel_called or job._stopped)
        ):
            raise  # the watcher's own cancellation: the turn is over, or stopped
        # The lease can no longer be shown to be held: stop the turn as if it was lost.
        _log.error("watching the lease of conversation %r failed", conversation_id, exc_info=exc)
    job._interrupt(LeaseLostError())


async def _release(lease: Lease, conversation_id: str) -> None:
    # Shielded, so a cancelled turn still gives its lease back; bounded, so a locker that
    # hangs cannot wedge the conversation (an unreleased lease lapses by itself).
    timeout = _turns_types.RELEASE_TIMEOUT
    with anyio.move_on_after(timeout, shield=True) as bound:
        try:
            await lease.release()
        except BaseException as exc:
            if is_fatal(exc):
                raise
            # Shielded, so the only cancellation that can land here is the bound's own.
            if not bound.cancel_called:
                _log.error(
                    "releasing the lease of conversation %r failed", conversation_id, exc_info=exc
                )
    if bound.cancel_called:
        _log.warning(
            "releasing the lease of conversation %r took over %s s; abandoned",
            conversation_id,
            timeout,
        )

"""``min_replicas``: a grant, and each renewal, counts only once enough replicas have it
(locker, pool and fleet).

Replication is asynchronous: a grant acknowledged by the primary alone is lost if the
primary fails before a replica has it, and the promoted replica then grants the lease
again (after its quiet period, see generation.py) while the first holder may still run.
With ``min_replicas=n`` every granting call and every renewal is followed by ``WAIT n
timeout`` on the same connection (``evalsha.Script.confirmed``):

* a grant that fewer than ``n`` replicas acknowledged in time is given back (a permit
  keeps its place in line), and the caller keeps waiting as for a refusal, re-trying
  within ``min(ttl / 3, 1 s)``: while the replicas lag or are gone, nothing is granted;
* a renewal that fewer than ``n`` acknowledged counts as failed (``UnconfirmedError``):
  the watchdog retries until the grant's local deadline, then sets ``lost``.

So a failover to any replica that acknowledged loses no grant that its holder believes it
has. The cost is one replication round trip per grant and renewal (``bench redis``
measures it); ``WAIT`` is bounded by ``min(ttl / 3, 1 s)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, final

from . import scripts
from .evalsha import Arg, Script, UnconfirmedError
from .log import log
from .renewal import best_effort

__all__ = ["Confirmation"]


@final
class Confirmation:
    """How one locker or pool confirms its grants: not at all (``replicas == 0``) or
    with ``WAIT replicas``."""

    __slots__ = ("replicas", "timeout_ms", "ttl")

    def __init__(self, replicas: int, ttl: float) -> None:
        self.replicas = replicas
        self.ttl = ttl
        self.timeout_ms = max(1, round(min(ttl / 3, 1.0) * 1000))

    async def grant(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        *,
        give_back: Callable[[Sequence[Any]], Awaitable[object]],
        what: str,
        refusal: Callable[[Sequence[Any]], list[Any]] | None = None,
    ) -> Any:
        """One granting call; an unconfirmed grant is given back and reported as a
        refusal (``{WAITING, -1, ticket}``, or what ``refusal`` makes of the grant)."""
        if not self.replicas:
            return await script(keys, args)
        reply, acknowledged = await script.confirmed(keys, args, self.replicas, self.timeout_ms)
        if int(reply[0]) != scripts.GRANTED or acknowledged >= self.replicas:
            return reply
        log.warning(
            "%s was granted, but only %d of the %d replicas required acknowledged it; "
            "given back, and waiting",
            what,
            acknowledged,
            self.replicas,
        )
        await best_effort(lambda: give_back(reply), self.ttl, f"giving back {what}")
        if refusal is not None:
            return refusal(reply)
        ticket = int(reply[2]) if len(reply) > 2 else 0
        return [scripts.WAITING, -1, ticket]

    async def call(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """One call whose writes must be confirmed (a fleet member's heartbeat).

        Raises:
            UnconfirmedError: fewer replicas acknowledged its writes.
        """
        if not self.replicas:
            return await script(keys, args)
        reply, acknowledged = await script.confirmed(keys, args, self.replicas, self.timeout_ms)
        if acknowledged < self.replicas:
            raise UnconfirmedError(
                f"{acknowledged} of the {self.replicas} replicas required acknowledged it"
            )
        return reply

    async def renewal(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> bool:
        """One renewal: whether the grant is still held, confirmed by enough replicas.

        Raises:
            UnconfirmedError: it is held, but fewer replicas acknowledged the renewal.
        """
        if not self.replicas:
            return bool(await script(keys, args))
        held, acknowledged = await script.confirmed(keys, args, self.replicas, self.timeout_ms)
        if held and acknowledged < self.replicas:
            raise UnconfirmedError(
                f"{acknowledged} of the {self.replicas} replicas required acknowledged it"
            )
        return bool(held)

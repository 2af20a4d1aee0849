"""One pub/sub channel, listened to by a background task while anyone needs it.

Pub/sub is at-most-once: a message published while the subscriber connection is down is
lost. Every user of this class therefore treats a message as a *hint* to re-read the
authoritative state, and ``on_reset`` (called after every (re)subscription that follows a
gap) asks them to re-read everything. redis-py's asyncio ``PubSub`` may reconnect and
resubscribe on its own; the server then confirms the subscription again, and that second
confirmation is how a gap is noticed whoever repaired the connection.

A channel is classic (``SUBSCRIBE``) or sharded (``SSUBSCRIBE``, for channels that follow
an object's slot, see ``cluster.py``). On a Cluster the subscription is made on the node
that serves the channel's slot, found again after every error; a sharded subscription
that the server ends (its slot moved) is an error like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, final

import anyio
import redis.asyncio
from redis.exceptions import RedisError

from . import cancellation
from .cluster import Client, node_client
from .log import describe, log

__all__ = ["Subscriber", "Watch", "text"]


_RETRY_DELAYS: Final = (0.05, 0.1, 0.2, 0.5, 1.0)  # then 1 s forever


def text(value: bytes | str) -> str:
    """A reply value as ``str``, whether or not the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else value


@final
class Watch:
    """A waiter's wake-up flag: :meth:`reset` it *before* each check, then wait on ``event``.

    Resetting first means a notification that lands between the check and the wait still
    wakes the waiter (the event is level-triggered).
    """

    __slots__ = ("event", "ticket")

    def __init__(self, ticket: float = float("inf")) -> None:
        self.event = anyio.Event()
        self.ticket = ticket  # for queues: the waiter's place in line

    def reset(self) -> None:
        if self.event.is_set():
            self.event = anyio.Event()


@final
class Subscriber:
    """Listens on ``channel`` while at least one :meth:`active` block is open.

    Args:
        client: a ``redis.asyncio.Redis``, whose pool lends the subscription a connection,
            or a ``redis.asyncio.RedisCluster``. (The listener ends with its event loop,
            see cancellation.py.)
        channel: the channel name.
        on_message: called (synchronously, on the loop) with each message's payload.
        on_reset: called when messages may have been lost (a resubscription after a gap,
            or an error); users must then re-read the state they watch.
        sharded: a sharded channel (``SSUBSCRIBE``).
    """

    def __init__(
        self,
        client: Client,
        channel: str,
        on_message: Callable[[str], object],
        on_reset: Callable[[], object],
        *,
        sharded: bool = False,
    ) -> None:
        self._client = client
        self._channel = channel
        self._sharded = sharded
        self._on_message = on_message
        self._on_reset = on_reset
        self._users = 0
        # One listener per period of use, stopped through its scope (never Task.cancel(),
        # which anyio scopes inside could absorb); a retired one closes its own connection.
        self._task: asyncio.Task[None] | None = None
        # Made by active(), on the loop: anyio objects cannot be made outside one, and the
        # object itself may be (at import time, say).
        self._scope: anyio.CancelScope | None = None
        self._retiring: set[asyncio.Task[None]] = set()  # strong references until done
        self._ready: anyio.Event | None = None

    @property
    def subscribed(self) -> bool:
        """Whether a listener is running and has confirmed (or attempted) its subscription."""
        return self._task is not None and self._ready is not None and self._ready.is_set()

    @contextlib.asynccontextmanager
    async def active(self) -> AsyncIterator[None]:
        """Keep the subscription alive for the body.

        Entering returns once the server confirmed the subscription, or once the first
        attempt failed (the caller's bounded re-checks then cover the gap), so a message
        published after entry is seen unless the connection breaks, which ``on_reset``
        reports.
        """
        self._users += 1
        try:
            if self._task is None:
                self._ready = ready = anyio.Event()
                self._scope = anyio.CancelScope()
                self._task = asyncio.create_task(self._main(self._scope, ready))
            assert self._ready is not None
            await self._ready.wait()
            yield
        finally:
            self._users -= 1
            if self._users == 0 and self._task is not None:
                assert self._scope is not None
                self._scope.cancel()
                self._retiring.add(self._task)
                self._task.add_done_callback(self._retiring.discard)
                self._task = None

    def _deliver(self, callback: Callable[..., object], *args: str) -> None:
        # A bad message (anyone may publish on the channel) must not stop the listener.
        try:
            callback(*args)
        except Exception:
            log.exception("subscriber on %s: handling %r failed", self._channel, args)

    async def _main(self, scope: anyio.CancelScope, ready: anyio.Event) -> None:
        with scope:
            await self._listen(ready)

    def _pubsub(self) -> tuple[Any, redis.asyncio.Redis | None]:
        """A new PubSub (its methods are not all typed), and the node client it runs on
        (a Cluster's), to close with it."""
        if isinstance(self._client, redis.asyncio.RedisCluster):
            node = node_client(self._client, self._channel)
            return node.pubsub(), node
        return self._client.pubsub(), None

    async def _listen(self, ready: anyio.Event) -> None:
        failures = 0
        since = cancellation.mark()
        pubsub: Any = None
        node: redis.asyncio.Redis | None = None
        prefix = "s" if self._sharded else ""
        try:
            while True:
                try:
                    pubsub, node = self._pubsub()
                    if self._sharded:
                        await pubsub.ssubscribe(self._channel)
                    else:
                        await pubsub.subscribe(self._channel)
                    cancellation.deliver(since)
                    async for message in pubsub.listen():
                        cancellation.deliver(since)
                        kind = text(message["type"])
                        if kind == f"{prefix}message":
                            self._deliver(self._on_message, text(message["data"]))
                        elif kind == f"{prefix}subscribe":
                            failures = 0
                            if ready.is_set():
                                self._deliver(self._on_reset)  # resubscribed: messages lost?
                            ready.set()
                        elif kind == "sunsubscribe":  # the server ended it: the slot moved
                            raise RedisError(
                                f"the server ended the subscription to {self._channel}"
                            )
                except Exception as exc:
                    # Any error, not only a connection's: a listener that died here would
                    # leave every waiter's wake-ups (and a first active() entry) hanging.
                    delay = _RETRY_DELAYS[min(failures, len(_RETRY_DELAYS) - 1)]
                    failures += 1
                    expected = isinstance(exc, RedisError | OSError)
                    log.log(
                        logging.DEBUG if expected else logging.WARNING,
                        "subscriber on %s failed (%s); retry in %s s",
                        self._channel,
                        describe(exc),
                        delay,
                        exc_info=not expected,
                    )
                    ready.set()
                    self._deliver(self._on_reset)
                    with anyio.CancelScope(shield=True):
                        await _close(pubsub, node)
                    pubsub = node = None
                    await self._find_slot()
                    await anyio.sleep(delay)
        finally:
            with anyio.CancelScope(shield=True):
                await _close(pubsub, node)

    async def _find_slot(self) -> None:
        """On a Cluster, ask for a key of the channel's slot through the cluster client,
        which learns where the slot moved (a failover, a resharding) on the way."""
        if isinstance(self._client, redis.asyncio.RedisCluster):
            with contextlib.suppress(RedisError, OSError):
                await self._client.exists(self._channel)


async def _close(pubsub: Any, node: redis.asyncio.Redis | None) -> None:
    with contextlib.suppress(RedisError, OSError):
        if pubsub is not None:
            await pubsub.aclose()
    with contextlib.suppress(RedisError, OSError):
        if node is not None:
            await node.aclose()

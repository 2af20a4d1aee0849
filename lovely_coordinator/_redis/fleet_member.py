"""A fleet member's life: its keys and scripts, its heartbeat, what it knows of the settings.

A member joins when its :class:`~lovely_coordinator.redis.RedisFleet` is entered and leaves
on exit. Its heartbeat (every ``ttl / 3``, every 0.5 s while Redis cannot be reached)
renews its own entry and every unit it holds (one per request in flight), counts the live
members (each one's share when Redis is unreachable), notices a server that lost the
fleet's state (the epoch changed or vanished: the member puts back the settings it knows),
re-reads the settings, and notices Redis coming back (then what was admitted locally
meanwhile is charged to the fleet's buckets).

Settings reach every member within a fraction of a second through the fleet's channel
(``"<tag> *"``), and at every heartbeat in any case; wake-ups for waiters travel on the
same channel (``"<tag> <ticket>"``: waiters of that tuple up to that ticket re-try).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final, Literal

import anyio
from redis.exceptions import RedisError

from .._base.types import ModelTuple
from . import boot, cancellation, fleet_scripts, generation
from .cluster import Client
from .confirm import Confirmation
from .evalsha import Script
from .fleet_state import (
    FleetStatistics,
    FleetTupleStatistics,
    Known,
    Setting,
    Share,
    tag_of,
    tuple_of,
)
from .keys import object_base
from .log import describe, log
from .renewal import local_deadline
from .subscriber import Subscriber, Watch, text

__all__ = ["UNAVAILABLE_ERRORS", "Member"]

UNAVAILABLE_ERRORS: Final = (RedisError, OSError)
_PARTS: Final = (
    "cfg",
    "bucket",
    "quiet",
    "holders",
    "charges",
    "queue",
    "waiters",
    "needs",
    "ticket",
)


def _number(value: Any) -> float | None:
    raw = text(value) if isinstance(value, bytes | str) else value
    return None if raw in ("", None) else float(raw)


class Member:
    """One member's state and its background work (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        *,
        name: str,
        prefix: str,
        ttl: float,
        on_unavailable: Literal["local", "wait"],
        min_replicas: int = 0,
    ) -> None:
        self.client = client
        self.confirm = Confirmation(min_replicas, ttl)
        self.name = name
        self.ttl = ttl
        self.ttl_ms = max(1, round(ttl * 1000))
        self.on_unavailable = on_unavailable
        self.id = uuid.uuid4().hex
        self.base = base = object_base(prefix, "fleet", name)
        self.channel = f"{base}:changed"
        self.marker = generation.marker_key(client, base)
        self.epoch_key, self.members_key, self.governed_key = (
            f"{base}:epoch", f"{base}:members", f"{base}:governed"
        )  # fmt: skip
        self.known = Known()
        self.share = Share()
        self.epoch: str | None = None
        self.available = True
        # Made on the loop, by join(): anyio objects cannot be made outside one.
        self.back: anyio.Event  # set when Redis answers again after an outage
        self.server_offset = 0.0  # server Unix time minus local Unix time (s)
        self.units: dict[str, tuple[ModelTuple, str]] = {}  # unit id -> (tuple, holders key)
        self.watches: dict[str, set[Watch]] = {}
        self.admit = Script(client, fleet_scripts.ADMIT)
        self.settle = Script(client, fleet_scripts.SETTLE)
        self.release = Script(client, fleet_scripts.RELEASE)
        self._beat = Script(client, fleet_scripts.BEAT)
        self._leave = Script(client, fleet_scripts.LEAVE)
        self._set = Script(client, fleet_scripts.SET)
        self._stats = Script(client, fleet_scripts.STATS)
        self.subscriber = Subscriber(
            client, self.channel, self._on_message, self._on_reset, sharded=True
        )
        self._deadline = math.inf
        self._wanted: anyio.Event  # a setting changed: re-read
        self._restoring = asyncio.Lock()
        self.last = FleetStatistics(name, 0, ())  # the latest reload's view
        self.last_at = -math.inf

    # -- keys ------------------------------------------------------------------------------------

    def keys(self, tag: str) -> dict[str, str]:
        """The tuple's keys by part (see fleet_scripts.py), and the generation marker."""
        keys = {part: f"{self.base}:t:{tag}:{part}" for part in _PARTS}
        keys["marker"] = self.marker
        return keys

    def tombstone(self, tag: str, unit: str) -> str:
        return f"{self.base}:t:{tag}:abandoned:{unit}"

    # -- wake-ups --------------------------------------------------------------------------------

    def _on_message(self, message: str) -> None:
        tag, _, what = message.partition(" ")
        if what == "*":  # a setting changed: read it, and let its waiters re-try
            self._wanted.set()
            cutoff = math.inf
        else:
            cutoff = float(what)
        for watch in self.watches.get(tag, ()):
            if watch.ticket <= cutoff:
                watch.event.set()

    def _on_reset(self) -> None:
        self._wanted.set()
        for watches in self.watches.values():
            for watch in watches:
                watch.event.set()

    # -- settings --------------------------------------------------------------------------------

    async def change(self, op: str, t: ModelTuple, *values: object, reload: bool = True) -> None:
        """One settings change (see ``SET``), then the settings are read back."""
        tag = tag_of(t)
        keys = self.keys(tag)
        args = [
            "" if v is None else repr(float(v)) if isinstance(v, float) else str(v) for v in values
        ]
        epoch = await self._set(
            [self.epoch_key, self.governed_key, keys["cfg"], keys["bucket"], keys["holders"],
             keys["queue"]],
            [op, tag, self.channel, uuid.uuid4().hex, *args],
        )  # fmt: skip
        if self.epoch is None:
            self.epoch = text(epoch)
        if reload:
            await self.reload()

    async def reload(self) -> FleetStatistics:
        """Read every governed tuple's settings and state in one step; ``known`` follows."""
        tags = sorted({text(tag) for tag in await self.client.hkeys(self.governed_key)})
        keys = [self.epoch_key, self.members_key]
        for tag in tags:
            parts = self.keys(tag)
            keys += [
                parts["cfg"],
                parts["bucket"],
                parts["holders"],
                parts["queue"],
                parts["waiters"],
            ]
        reply = await self._stats(keys, [])
        now_ms = float(text(reply[0]))
        self.server_offset = now_ms / 1000 - time.time()
        epoch = text(reply[1]) or None
        if self.epoch is None:
            self.epoch = epoch
        elif epoch != self.epoch:  # lost: put back what is known before forgetting it
            await self.restore(self.epoch)
            return await self.reload()
        members = int(reply[2])
        rows = []
        known = Known()
        for tag, row in zip(tags, reply[3:], strict=True):
            rpm, tpm, limit, closed, rq, tk = (_number(v) for v in row[:6])
            t = tuple_of(tag)
            known.put(t, Setting(rpm, tpm, None if limit is None else int(limit), closed))
            rows.append(
                FleetTupleStatistics(
                    tuple=t,
                    limit=None if limit is None else int(limit),
                    in_flight=int(row[6]),
                    queued=int(row[7]),
                    requests_per_minute=rpm,
                    tokens_per_minute=tpm,
                    requests_available=rq,
                    tokens_available=tk,
                    open=closed is None,
                    reopens_at=None if closed is None else closed / 1000,
                )
            )
        self.known = known
        self.share.members = max(1, members)
        self.last = FleetStatistics(self.name, members, tuple(rows))
        self.last_at = anyio.current_time()
        return self.last

    async def restore(self, lost: str | None) -> None:
        """Put back the settings this member knows, in a server that lost the fleet's state
        (buckets start empty; a closure keeps its reopen instant)."""
        async with self._restoring:  # one at a time: the second finds the first's result
            if self.epoch != lost:
                return  # restored meanwhile
            log.warning(
                "fleet %r: the Redis server lost the fleet's state; putting back the settings "
                "this member knows (budgets start empty)",
                self.name,
            )
            self.epoch = None
            now_ms = (time.time() + self.server_offset) * 1000
            for t, setting in list(self.known.settings.items()):
                rpm, tpm = setting.requests_per_minute, setting.tokens_per_minute
                await self.change("restore", t, rpm, tpm, setting.limit, reload=False)
                if setting.closed_until_ms is not None and setting.closed_until_ms > now_ms:
                    ms = math.ceil(setting.closed_until_ms - now_ms)
                    await self.change("close", t, ms, reload=False)

    # -- membership ------------------------------------------------------------------------------

    async def join(self) -> None:
        self._wanted = anyio.Event()
        self.back = anyio.Event()
        await boot.ensure_supported(self.client)
        await self._heartbeat()
        await self.reload()

    async def leave(self) -> None:
        await self._leave([self.members_key], [self.id])

    async def _heartbeat(self) -> None:
        keys = [self.epoch_key, self.members_key]
        args: list[str | int] = [self.id, self.ttl_ms]
        index: dict[str, int] = {}
        for unit, (_, holders) in self.units.items():
            if holders not in index:
                index[holders] = len(keys) + 1
                keys.append(holders)
            args += [index[holders], unit]
        sent = anyio.current_time()
        # Unconfirmed (min_replicas): an UnconfirmedError, a RedisError, so an outage.
        reply: Sequence[Any] = await cancellation.call(self.confirm.call(self._beat, keys, args))
        self._deadline = local_deadline(sent, self.ttl)
        epoch = text(reply[0]) or None
        self.share.members = max(1, int(reply[1]))
        for unit in reply[2:]:
            self.units.pop(text(unit), None)  # lapsed: its settle changes nothing now
        if self.epoch is None:
            self.epoch = epoch
        elif epoch != self.epoch:
            await self.restore(self.epoch)

    async def refresh(self) -> FleetStatistics:
        """A heartbeat (rejoining after an outage), then :meth:`reload`."""
        await self._heartbeat()
        if not self.available:
            await self._returned()
        return await self.reload()

    async def run(self) -> None:
        """The heartbeat loop, until cancelled (renewals, reloads, outages, returns)."""
        while True:
            try:
                await self._heartbeat()
                if not self.available:
                    await self._returned()
                delay = self.ttl / 3
            except UNAVAILABLE_ERRORS as exc:
                self.unavailable(exc)
                delay = min(0.5, self.ttl / 3)
            beat_at = anyio.current_time() + delay
            while True:  # until the next beat, re-read the settings when told they changed
                with anyio.move_on_at(beat_at):
                    await self._wanted.wait()
                if not self._wanted.is_set():
                    break
                self._wanted = anyio.Event()
                if self.available:
                    try:
                        await self.reload()
                    except UNAVAILABLE_ERRORS as exc:
                        self.unavailable(exc)

    def unavailable(self, exc: BaseException) -> None:
        """Redis could not be reached (logged at WARNING once per outage)."""
        if self.available:
            self.available = False
            self.back = anyio.Event()
            log.warning(
                "fleet %r: Redis cannot be reached (%s); %s until it can",
                self.name,
                describe(exc),
                "admitting locally at this member's share"
                if self.on_unavailable == "local"
                else "requests of governed tuples wait",
            )

    async def _returned(self) -> None:
        for t, (requests, tokens) in self.share.take_charges().items():
            await self.change("charge", t, requests, tokens)
        self.available = True
        self.back.set()
        log.info("fleet %r: Redis is reachable again; rejoined", self.name)
        await self.reload()

    def statistics_offline(self) -> FleetStatistics:
        rows = tuple(
            FleetTupleStatistics(
                tuple=t,
                limit=s.limit,
                in_flight=self.share.in_flight(t),
                queued=0,
                requests_per_minute=s.requests_per_minute,
                tokens_per_minute=s.tokens_per_minute,
                requests_available=None,
                tokens_available=None,
                open=s.closed_until_ms is None,
                reopens_at=None if s.closed_until_ms is None else s.closed_until_ms / 1000,
            )
            for t, s in sorted(self.known.settings.items())
        )
        return FleetStatistics(self.name, self.share.members, rows, available=False)

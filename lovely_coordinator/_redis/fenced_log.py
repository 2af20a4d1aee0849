"""The store side of fencing: an append-only log that refuses writes from stale holders.

A lease cannot stop a holder that was paused past its expiry from writing; the store that
receives the writes must check the token itself, atomically with the write. ``FencedLog``
keeps the highest fence it accepted next to the entries (keys under one hash tag) and
appends in one script: a fence lower than the mark is refused, an equal or higher one is
accepted and raises the mark. Fence 0 means unfenced: always accepted, never moves the
mark.

Checking writes alone is not enough for a read-modify-write. A holder whose event loop
stalls past its ttl wakes up still holding what it read before the stall; meanwhile the
next holder was granted and *read* (say, then waited on a model for a minute), but has
not written yet. The store has not seen the new fence, so the old holder's write is
accepted, and the new holder then writes over it: a lost update. A **fenced read**
(``entries(fence=f)``) or a **claim** (``claim(f)``) raises the mark to ``f`` before the
new holder does anything else, so from that moment every older holder's write fails.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Final, final

import redis.asyncio

from .._errors import InvalidArgumentTypeError, StaleFenceError
from . import boot, scripts
from .keys import object_base
from .subscriber import text
from .validation import check_client, check_fence, check_key, require_asyncio

__all__ = ["FencedLog", "StaleFenceError"]

# How long the server remembers an append's answer: longer than any client retry takes.
_RECEIPT_MS: Final = 60_000


def _parse(raw: Sequence[bytes | str]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for item in raw:
        fence, _, entry = text(item).partition(":")
        out.append((int(fence), entry))
    return out


@final
class FencedLog:
    """An append-only list of ``(fence, entry)`` in Redis, guarded by a fencing high-water mark.

    Args:
        client: a ``redis.asyncio.Redis``.
        key: the log's name; its keys are ``{log:<key>}:entries``, ``{log:<key>}:high-water``
            and, for a minute after each append, ``{log:<key>}:receipt:<id>`` (braces and
            ``%`` in the name are escaped, see ``keys.py``).

    Raises:
        InvalidArgumentError: ``client`` is not a ``redis.asyncio.Redis`` (a ``TypeError``
            one), or ``key`` is not a nonempty string.
        UsageError: constructed under trio (this module is asyncio-only).
    """

    def __init__(self, client: redis.asyncio.Redis, key: str) -> None:
        self._client = check_client(client)
        check_key(key, "key")
        self._base = base = object_base("", "log", key)
        self._entries_key = f"{base}:entries"
        self._high_water_key = f"{base}:high-water"
        self._append = client.register_script(scripts.FENCED_APPEND)
        self._read = client.register_script(scripts.FENCED_READ)

    async def _ready(self) -> None:
        require_asyncio()
        await boot.ensure_supported(self._client)

    async def append(self, fence: int, entry: str) -> int:
        """Append ``entry`` under ``fence`` atomically and return its 0-based index.

        Raises:
            StaleFenceError: ``fence`` is lower than the highest fence accepted so far
                (nothing was written).
            InvalidArgumentError: ``fence`` is not an int >= 0, or ``entry`` not a str.
        """
        fence = check_fence(fence)
        if not isinstance(entry, str):
            raise InvalidArgumentTypeError("entry must be a string")
        await self._ready()
        # A receipt per call: if the reply is lost and the client resends the call, the
        # server answers the resend as it answered the first (see scripts.FENCED_APPEND).
        receipt = f"{self._base}:receipt:{uuid.uuid4().hex}"
        accepted, value = await self._append(
            [self._entries_key, self._high_water_key, receipt], [str(fence), entry, _RECEIPT_MS]
        )
        if not accepted:
            raise StaleFenceError(fence, int(value))
        return int(value)

    async def entries(self, fence: int | None = None) -> list[tuple[int, str]]:
        """Every ``(fence, entry)`` in append order.

        With ``fence``, a fenced read: atomically, it is refused if ``fence`` is below the
        high-water mark, and otherwise raises the mark to ``fence`` before reading, so
        every write of an older holder fails from then on, even if this holder has not
        written yet. (Fence 0 reads unfenced and leaves the mark alone.)

        Raises:
            StaleFenceError: ``fence`` is lower than the mark (nothing was changed).
            InvalidArgumentError: ``fence`` is not an int >= 0.
        """
        if fence is None:
            await self._ready()
            return _parse(await self._client.lrange(self._entries_key, 0, -1))
        reply = await self._fenced(fence, read=True)
        return _parse(reply[1])

    async def claim(self, fence: int) -> None:
        """Raise the high-water mark to ``fence`` without reading (as a fenced read does).

        Raises:
            StaleFenceError: ``fence`` is lower than the mark (nothing was changed).
            InvalidArgumentError: ``fence`` is not an int >= 0.
        """
        await self._fenced(fence, read=False)

    async def _fenced(self, fence: int, *, read: bool) -> list[Any]:
        fence = check_fence(fence)
        await self._ready()
        reply: list[Any] = await self._read(
            [self._entries_key, self._high_water_key], [str(fence), "1" if read else "0"]
        )
        if not reply[0]:
            raise StaleFenceError(fence, int(text(reply[1])))
        return reply

    async def high_water(self) -> int:
        """The highest fence accepted so far (0 for an empty or only-unfenced log)."""
        await self._ready()
        value = await self._client.get(self._high_water_key)
        return 0 if value is None else int(value)

"""The store side of fencing: an append-only log that refuses writes from stale holders.

A lease cannot stop a holder that was paused past its expiry from writing; the store that
receives the writes must check the token itself, atomically with the write. ``FencedLog``
keeps the highest fence it accepted next to the entries (two keys under one hash tag) and
appends in one script: a fence lower than the mark is refused, an equal or higher one is
accepted and raises the mark. Fence 0 means unfenced: always accepted, never moves the
mark.
"""

from __future__ import annotations

import uuid
from typing import Any, Final, final

from .._errors import InvalidArgumentError, InvalidArgumentTypeError, StaleFenceError
from . import scripts
from .subscriber import text
from .validation import check_key

__all__ = ["FencedLog", "StaleFenceError"]

# How long the server remembers an append's answer: longer than any client retry takes.
_RECEIPT_MS: Final = 60_000


@final
class FencedLog:
    """An append-only list of ``(fence, entry)`` in Redis, guarded by a fencing high-water mark.

    Args:
        client: a ``redis.asyncio.Redis``.
        key: the log's name; its keys are ``{key}:entries``, ``{key}:high-water`` and,
            for a minute after each append, ``{key}:receipt:<id>``.

    Raises:
        InvalidArgumentError: ``key`` is not a nonempty string.
    """

    def __init__(self, client: Any, key: str) -> None:
        check_key(key, "key")
        self._client = client
        self._key = key
        self._entries_key = f"{{{key}}}:entries"
        self._high_water_key = f"{{{key}}}:high-water"
        self._append = client.register_script(scripts.FENCED_APPEND)

    async def append(self, fence: int, entry: str) -> int:
        """Append ``entry`` under ``fence`` atomically and return its 0-based index.

        Raises:
            StaleFenceError: ``fence`` is lower than the highest fence accepted so far
                (nothing was written).
            InvalidArgumentError: ``fence`` is not an int >= 0, or ``entry`` not a str.
        """
        if isinstance(fence, bool) or not isinstance(fence, int):
            raise InvalidArgumentTypeError("fence must be a nonnegative integer")
        if fence < 0:
            raise InvalidArgumentError("fence must be a nonnegative integer")
        if not isinstance(entry, str):
            raise InvalidArgumentTypeError("entry must be a string")
        # A receipt per call: if the reply is lost and the client resends the call, the
        # server answers the resend as it answered the first (see scripts.FENCED_APPEND).
        receipt = f"{{{self._key}}}:receipt:{uuid.uuid4().hex}"
        accepted, value = await self._append(
            [self._entries_key, self._high_water_key, receipt], [str(fence), entry, _RECEIPT_MS]
        )
        if not accepted:
            raise StaleFenceError(fence, int(value))
        return int(value)

    async def entries(self) -> list[tuple[int, str]]:
        """Every ``(fence, entry)`` in append order."""
        raw = await self._client.lrange(self._entries_key, 0, -1)
        out: list[tuple[int, str]] = []
        for item in raw:
            fence, _, entry = text(item).partition(":")
            out.append((int(fence), entry))
        return out

    async def high_water(self) -> int:
        """The highest fence accepted so far (0 for an empty or only-unfenced log)."""
        value = await self._client.get(self._high_water_key)
        return 0 if value is None else int(value)

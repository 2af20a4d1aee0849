"""Argument checks shared by the Redis primitives (bad input changes nothing).

Everything here is checked before any state changes, locally or in Redis, so a refused
call has done nothing. Numbers follow the library's one rule (``_validate.py``); the
bounds added here are what the server and the scripts can represent exactly.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Final

from .._base.errors import InvalidArgumentError, InvalidArgumentTypeError, UsageError
from .._base.validate import as_index, as_seconds
from .cluster import CLIENT_TYPES, Client, encoder

__all__ = [
    "MAX_SECONDS",
    "check_client",
    "check_fence",
    "check_key",
    "check_min_replicas",
    "check_prefix",
    "check_seconds",
    "check_sendable",
    "check_ttl",
    "require_asyncio",
]

# The longest ttl or closure accepted: about 31 years. Expiry times are milliseconds on the
# server clock (~1.8e12 today) plus these, computed in the scripts as Lua doubles: far
# below 2**53, where doubles stop being exact, and below what PX / zset scores accept.
MAX_SECONDS: Final = 1e9

_TTL_MESSAGE: Final = "ttl must be a number of seconds from 0.01 to 1e9"


def check_ttl(ttl: object) -> float:
    """``ttl`` as a float: a real number of seconds from 0.01 to :data:`MAX_SECONDS`.

    Raises:
        InvalidArgumentTypeError: not a real number (bool included).
        InvalidArgumentError: NaN, infinite, or out of range.
    """
    seconds = as_seconds(ttl, _TTL_MESSAGE)
    if not 0.01 <= seconds <= MAX_SECONDS:
        raise InvalidArgumentError(_TTL_MESSAGE)
    return seconds


def check_seconds(value: object, what: str) -> float:
    """``value`` as a float: a real number of seconds from 0 to :data:`MAX_SECONDS`.

    Raises:
        InvalidArgumentTypeError: not a real number (bool included).
        InvalidArgumentError: NaN, infinite, negative, or above the bound.
    """
    message = f"{what} must be a number of seconds from 0 to 1e9"
    seconds = as_seconds(value, message)
    if seconds > MAX_SECONDS:
        raise InvalidArgumentError(message)
    return seconds


def check_fence(fence: object) -> int:
    """``fence`` as a plain int >= 0 (any int but bool, or an ``operator.index`` integer).

    Raises:
        InvalidArgumentTypeError: not an integer.
        InvalidArgumentError: negative.
    """
    return as_index(fence, "fence must be a nonnegative integer", minimum=0)


def check_min_replicas(value: object) -> int:
    """``value`` as a plain int from 0 to 1000 (the replicas that must confirm a grant).

    Raises:
        InvalidArgumentTypeError: not an integer.
        InvalidArgumentError: negative or above 1000.
    """
    message = "min_replicas must be an integer from 0 to 1000"
    return as_index(value, message, minimum=0, maximum=1000)


def check_key(value: str, what: str) -> str:
    """``value`` if it is a nonempty ``str``.

    Raises:
        InvalidArgumentTypeError: not a ``str``.
        InvalidArgumentError: empty.
    """
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(f"{what} must be a nonempty string")
    if not value:
        raise InvalidArgumentError(f"{what} must be a nonempty string")
    return value


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a ``str`` (empty is fine: no namespace).

    Raises:
        InvalidArgumentTypeError: not a ``str``.
    """
    if not isinstance(prefix, str):
        raise InvalidArgumentTypeError("prefix must be a string")
    return prefix


def check_sendable(client: Client, what: str, *values: str) -> None:
    """Refuse strings the client cannot encode (a lone surrogate, under the default UTF-8).

    redis-py would raise ``UnicodeEncodeError`` only when it packs the command, after the
    local state changed (a gate closed) or with a clean-up to log for nothing.

    Raises:
        InvalidArgumentError: a value the client's encoding (and error handler) refuses.
    """
    codec: Any = encoder(client)
    for value in values:
        try:
            codec.encode(value)
        except UnicodeError:
            raise InvalidArgumentError(
                f"{what} must be {'a string' if len(values) == 1 else 'strings'} the client "
                f"can encode as {codec.encoding}"
            ) from None


def check_client(client: object) -> Client:
    """``client`` if it is one of redis-py's asyncio clients (``redis.asyncio.Redis`` or
    ``redis.asyncio.RedisCluster``), and the caller is not under trio.

    A URL, ``None`` or a *sync* ``redis.Redis`` would otherwise fail much later, with an
    ``AttributeError`` or a ``TypeError`` from deep inside a script call.

    Raises:
        InvalidArgumentTypeError: anything else.
        UsageError: constructed inside a running trio program.
    """
    if not isinstance(client, CLIENT_TYPES):
        hint = ""
        if isinstance(client, str):
            hint = " (make one with redis.asyncio.Redis.from_url(url))"
        elif type(client).__module__.startswith("redis."):
            hint = (
                " (this module is asyncio-only: use redis.asyncio.Redis or "
                f"redis.asyncio.RedisCluster, not redis.{type(client).__name__})"
            )
        raise InvalidArgumentTypeError(
            "client must be a redis.asyncio.Redis or redis.asyncio.RedisCluster, "
            f"not {type(client).__name__}{hint}"
        )
    if _in_trio():
        raise UsageError(_TRIO_MESSAGE)
    return client


_TRIO_MESSAGE: Final = (
    "lovely_coordinator.redis is asyncio-only (redis-py's asyncio client needs an asyncio "
    "event loop) and cannot be used under trio; run this part of the program on asyncio"
)


def _in_trio() -> bool:
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        return bool(trio.lowlevel.in_trio_run())
    except AttributeError:  # pragma: no cover  (trio < 0.23 has no in_trio_run)
        return False


def require_asyncio() -> None:
    """Refuse, with a clear message, a call made with no asyncio event loop running.

    Under trio the first network call would otherwise fail in a way that reads like a
    transient outage ("retry shortly"), which no retry can cure.

    Raises:
        UsageError: no asyncio event loop is running in this thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        if _in_trio():
            raise UsageError(_TRIO_MESSAGE) from None
        raise UsageError(
            "lovely_coordinator.redis is asyncio-only, and no asyncio event loop is running"
        ) from None

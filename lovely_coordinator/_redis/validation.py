"""Argument checks shared by the Redis primitives (bad input changes nothing)."""

from __future__ import annotations

import math

from .._errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["check_key", "check_prefix", "check_ttl"]


def check_ttl(ttl: float) -> float:
    """``ttl`` as a float; it must be a finite number of seconds, at least 10 ms.

    Raises:
        InvalidArgumentTypeError: not a real number (bool included).
        InvalidArgumentError: not finite, or below 0.01.
    """
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise InvalidArgumentTypeError("ttl must be a finite number of seconds >= 0.01")
    if not math.isfinite(ttl) or ttl < 0.01:
        raise InvalidArgumentError("ttl must be a finite number of seconds >= 0.01")
    return float(ttl)


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

"""The one rule for checking arguments, used by every public entry point.

* **Integers**: any ``int`` subclass but ``bool``, and anything else that is an integer by
  ``operator.index`` (``numpy.int64`` and the like). The value is returned as a plain
  ``int``.
* **Seconds**: any real number (``int``/``float`` subclasses, ``numbers.Real``), but not
  ``bool``. NaN, infinities and values too large to be a ``float`` are refused; the value
  is returned as a plain ``float``.
* **Flags**: exactly ``True`` or ``False``.
* **Callables**: checked when given, before anything else happens, so a bad one never
  draws an order, takes a slot or lands in a registry.

A value of the wrong type raises :class:`InvalidArgumentTypeError`, one of the right type
but out of range :class:`InvalidArgumentError`; both carry the caller's message, which is
the contract's exact wording. Nothing here has side effects, so a refused call has changed
nothing as long as it validates before it acts.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["as_bool", "as_callable", "as_index", "as_optional_index", "as_seconds"]

F = TypeVar("F", bound=Callable[..., Any])


def as_index(
    value: object,
    message: str,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    type_error: type[InvalidArgumentError] = InvalidArgumentTypeError,
    value_error: type[InvalidArgumentError] = InvalidArgumentError,
) -> int:
    """``value`` as a plain ``int`` ≥ ``minimum`` (and ≤ ``maximum``, if given).

    Raises:
        InvalidArgumentTypeError: ``value`` is a ``bool`` or not an integer at all.
        InvalidArgumentError: it is below ``minimum`` or above ``maximum``.
    """
    if type(value) is int:  # the common case, first and cheap
        number = value
    elif isinstance(value, bool):
        raise type_error(message)
    else:
        try:
            number = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise type_error(message) from None
    if number < minimum or (maximum is not None and number > maximum):
        raise value_error(message)
    return number


def as_optional_index(value: object, message: str, *, minimum: int = 1) -> int | None:
    """Like :func:`as_index`, but ``None`` passes through."""
    return None if value is None else as_index(value, message, minimum=minimum)


def as_seconds(
    value: object,
    message: str,
    *,
    positive: bool = False,
    type_error: type[InvalidArgumentError] = InvalidArgumentTypeError,
    value_error: type[InvalidArgumentError] = InvalidArgumentError,
) -> float:
    """``value`` as a finite ``float`` ≥ 0 (> 0 with ``positive``).

    Raises:
        InvalidArgumentTypeError: ``value`` is a ``bool`` or not a real number.
        InvalidArgumentError: NaN, infinite, too large for a float, or out of range.
    """
    if type(value) is float or type(value) is int:
        number: Any = value
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise type_error(message)
    else:
        number = value
    try:
        seconds = float(number)
    except (OverflowError, ValueError, TypeError):
        raise value_error(message) from None
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise value_error(message)
    return seconds


def as_bool(value: object, message: str) -> bool:
    """``value`` if it is exactly ``True`` or ``False``.

    Raises:
        InvalidArgumentTypeError: anything else (``0``, ``1``, ``None``, ...).
    """
    if value is True or value is False:
        return value
    raise InvalidArgumentTypeError(message)


def as_callable(
    value: F, message: str, *, type_error: type[InvalidArgumentError] = InvalidArgumentTypeError
) -> F:
    """``value`` if it is callable.

    Raises:
        InvalidArgumentTypeError: it is not (``None`` included).
    """
    if not callable(value):
        raise type_error(message)
    return value

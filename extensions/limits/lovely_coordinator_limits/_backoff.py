"""Exponential backoff with jitter, for limits that come without a server-supplied wait."""

from __future__ import annotations

import math
from dataclasses import dataclass
from random import Random
from typing import final

from lovely_coordinator import InvalidArgumentError

__all__ = ["Backoff"]


@final
@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to close a tuple after its ``attempt``-th consecutive limit (0-based).

    The nominal delay is ``min(max_delay, base * factor ** attempt)``; jitter takes a random
    fraction of up to ``jitter`` off it, so replicas and tuples that hit a limit together do
    not all probe at the same moment, yet the delay never collapses towards zero.

    Attributes:
        base: the first delay, in seconds (> 0).
        factor: the growth per attempt (≥ 1).
        max_delay: the ceiling, in seconds (≥ base); it also caps server-supplied waits.
        jitter: the largest fraction removed at random, in [0, 1).

    Raises:
        InvalidArgumentError: a field is out of range or not finite.
    """

    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not _finite(self.base) or self.base <= 0:
            raise InvalidArgumentError("Backoff base must be a positive finite number")
        if not _finite(self.factor) or self.factor < 1:
            raise InvalidArgumentError("Backoff factor must be a finite number >= 1")
        if not _finite(self.max_delay) or self.max_delay < self.base:
            raise InvalidArgumentError("Backoff max_delay must be a finite number >= base")
        if not _finite(self.jitter) or not 0 <= self.jitter < 1:
            raise InvalidArgumentError("Backoff jitter must be in [0, 1)")

    def nominal(self, attempt: int) -> float:
        """The delay before jitter: ``min(max_delay, base * factor ** attempt)``."""
        if attempt < 0:
            raise InvalidArgumentError("Backoff attempt must be a nonnegative integer")
        # Compare exponents rather than computing factor ** attempt, which overflows.
        ceiling = math.log(self.max_delay / self.base)
        if self.factor == 1 or attempt * math.log(self.factor) < ceiling:
            return min(self.max_delay, self.base * self.factor**attempt)
        return self.max_delay

    def delay(self, attempt: int, rng: Random) -> float:
        """The jittered delay for ``attempt``, in ``[(1 - jitter) * nominal, nominal]``."""
        return self.nominal(attempt) * (1.0 - self.jitter * rng.random())


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

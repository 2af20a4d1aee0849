"""The fake provider's rate limits: token buckets per model, stricter than announced.

Providers announce per-minute limits but enforce them over shorter windows: a bucket of
``window`` seconds of the per-minute rate (OpenAI's 600 RPM admits about 100 requests in a
burst with a ten-second window), refilled continuously at ``per_minute / 60`` a second. A
request is admitted when every bucket it draws from holds its charge:

- requests: 1;
- tokens: the prompt's tokens plus the output limit (OpenAI's rule at admission; the part
  of the limit the completion did not use is given back when it is complete);
- input tokens and output tokens (Anthropic's separate limits): the prompt's tokens, and
  the output limit (given back likewise).

The response headers report each bucket as it is right after admission (OpenAI's
``x-ratelimit-*``, Anthropic's ``anthropic-ratelimit-*``): the announced per-minute limit,
what remains, and when the bucket will be full again.

Pure: the caller passes the clock (``time.monotonic``) and the wall-clock time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, final

from lovely_coordinator import InvalidArgumentError

__all__ = ["Admission", "Buckets", "Quota", "format_duration"]

Dimension = Literal["requests", "tokens", "input-tokens", "output-tokens"]


@final
@dataclass(frozen=True, slots=True)
class Quota:
    """A model's rate limits at the fake provider (``None``: that limit is not enforced).

    Attributes:
        requests_per_minute: requests a minute.
        tokens_per_minute: prompt plus output tokens a minute.
        input_tokens_per_minute: prompt tokens a minute (Anthropic's input limit).
        output_tokens_per_minute: output tokens a minute (Anthropic's output limit).
        window: how many seconds of each rate a bucket holds (60: the whole minute).

    Raises:
        InvalidArgumentError: a value is not a positive finite number.
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    input_tokens_per_minute: float | None = None
    output_tokens_per_minute: float | None = None
    window: float = 60.0

    def __post_init__(self) -> None:
        for value in (*self._rates().values(), self.window):
            if value is not None and not _positive(value):
                raise InvalidArgumentError("Quota values must be positive finite numbers or None")

    def _rates(self) -> dict[Dimension, float | None]:
        return {
            "requests": self.requests_per_minute,
            "tokens": self.tokens_per_minute,
            "input-tokens": self.input_tokens_per_minute,
            "output-tokens": self.output_tokens_per_minute,
        }


@final
@dataclass(slots=True)
class _Bucket:
    per_minute: float
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        rate = self.per_minute / 60.0
        self.level = min(self.capacity, self.level + rate * max(0.0, now - self.at))
        self.at = max(self.at, now)

    def until_full(self) -> float:
        return (self.capacity - self.level) / (self.per_minute / 60.0)


@final
@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict on one request: admitted, or refused with the wait until it would be."""

    admitted: bool
    retry_after: float


@final
class Buckets:
    """The buckets of one model under a :class:`Quota`, full at ``now``."""

    def __init__(self, quota: Quota, now: float) -> None:
        self._buckets: dict[Dimension, _Bucket] = {
            name: _Bucket(rate, rate * quota.window / 60.0, rate * quota.window / 60.0, now)
            for name, rate in quota._rates().items()
            if rate is not None
        }

    def admit(self, *, prompt: int, output_limit: int, now: float) -> Admission:
        """Admit a request (drawing its charges) or refuse it (drawing nothing)."""
        charges = self._charges(prompt, output_limit)
        wait = 0.0
        for name, charge in charges.items():
            bucket = self._buckets[name]
            bucket.refill(now)
            if bucket.level < charge:
                rate = bucket.per_minute / 60.0
                # A request larger than the bucket never fits: ask for a whole window.
                short = min(charge, bucket.capacity) - bucket.level
                wait = max(wait, short / rate if charge <= bucket.capacity else 60.0)
        if wait > 0:
            return Admission(False, wait)
        for name, charge in charges.items():
            self._buckets[name].level -= charge
        return Admission(True, 0.0)

    def give_back(self, unused_output: int, now: float) -> None:
        """Return the part of the output limit a completed request did not use."""
        for name in ("tokens", "output-tokens"):
            bucket = self._buckets.get(name)
            if bucket is not None and unused_output > 0:
                bucket.refill(now)
                bucket.level = min(bucket.capacity, bucket.level + unused_output)

    def openai_headers(self) -> dict[str, str]:
        """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for what is enforced."""
        headers: dict[str, str] = {}
        for name in ("requests", "tokens"):
            bucket = self._buckets.get(name)
            if bucket is not None:
                headers[f"x-ratelimit-limit-{name}"] = _integer(bucket.per_minute)
                headers[f"x-ratelimit-remaining-{name}"] = _integer(bucket.level)
                headers[f"x-ratelimit-reset-{name}"] = format_duration(bucket.until_full())
        return headers

    def anthropic_headers(self, wall: datetime) -> dict[str, str]:
        """``anthropic-ratelimit-{dimension}-{limit,remaining,reset}``, resets in RFC 3339."""
        headers: dict[str, str] = {}
        for name, bucket in self._buckets.items():
            prefix = f"anthropic-ratelimit-{name}-"
            reset = wall + timedelta(seconds=bucket.until_full())
            headers[prefix + "limit"] = _integer(bucket.per_minute)
            headers[prefix + "remaining"] = _integer(bucket.level)
            headers[prefix + "reset"] = reset.isoformat(timespec="milliseconds")
        return headers

    def _charges(self, prompt: int, output_limit: int) -> dict[Dimension, int]:
        wanted: dict[Dimension, int] = {
            "requests": 1,
            "tokens": prompt + output_limit,
            "input-tokens": prompt,
            "output-tokens": output_limit,
        }
        return {name: charge for name, charge in wanted.items() if name in self._buckets}


def format_duration(seconds: float) -> str:
    """A Go-style duration as OpenAI writes resets: ``20ms``, ``1.5s``, ``6m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m" + (f"{rest:.3f}".rstrip("0").rstrip(".") or "0") + "s"


def _integer(value: float) -> str:
    return str(max(0, math.floor(value)))


def _positive(value: float) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )

"""What a provider's rate-limit headers say about its budgets.

OpenAI sends, on every response::

    x-ratelimit-limit-requests: 600         per minute
    x-ratelimit-remaining-requests: 599
    x-ratelimit-reset-requests: 100ms       until the bucket is full again (a Go duration)
    x-ratelimit-limit-tokens / -remaining-tokens / -reset-tokens

Anthropic sends ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
{limit,remaining,reset}``, the reset as an RFC 3339 time. Its ``tokens-*`` headers
describe the most restrictive token limit in effect; without them this module reads the
input-token limit (the one a prompt-heavy agent meets first), and a request's whole
estimate is charged against it, which errs on the safe side.

Both report per-minute limits, which is what a coordinator budget is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import final

from ._delay import parse_duration, parse_timestamp
from ._delay import plain_number as _number

__all__ = ["Limit", "RateLimits", "rate_limits_from_headers"]

_ANTHROPIC = "anthropic-ratelimit-"
# No provider budget comes near this; a header above it is garbage, and the learner's
# arithmetic on it (a share, a nudge of 1.5) would overflow to infinity, which no budget
# accepts. So it counts as not sent, like any unparseable value.
_MAX_AMOUNT = 2.0**53


@final
@dataclass(frozen=True, slots=True)
class Limit:
    """One budget as a response describes it; each field ``None`` when not sent.

    Attributes:
        per_minute: the limit, per minute.
        remaining: what is left of it now.
        reset: seconds until it is fully replenished (0: it is full).
    """

    per_minute: float | None
    remaining: float | None
    reset: float | None


@final
@dataclass(frozen=True, slots=True)
class RateLimits:
    """The request and token budgets a response reports (``None``: not reported)."""

    requests: Limit | None
    tokens: Limit | None

    @property
    def empty(self) -> bool:
        """Whether the response said nothing about either budget."""
        return self.requests is None and self.tokens is None


def rate_limits_from_headers(
    headers: Mapping[str, str] | Iterable[tuple[str, str]], *, now: datetime | None = None
) -> RateLimits:
    """Read the OpenAI or Anthropic rate-limit headers of a response (names ignore case).

    Args:
        headers: a mapping (``httpx.Headers``, a dict) or ``(name, value)`` pairs.
        now: the current time, for Anthropic's reset times; defaults to the system clock.

    Returns:
        What was found; unparseable values, and amounts above 2**53 (no budget is that
        large), count as not sent.
    """
    items = headers.items() if isinstance(headers, Mapping) else headers
    found = {name.lower(): value for name, value in items}
    if any(name.startswith(_ANTHROPIC) for name in found):
        when = now if now is not None else datetime.now(UTC)
        tokens = _anthropic(found, "tokens", when)
        if tokens is None:
            tokens = _anthropic(found, "input-tokens", when)
        return RateLimits(_anthropic(found, "requests", when), tokens)
    return RateLimits(_openai(found, "requests"), _openai(found, "tokens"))


def _openai(found: Mapping[str, str], budget: str) -> Limit | None:
    reset = found.get(f"x-ratelimit-reset-{budget}")
    return _limit(
        found.get(f"x-ratelimit-limit-{budget}"),
        found.get(f"x-ratelimit-remaining-{budget}"),
        parse_duration(reset) if reset is not None else None,
    )


def _anthropic(found: Mapping[str, str], budget: str, now: datetime) -> Limit | None:
    prefix = f"{_ANTHROPIC}{budget}-"
    reset = found.get(prefix + "reset")
    return _limit(
        found.get(prefix + "limit"),
        found.get(prefix + "remaining"),
        parse_timestamp(reset, now=now) if reset is not None else None,
    )


def _limit(limit: str | None, remaining: str | None, reset: float | None) -> Limit | None:
    per_minute = _amount(limit)
    left = _amount(remaining)
    if per_minute is not None and per_minute <= 0:
        per_minute = None
    if per_minute is None and left is None:
        return None
    return Limit(per_minute, left, reset)


def _amount(text: str | None) -> float | None:
    value = _number(text) if text is not None else None
    return value if value is not None and value <= _MAX_AMOUNT else None

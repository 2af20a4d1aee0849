"""How long a provider asks us to wait, read from its response.

Providers say it in different places; in order of preference:

1. ``retry-after-ms`` (openai, anthropic): milliseconds.
2. ``retry-after``: seconds, or an HTTP date (RFC 9110).
3. The JSON body: Gemini / Google APIs put a ``google.rpc.RetryInfo`` detail with
   ``retryDelay: "30s"`` in ``error.details`` (litellm ignored it, their #25507).
4. Reset headers of the exhausted budget: ``x-ratelimit-reset-requests`` /
   ``x-ratelimit-reset-tokens`` (openai; Go-style durations such as ``6m0s``, ``1.5s``,
   ``20ms``) and ``anthropic-ratelimit-*-reset`` (RFC 3339 times). The budgets whose
   ``remaining`` is 0 decide (the latest reset wins); with no exhausted budget the earliest
   reset is used, and the half-open probe finds out whether it was enough.

Every function returns seconds from ``now`` (never negative), or ``None`` when the source
says nothing usable. Nothing here is capped: the handler applies its own ceiling.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = [
    "delay_from_body",
    "delay_from_headers",
    "parse_duration",
    "parse_retry_after",
    "parse_timestamp",
    "retry_delay",
]

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DECIMAL = "0123456789."
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_OPENAI_RESETS = ("requests", "tokens")
_ANTHROPIC_PREFIX = "anthropic-ratelimit-"


def parse_duration(value: str) -> float | None:
    """Parse a Go-style duration (``6m0s``, ``1.5s``, ``250ms``, ``1h2m3.5s``) or bare seconds.

    Returns:
        The duration in seconds, or ``None`` when ``value`` is not a finite, nonnegative
        duration.
    """
    text = value.strip()
    if not text:
        return None
    plain = _seconds(text)
    if plain is not None:
        return plain
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position != len(text) or not math.isfinite(total):
        return None
    return total


def parse_timestamp(value: str, *, now: datetime) -> float | None:
    """Seconds from ``now`` until an RFC 3339 time (``2026-01-01T00:00:30Z``); 0 if it passed.

    Returns:
        ``None`` when ``value`` is not an RFC 3339 time with an offset.
    """
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return max(0.0, (moment - now).total_seconds())


def parse_retry_after(value: str, *, now: datetime) -> float | None:
    """Parse a ``retry-after`` value: delay seconds (``"30"``, ``"1.5"``) or an HTTP date.

    Returns:
        Seconds from ``now`` (0 for a date in the past), or ``None`` when unparseable.
    """
    text = value.strip()
    seconds = _seconds(text)
    if seconds is not None:
        return seconds
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # "-0000" means UTC with unknown origin (RFC 5322)
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - now).total_seconds())


def delay_from_headers(
    headers: Mapping[str, str] | Iterable[tuple[str, str]], *, now: datetime | None = None
) -> float | None:
    """The wait a provider's rate-limit response headers ask for (header names ignore case).

    Args:
        headers: a mapping (``httpx.Headers``, a dict) or ``(name, value)`` pairs.
        now: the current time, for dates; defaults to the system clock.

    Returns:
        Seconds, or ``None`` when no header says anything usable.
    """
    when = now if now is not None else datetime.now(UTC)
    items = headers.items() if isinstance(headers, Mapping) else headers
    found = {name.lower(): value for name, value in items}
    milliseconds = _seconds(found.get("retry-after-ms", ""))
    if milliseconds is not None:
        return milliseconds / 1000.0
    retry_after = found.get("retry-after")
    if retry_after is not None:
        seconds = parse_retry_after(retry_after, now=when)
        if seconds is not None:
            return seconds
    return _delay_from_resets(found, when)


def delay_from_body(body: object) -> float | None:
    """The ``google.rpc.RetryInfo`` delay in a JSON error body (Gemini and other Google APIs).

    Args:
        body: the decoded JSON (a dict, or a list of them, as Gemini sometimes sends), or
            its text or bytes.

    Returns:
        Seconds, or ``None`` when the body carries no retry delay.
    """
    if isinstance(body, bytes | bytearray):
        body = bytes(body).decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            return None
    for candidate in body if isinstance(body, list) else [body]:
        error = candidate.get("error") if isinstance(candidate, dict) else None
        details = error.get("details") if isinstance(error, dict) else None
        if not isinstance(details, list):
            continue
        for detail in details:
            if not isinstance(detail, dict) or detail.get("@type") != _RETRY_INFO:
                continue
            delay = detail.get("retryDelay")
            if isinstance(delay, str):
                seconds = parse_duration(delay)
                if seconds is not None:
                    return seconds
    return None


def retry_delay(source: object, *, now: datetime | None = None) -> float | None:
    """The wait a failed response asks for, from its headers and then its body.

    Args:
        source: an exception carrying a ``response`` (openai/anthropic ``APIStatusError``,
            ``httpx.HTTPStatusError``) and perhaps a decoded ``body``, an exception with
            ``headers`` and a parsed ``retry_after`` (pydantic-ai's ``ModelHTTPError``), or a
            response object with ``headers`` (and, if it was read, ``content``).
        now: the current time, for dates; defaults to the system clock.

    Returns:
        Seconds, or ``None`` when the response says nothing about when to retry.
    """
    response = getattr(source, "response", source)
    headers = getattr(response, "headers", None)
    if isinstance(headers, Mapping):
        seconds = delay_from_headers(headers, now=now)
        if seconds is not None:
            return seconds
    # pydantic-ai's ModelHTTPError carries the wait it already parsed.
    parsed = getattr(source, "retry_after", None)
    if isinstance(parsed, int | float) and not isinstance(parsed, bool) and math.isfinite(parsed):
        return max(0.0, float(parsed))
    body = getattr(source, "body", None)
    if body is None:
        body = _read_content(response)
    return None if body is None else delay_from_body(body)


def _read_content(response: object) -> object:
    try:
        # httpx raises ResponseNotRead for an unread streaming body; nothing to learn then.
        return getattr(response, "content", None)
    except Exception:
        return None


def _delay_from_resets(found: Mapping[str, str], now: datetime) -> float | None:
    exhausted: list[float] = []
    others: list[float] = []
    for budget in _OPENAI_RESETS:
        raw = found.get(f"x-ratelimit-reset-{budget}")
        seconds = parse_duration(raw) if raw is not None else None
        if seconds is not None:
            remaining = found.get(f"x-ratelimit-remaining-{budget}")
            (exhausted if _is_zero(remaining) else others).append(seconds)
    for name, raw in found.items():
        if not (name.startswith(_ANTHROPIC_PREFIX) and name.endswith("-reset")):
            continue
        seconds = parse_timestamp(raw, now=now)
        if seconds is not None:
            remaining = found.get(name.removesuffix("-reset") + "-remaining")
            (exhausted if _is_zero(remaining) else others).append(seconds)
    if exhausted:
        return max(exhausted)
    return min(others) if others else None


def _is_zero(value: str | None) -> bool:
    return value is not None and _seconds(value) == 0.0


def plain_number(text: str) -> float | None:
    """A plain nonnegative finite decimal number (``"600"``, ``"0.5"``), else ``None``.

    No signs, exponents, ``inf`` or ``nan``: header values are plain decimals.
    """
    return _seconds(text)


def _seconds(text: str) -> float | None:
    """A plain nonnegative finite decimal number, or None (no signs, no exponents, no inf/nan)."""
    stripped = text.strip()
    if not stripped or stripped.strip(_DECIMAL) or stripped.count(".") > 1 or stripped == ".":
        return None
    value = float(stripped)
    return value if math.isfinite(value) else None

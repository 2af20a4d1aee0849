"""The fleet's pure, synchronous parts: names, the settings a member knows, its share.

Nothing here talks to Redis or waits. :class:`Known` is what a member knows of the fleet's
settings (to decide cheaply whether a tuple is governed, and to put the settings back if
the server loses them); :class:`Share` admits requests while Redis cannot be reached
(``on_unavailable="local"``), at the member's last known share of each budget and limit,
and remembers what it admitted so that it can be charged to the fleet when Redis returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from .._base.types import ModelTuple
from .keys import escape, unescape

__all__ = [
    "FleetStatistics",
    "FleetTupleStatistics",
    "Known",
    "Setting",
    "Share",
    "fleet_document",
    "tag_of",
    "tuple_of",
]


def _part(text: str) -> str:
    return escape(text).replace(":", "%3A")


def tag_of(t: ModelTuple) -> str:
    """The tuple's name in keys and messages: ``provider:model``, each part escaped (no
    raw ``:``, ``{``, ``}`` or space), so it reads back unambiguously."""
    return f"{_part(t.provider)}:{_part(t.model)}".replace(" ", "%20")


def tuple_of(tag: str) -> ModelTuple:
    """The inverse of :func:`tag_of`."""
    provider, model = tag.split(":")

    def back(part: str) -> str:
        return unescape(part.replace("%20", " ").replace("%3A", ":"))

    return ModelTuple(back(provider), back(model))


@dataclass(frozen=True, slots=True)
class Setting:
    """One tuple's fleet settings (as last read or written by this member)."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    limit: int | None = None
    closed_until_ms: float | None = None  # server clock

    @property
    def empty(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.limit is None
            and self.closed_until_ms is None
        )


@dataclass(slots=True)
class Known:
    """The settings a member knows, per tuple. Invariant: no empty :class:`Setting` kept."""

    settings: dict[ModelTuple, Setting] = field(default_factory=dict)

    def governs(self, t: ModelTuple) -> bool:
        return t in self.settings

    def put(self, t: ModelTuple, setting: Setting) -> None:
        if setting.empty:
            self.settings.pop(t, None)
        else:
            self.settings[t] = setting

    def get(self, t: ModelTuple) -> Setting:
        return self.settings.get(t, Setting())


@dataclass(frozen=True, slots=True)
class FleetTupleStatistics:
    """One governed tuple, fleet-wide (a snapshot read in one step on the server).

    ``reopens_at`` is the server's Unix time (seconds) at which a closed gate reopens.
    """

    tuple: ModelTuple
    limit: int | None
    in_flight: int
    queued: int
    requests_per_minute: float | None
    tokens_per_minute: float | None
    requests_available: float | None
    tokens_available: float | None
    open: bool
    reopens_at: float | None


@dataclass(frozen=True, slots=True)
class FleetStatistics:
    """What ``await fleet.statistics()`` returns: the fleet as the server sees it."""

    name: str
    members: int
    tuples: tuple[FleetTupleStatistics, ...]
    available: bool = True  # False: Redis could not be reached (the rest is this member's)


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)


def fleet_document(statistics: FleetStatistics, now: float) -> dict[str, object]:
    """``statistics`` as the endpoint's ``fleet`` field (plain data); ``now`` is the
    server's Unix time, for each closed gate's ``reopens_in``."""
    return {
        "name": statistics.name,
        "members": statistics.members,
        "available": statistics.available,
        "tuples": [
            {
                "tuple": list(row.tuple),
                "limit": row.limit,
                "in_flight": row.in_flight,
                "queued": row.queued,
                "requests_per_minute": _finite(row.requests_per_minute),
                "tokens_per_minute": _finite(row.tokens_per_minute),
                "requests_available": _finite(row.requests_available),
                "tokens_available": _finite(row.tokens_available),
                "open": row.open,
                "reopens_at": row.reopens_at,
                "reopens_in": None if row.reopens_at is None else max(0.0, row.reopens_at - now),
            }
            for row in statistics.tuples
        ],
    }


_MINUTE: Final = 60.0


@dataclass(slots=True)
class _Local:
    in_flight: int = 0
    requests: float = math.inf
    tokens: float = math.inf
    at: float = 0.0
    charged_requests: int = 0  # admitted locally, not yet charged to the fleet
    charged_tokens: int = 0


class Share:
    """Local admission at a member's share while Redis is unreachable (pure; times in s).

    The share of each budget and limit is ``1 / members`` (the last member count known),
    the limit's rounded down but at least 1; each local bucket starts at its share of
    the per-minute amount (empty would stall a member whose fleet bucket was full).
    """

    def __init__(self) -> None:
        self.members = 1
        self._local: dict[ModelTuple, _Local] = {}

    def _refilled(self, t: ModelTuple, setting: Setting, now: float) -> _Local:
        local = self._local.get(t)
        share = 1 / max(1, self.members)
        rpm = None if setting.requests_per_minute is None else setting.requests_per_minute * share
        tpm = None if setting.tokens_per_minute is None else setting.tokens_per_minute * share
        if local is None:
            local = self._local[t] = _Local(
                requests=math.inf if rpm is None else rpm,
                tokens=math.inf if tpm is None else tpm,
                at=now,
            )
        minutes = max(0.0, now - local.at) / _MINUTE
        local.requests = math.inf if rpm is None else min(rpm, local.requests + minutes * rpm)
        local.tokens = math.inf if tpm is None else min(tpm, local.tokens + minutes * tpm)
        local.at = now
        return local

    def try_admit(self, t: ModelTuple, setting: Setting, tokens: int, now: float) -> float:
        """Admit now (returns 0) or say how many seconds until it may be (``inf``: when a
        unit is released). Closed gates are the caller's to check."""
        local = self._refilled(t, setting, now)
        if setting.limit is not None:
            cap = max(1, setting.limit // max(1, self.members))
            if local.in_flight >= cap:
                return math.inf
        wait = 0.0
        if setting.requests_per_minute is not None:
            rate = setting.requests_per_minute / max(1, self.members) / _MINUTE
            need = min(1.0, rate * _MINUTE)
            if local.requests < need:
                wait = max(wait, (need - local.requests) / rate)
        if setting.tokens_per_minute is not None:
            rate = setting.tokens_per_minute / max(1, self.members) / _MINUTE
            need = min(float(tokens), rate * _MINUTE)
            if local.tokens < need:
                wait = max(wait, (need - local.tokens) / rate)
        if wait > 0:
            return wait
        local.in_flight += 1
        local.requests -= 1
        local.tokens -= tokens
        local.charged_requests += 1
        local.charged_tokens += tokens
        return 0.0

    def settle(self, t: ModelTuple, delta: int) -> None:
        local = self._local.get(t)
        if local is not None:
            local.tokens -= delta
            local.charged_tokens += delta

    def release(self, t: ModelTuple) -> None:
        local = self._local.get(t)
        if local is not None:
            local.in_flight -= 1

    def take_charges(self) -> dict[ModelTuple, tuple[int, int]]:
        """What was admitted locally and not yet charged to the fleet (then forgotten,
        except the units still in flight)."""
        charges = {
            t: (local.charged_requests, local.charged_tokens)
            for t, local in self._local.items()
            if local.charged_requests or local.charged_tokens
        }
        self._local = {
            t: _Local(in_flight=v.in_flight) for t, v in self._local.items() if v.in_flight
        }
        return charges

    def in_flight(self, t: ModelTuple) -> int:
        local = self._local.get(t)
        return 0 if local is None else local.in_flight

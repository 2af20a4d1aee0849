"""OpenTelemetry metrics of a fleet (``lovely_coordinator.redis.RedisFleet``, CONTRACT §10).

:func:`instrument_fleet` records each fleet admission's wait in the
``lovely_coordinator.fleet.wait_time`` histogram (attribute ``outcome``: ``granted``,
``local`` (admitted at the member's share while Redis was unreachable), ``rejected`` or
``cancelled``), and observes the fleet's view per governed tuple when a reader collects:
``lovely_coordinator.fleet.in_flight``, ``.queued``, ``.limit``, ``.gate.open``,
``.budget.requests_available`` and ``.budget.tokens_available``, and the fleet's
``lovely_coordinator.fleet.members``. The observations read the fleet's latest view
(``RedisFleet.latest_statistics()``: never a Redis call on the collector's thread; at
most about a second old when collected every second). Every measurement carries
``lovely_coordinator.fleet`` (the fleet's name), and the per-tuple ones
``gen_ai.provider.name`` and ``gen_ai.request.model``.

Instruments are created once per meter provider and shared by every registration, as in
``_instrument.py`` (the OpenTelemetry API cannot remove an instrument).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.util.types import AttributeValue

from lovely_coordinator import InvalidArgumentTypeError, ModelTuple

from ._instrument import (
    OUTCOME,
    WAIT_TIME_BUCKETS,
    _PerProvider,
    _Registry,
    _tuple_attributes,
    _version,
)

if TYPE_CHECKING:  # imported when used: the core's redis extra is optional here
    from lovely_coordinator.redis import FleetTupleStatistics, RedisFleet

__all__ = ["FLEET", "instrument_fleet"]

FLEET: Final = "lovely_coordinator.fleet"
_SCOPE: Final = "lovely_coordinator"

Attributes = dict[str, AttributeValue]
_Read = Callable[["FleetTupleStatistics"], float | None]


def instrument_fleet(
    fleet: RedisFleet,
    *,
    meter_provider: MeterProvider | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Callable[[], None]:
    """Record ``fleet``'s admissions and its fleet-wide view until uninstrumented.

    Args:
        fleet: the fleet (entered or not; its view is empty until it is entered).
        meter_provider: where the metrics go (default: the global meter provider).
        attributes: extra attributes for every measurement.

    Returns:
        An idempotent uninstrument.

    Raises:
        InvalidArgumentTypeError: ``fleet`` is not a ``RedisFleet``.
    """
    from lovely_coordinator.redis import RedisFleet

    if not isinstance(fleet, RedisFleet):
        raise InvalidArgumentTypeError("fleet must be a lovely_coordinator.redis.RedisFleet")
    extra: Attributes = {**(attributes or {}), FLEET: fleet.name}
    shared = _shared(meter_provider)
    cache: dict[tuple[ModelTuple, str], Attributes] = {}

    def listener(t: ModelTuple, waited: float, outcome: str) -> None:
        tagged = cache.get((t, outcome))
        if tagged is None:
            tagged = cache[(t, outcome)] = {**_tuple_attributes(t, extra), OUTCOME: outcome}
        shared.wait_time.record(waited, tagged)

    remove = fleet.add_listener(listener)
    return shared.register(_Registration(fleet, extra), remove)


class _Registration:
    """One instrument_fleet() call (hashed by identity)."""

    __slots__ = ("extra", "fleet")

    def __init__(self, fleet: RedisFleet, extra: Attributes) -> None:
        self.fleet = fleet
        self.extra = extra


class _Shared(_Registry[_Registration]):
    """The fleet instruments of one meter provider."""

    def __init__(self, provider: MeterProvider | None) -> None:
        super().__init__()
        meter = metrics.get_meter(_SCOPE, _version(), meter_provider=provider)
        self.wait_time = meter.create_histogram(
            "lovely_coordinator.fleet.wait_time",
            unit="s",
            description="How long model requests waited for the fleet's admission",
            explicit_bucket_boundaries_advisory=WAIT_TIME_BUCKETS,
        )

        def per_tuple(read: _Read) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _options: self._per_tuple(read)

        for name, unit, read, description in (
            ("in_flight", "{request}", lambda r: r.in_flight, "Requests in flight, fleet-wide"),
            ("queued", "{waiter}", lambda r: r.queued, "Requests waiting for the fleet"),
            ("limit", "{request}", lambda r: r.limit, "The fleet's tuple limit"),
            ("gate.open", "1", lambda r: 1 if r.open else 0, "1 while the fleet's gate is open"),
            (
                "budget.requests_available",
                "{request}",
                lambda r: r.requests_available,
                "Requests the fleet's budget holds (negative: a debt)",
            ),
            (
                "budget.tokens_available",
                "{token}",
                lambda r: r.tokens_available,
                "Tokens the fleet's budget holds (negative: a debt)",
            ),
        ):
            meter.create_observable_gauge(
                f"lovely_coordinator.fleet.{name}",
                [per_tuple(read)],
                unit=unit,
                description=description,
            )
        meter.create_observable_gauge(
            "lovely_coordinator.fleet.members",
            [lambda _options: self._members()],
            unit="{member}",
            description="Live members of the fleet",
        )

    def _per_tuple(self, read: _Read) -> list[Observation]:
        found = []
        for registration in self.registrations():
            for row in registration.fleet.latest_statistics().tuples:
                value = read(row)
                if value is not None:
                    found.append(
                        Observation(value, _tuple_attributes(row.tuple, registration.extra))
                    )
        return found

    def _members(self) -> list[Observation]:
        return [
            Observation(registration.fleet.latest_statistics().members, registration.extra)
            for registration in self.registrations()
        ]


_shared = _PerProvider(_Shared)

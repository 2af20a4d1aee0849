"""instrument_fleet(): a RedisFleet's admissions and fleet-wide view, as the OpenTelemetry
SDK records them, against a real throwaway server (asyncio only: the fleet is)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis.asyncio
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer
from lovely_coordinator_opentelemetry import FLEET, MODEL, OUTCOME, PROVIDER, instrument_fleet
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from lovely_coordinator import (
    InvalidArgumentTypeError,
    ModelTuple,
    TupleSuspendedError,
    create_agent_coordinator,
)
from lovely_coordinator.redis import RedisFleet

GPT = ModelTuple("openai", "gpt-4o")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server() -> Iterator[ThrowawayServer]:
    with ThrowawayServer() as found:
        yield found


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


@pytest.mark.anyio
async def test_admissions_and_the_fleet_view(server: ThrowawayServer) -> None:
    client = redis.asyncio.Redis.from_url(server.url)
    coordinator = create_agent_coordinator(4)
    reader = InMemoryMetricReader()
    fleet = RedisFleet(client, coordinator, name="otel", ttl=5)
    uninstrument = instrument_fleet(
        fleet, meter_provider=MeterProvider(metric_readers=[reader]), attributes={"env": "t"}
    )
    with anyio.fail_after(10):
        async with fleet:
            await fleet.set_tuple_limit(GPT, 2)
            await fleet.set_budget(GPT, tokens_per_minute=1000)
            async with coordinator.request(GPT, tokens=100):
                await fleet.statistics()
                found = points(reader)
            await fleet.close_tuple(GPT, 60)
            with pytest.raises(TupleSuspendedError):
                async with coordinator.request(GPT, reject_on_closed_tuple=True):
                    pass
    await client.aclose()
    tagged = {PROVIDER: "openai", MODEL: "gpt-4o", FLEET: "otel", "env": "t"}
    assert [p.value for p in found["lovely_coordinator.fleet.in_flight"]] == [1]
    assert dict(found["lovely_coordinator.fleet.in_flight"][0].attributes) == tagged
    assert [p.value for p in found["lovely_coordinator.fleet.limit"]] == [2]
    assert [p.value for p in found["lovely_coordinator.fleet.gate.open"]] == [1]
    assert [p.value for p in found["lovely_coordinator.fleet.members"]] == [1]
    assert found["lovely_coordinator.fleet.budget.tokens_available"][0].value < 910
    assert "lovely_coordinator.fleet.budget.requests_available" not in found
    waits = points(reader)["lovely_coordinator.fleet.wait_time"]
    outcomes = {p.attributes[OUTCOME]: p for p in waits}
    assert set(outcomes) == {"granted", "rejected"}
    assert isinstance(outcomes["granted"], HistogramDataPoint)
    assert outcomes["granted"].count == 1
    uninstrument()
    uninstrument()  # idempotent
    assert "lovely_coordinator.fleet.members" not in points(reader)


def test_a_fleet_is_required() -> None:
    with pytest.raises(InvalidArgumentTypeError):
        instrument_fleet(create_agent_coordinator())  # type: ignore[arg-type]

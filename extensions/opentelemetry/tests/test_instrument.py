"""instrument(): every instrument, unit and attribute as the OpenTelemetry SDK records them
(its in-memory metric reader and span exporter), on asyncio and trio."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from lovely_coordinator_opentelemetry import (
    MODEL,
    OUTCOME,
    PROVIDER,
    WAIT_SPAN_NAME,
    WAIT_TIME_BUCKETS,
    instrument,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    TupleSuspendedError,
    create_agent_coordinator,
)

A = ModelTuple("openai", "gpt-4o")
B = ModelTuple("anthropic", "claude-sonnet-4")

# The instruments of CONTRACT §7: kind, unit.
INSTRUMENTS = {
    "lovely_coordinator.permit.wait_time": (Histogram, "s"),
    "lovely_coordinator.permits.active": (Sum, "{permit}"),
    "lovely_coordinator.permits.queued": (Sum, "{waiter}"),
    "lovely_coordinator.permits.lent": (Sum, "{permit}"),
    "lovely_coordinator.gate.open": (Gauge, "1"),
    "lovely_coordinator.budget.tokens_available": (Gauge, "{token}"),
    "lovely_coordinator.budget.requests_available": (Gauge, "{request}"),
    "lovely_coordinator.request.tokens": (Sum, "{token}"),
}


@dataclass
class Metric:
    kind: type
    unit: str
    description: str
    monotonic: bool | None
    points: list[Any]

    def value(self, t: ModelTuple, **extra: str) -> Any:
        wanted = {PROVIDER: t.provider, MODEL: t.model, **extra}
        found = [p for p in self.points if dict(p.attributes) == wanted]
        assert len(found) <= 1
        if not found:
            return None
        point = found[0]
        if isinstance(point, HistogramDataPoint):
            return point
        assert isinstance(point, NumberDataPoint)
        return point.value


def collect(reader: InMemoryMetricReader) -> dict[str, Metric]:
    data = reader.get_metrics_data()
    found: dict[str, Metric] = {}
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "lovely_coordinator"
            for metric in scope.metrics:
                found[metric.name] = Metric(
                    type(metric.data),
                    metric.unit or "",
                    metric.description or "",
                    getattr(metric.data, "is_monotonic", None),
                    list(metric.data.data_points),
                )
    return found


def setup(limit: int = 1, **options: Any) -> tuple[AgentCoordinator, InMemoryMetricReader, Any]:
    reader = InMemoryMetricReader()
    coordinator = create_agent_coordinator(limit)
    uninstrument = instrument(
        coordinator, meter_provider=MeterProvider(metric_readers=[reader]), **options
    )
    return coordinator, reader, uninstrument


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.mark.anyio
async def test_every_instrument_with_its_unit_and_attributes() -> None:
    with anyio.fail_after(10):
        coordinator, reader, _ = setup(limit=2)
        coordinator.set_budget(A, requests_per_minute=60, tokens_per_minute=1000)
        coordinator.close_tuple(B)
        async with coordinator.request(A, tokens=100) as call:
            call.settle(250)
        permit = await coordinator.acquire(A)
        blocked = anyio.Event()

        async def lend() -> None:
            await permit.lend(blocked.wait)

        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinator.run, B, anyio.lowlevel.checkpoint)  # gated
            tg.start_soon(lend)
            await wait_all_tasks_blocked()
            metrics = collect(reader)
            assert set(metrics) == set(INSTRUMENTS)
            for name, (kind, unit) in INSTRUMENTS.items():
                assert (metrics[name].kind, metrics[name].unit) == (kind, unit), name
                assert metrics[name].description, name
                keys = {tuple(sorted(dict(p.attributes))) for p in metrics[name].points}
                expected = {PROVIDER, MODEL} | ({OUTCOME} if kind is Histogram else set())
                assert keys == {tuple(sorted(expected))}, name
            assert metrics["lovely_coordinator.request.tokens"].monotonic is True
            for name in ("active", "queued", "lent"):
                assert metrics[f"lovely_coordinator.permits.{name}"].monotonic is False
            assert metrics["lovely_coordinator.permits.active"].value(A) == 0
            assert metrics["lovely_coordinator.permits.lent"].value(A) == 1
            assert metrics["lovely_coordinator.permits.queued"].value(B) == 1
            assert metrics["lovely_coordinator.gate.open"].value(A) == 1
            assert metrics["lovely_coordinator.gate.open"].value(B) == 0
            assert metrics["lovely_coordinator.request.tokens"].value(A) == 250
            assert metrics["lovely_coordinator.budget.requests_available"].value(
                A
            ) == pytest.approx(59, abs=0.5)
            # It drew its estimate (100) and settled at 250: 750 left (and refilling).
            assert metrics["lovely_coordinator.budget.tokens_available"].value(A) == pytest.approx(
                750, abs=5
            )
            assert metrics["lovely_coordinator.budget.tokens_available"].value(B) is None
            coordinator.open_tuple(B)
            blocked.set()
        permit.release()
        histogram = collect(reader)["lovely_coordinator.permit.wait_time"]
        granted = histogram.value(A, outcome="granted")
        assert granted.count == 3  # the request, the permit, its reacquire
        assert list(granted.explicit_bounds) == list(WAIT_TIME_BUCKETS)
        assert histogram.value(B, outcome="granted").count == 1


@pytest.mark.anyio
async def test_wait_time_outcomes() -> None:
    with anyio.fail_after(10):
        coordinator, reader, _ = setup()
        holder = await coordinator.acquire(A)
        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinator.run, A, anyio.lowlevel.checkpoint)
            await wait_all_tasks_blocked()
            tg.cancel_scope.cancel()  # cancelled while queued
        reservation = coordinator.reserve(A, reject_on_closed_tuple=True)
        coordinator.close_tuple(A)  # rejects the queued foreground reservation
        with pytest.raises(TupleSuspendedError):
            await reservation.run(anyio.lowlevel.checkpoint)
        with pytest.raises(TupleSuspendedError):  # rejected at once
            await coordinator.acquire(A, reject_on_closed_tuple=True)
        holder.release()
        histogram = collect(reader)["lovely_coordinator.permit.wait_time"]
        counts = {
            outcome: histogram.value(A, outcome=outcome).count
            for outcome in ("granted", "cancelled", "rejected")
        }
        assert counts == {"granted": 1, "cancelled": 1, "rejected": 2}
        granted = histogram.value(A, outcome="granted")
        assert granted.sum == 0.0  # granted at once
        assert granted.bucket_counts[0] == 1  # the bucket of exactly 0 s


@pytest.mark.anyio
async def test_idle_tuples_read_zero_and_uninstrument_stops_everything() -> None:
    with anyio.fail_after(10):
        coordinator, reader, uninstrument = setup()
        permit = await coordinator.acquire(A)
        assert collect(reader)["lovely_coordinator.permits.active"].value(A) == 1
        permit.release()
        metrics = collect(reader)
        assert metrics["lovely_coordinator.permits.active"].value(A) == 0  # not absent
        assert metrics["lovely_coordinator.gate.open"].value(A) == 1
        uninstrument()
        uninstrument()  # idempotent
        assert coordinator._scheduler.observer is None
        await coordinator.acquire(A)
        metrics = collect(reader)
        assert metrics["lovely_coordinator.permit.wait_time"].value(A, outcome="granted").count == 1
        assert "lovely_coordinator.permits.active" not in metrics


@pytest.mark.anyio
async def test_coordinators_sharing_a_meter_provider() -> None:
    with anyio.fail_after(10):
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        agents, bash, pool = (create_agent_coordinator(2) for _ in range(3))
        instrument(agents, meter_provider=provider)
        instrument(bash, meter_provider=provider)
        instrument(pool, meter_provider=provider, attributes={"lovely_coordinator.pool": "x"})
        held = [await agents.acquire(A), await bash.acquire(A), await pool.acquire(A)]
        bash.close_tuple(A)
        metrics = collect(reader)
        active = metrics["lovely_coordinator.permits.active"]
        assert active.value(A) == 2  # the two without attributes add up
        assert active.value(A, **{"lovely_coordinator.pool": "x"}) == 1
        assert metrics["lovely_coordinator.gate.open"].value(A) == 0  # closed in one of them
        for permit in held:
            permit.release()


class Monotonic:
    """``time.monotonic`` where the core reads it, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.anyio
async def test_a_long_wait_is_a_span_under_the_callers_span(
    spans: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Monotonic()
    for module in ("_agents.lending", "_agents.instruments"):
        monkeypatch.setattr(f"lovely_coordinator.{module}.monotonic", clock)
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    with anyio.fail_after(10):
        coordinator, _reader, _ = setup(tracer_provider=provider, wait_span_threshold=0.05)
        holder = await coordinator.acquire(A)

        async def call() -> None:
            with tracer.start_as_current_span("sdk call"):
                async with coordinator.request(A):
                    pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_all_tasks_blocked()
            clock.now += 0.25  # the wait outlasts the threshold
            holder.release()
        async with coordinator.request(A):  # at once: no span
            pass
        finished = {span.name: span for span in exporter.get_finished_spans()}
        assert set(finished) == {"sdk call", WAIT_SPAN_NAME}
        wait, parent = finished[WAIT_SPAN_NAME], finished["sdk call"]
        assert wait.parent is not None
        assert wait.parent.span_id == parent.context.span_id
        assert wait.context.trace_id == parent.context.trace_id
        assert dict(wait.attributes or {}) == {
            PROVIDER: "openai",
            MODEL: "gpt-4o",
            OUTCOME: "granted",
            "lovely_coordinator.waited": 0.25,
        }
        assert wait.start_time is not None
        assert parent.start_time is not None
        assert (wait.end_time or 0) - wait.start_time == 250_000_000


@pytest.mark.anyio
async def test_a_rejected_wait_span_is_an_error_and_spans_can_be_off(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    with anyio.fail_after(10):
        coordinator, _reader, _ = setup(tracer_provider=provider, wait_span_threshold=0)
        coordinator.close_tuple(A)
        with pytest.raises(TupleSuspendedError):
            await coordinator.acquire(A, reject_on_closed_tuple=True)
        (span,) = exporter.get_finished_spans()
        assert span.status.status_code is StatusCode.ERROR
        quiet, _reader, _ = setup(tracer_provider=provider, wait_span_threshold=None)
        await quiet.acquire(B)
        assert len(exporter.get_finished_spans()) == 1


@pytest.mark.parametrize(
    ("threshold", "error"),
    [(-1, InvalidArgumentError), (float("inf"), InvalidArgumentError), (True, TypeError)],
)
def test_bad_arguments(threshold: Any, error: type[Exception]) -> None:
    coordinator = create_agent_coordinator(1)
    with pytest.raises(error, match=r"^wait_span_threshold must be"):
        instrument(coordinator, wait_span_threshold=threshold)
    with pytest.raises(InvalidArgumentTypeError, match=r"^coordinator must be"):
        instrument(object())  # type: ignore[arg-type]
    assert coordinator._scheduler.observer is None

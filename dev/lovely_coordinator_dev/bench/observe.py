"""Benchmarks of observing a coordinator (``python -m lovely_coordinator bench observe``,
also run by ``bench core --otel``).

1. The cost of OpenTelemetry instrumentation (``lovely-coordinator-opentelemetry`` with
   the SDK and an in-memory reader): the core's contended hand-off, instrumented against
   uninstrumented, interleaved in the same run. Skipped when the extension or the SDK is
   not installed.
2. The statistics endpoint's document with 100k waiters (permits, activated and inactive
   reservations, on open, closed and capped tuples): the snapshot under the lock, and the
   whole JSON body.
"""

from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from time import monotonic
from typing import Any

from lovely_coordinator._agents.coordinator import AgentCoordinator, create_agent_coordinator
from lovely_coordinator._agents.permits import AgentReservation
from lovely_coordinator._agents.statistics import snapshot
from lovely_coordinator._agents.waiting import waiters
from lovely_coordinator._base.types import ModelTuple

from . import Figure
from .core import _contended, _race

__all__ = ["run"]

_T = ModelTuple("bench", "model")


def _instrumented(
    limit: int, *, sdk: bool = True, spans: bool = False
) -> Callable[[], AbstractAsyncContextManager[object]]:
    # An optional extension distribution (mypy checks the core without it).
    instrument: Any = importlib.import_module("lovely_coordinator_opentelemetry").instrument
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    coordinator = create_agent_coordinator(limit)
    instrument(
        coordinator,
        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()])
        if sdk
        else NoOpMeterProvider(),
        tracer_provider=TracerProvider(),
        wait_span_threshold=0.1 if spans else None,
    )
    return lambda: coordinator.permit(_T)


def _plain(limit: int) -> Callable[[], AbstractAsyncContextManager[object]]:
    coordinator = create_agent_coordinator(limit)
    return lambda: coordinator.permit(_T)


def _otel_figures(quick: bool) -> list[Figure]:
    try:
        importlib.import_module("lovely_coordinator_opentelemetry")
        importlib.import_module("opentelemetry.sdk.metrics")
    except ImportError as exc:
        return [Figure("OpenTelemetry overhead", 0.0, "", note=f"skipped: {exc}")]
    tasks = 2_000 if quick else 20_000
    repeats = 3 if quick else 7
    plain, noop, metrics, spans = _race(
        [
            _contended(lambda: _plain(8), tasks),
            _contended(lambda: _instrumented(8, sdk=False), tasks),
            _contended(lambda: _instrumented(8), tasks),
            _contended(lambda: _instrumented(8, spans=True), tasks),
        ],
        repeats,
    )
    return [
        Figure(f"contended hand-off, {tasks} tasks, cap 8", plain / tasks * 1e6, "us/task"),
        Figure(
            "  instrumented, no-op meter / plain",
            noop / plain,
            "x",
            1.10,
            "the hooks and the extension's own work",
        ),
        Figure(
            "  instrumented, SDK metrics / plain",
            metrics / plain,
            "x",
            1.10,
            "one SDK histogram measurement per wait",
        ),
        Figure(
            "  instrumented, SDK metrics + spans / plain",
            spans / plain,
            "x",
            note="every wait here exceeds the 0.1 s span threshold",
        ),
    ]


def _fleet(waiters_count: int) -> tuple[AgentCoordinator, list[AgentReservation]]:
    """A coordinator with ``waiters_count`` waiters on 10 tuples: a full global cap,
    half the tuples closed or capped, a quarter of the waiters never activated."""
    coordinator = create_agent_coordinator(1)
    models = [ModelTuple("bench", f"m{i}") for i in range(10)]
    for model in models[:3]:
        coordinator.close_tuple(model, reopen_after=3600)
    for model in models[3:5]:
        coordinator.set_tuple_limit(model, 1)
    blocker = coordinator.reserve(_T)
    blocker.activate()  # takes the one slot: everyone else waits
    kept = [blocker]
    for i in range(waiters_count):
        reservation = coordinator.reserve(models[i % len(models)])
        if i % 4:
            reservation.activate()
        kept.append(reservation)
    return coordinator, kept


def _snapshot_figures(quick: bool) -> list[Figure]:
    count = 10_000 if quick else 100_000
    coordinator, _kept = _fleet(count)
    assert coordinator.queued_count == count
    best_snapshot = best_document = float("inf")
    for _ in range(3 if quick else 7):
        gc.collect()
        start = time.perf_counter()
        with coordinator._lock:
            snapshot(coordinator._scheduler, coordinator._clock, coordinator.resident_count)
            waiters(coordinator._scheduler, coordinator._clock.now(), monotonic())
        best_snapshot = min(best_snapshot, time.perf_counter() - start)
        start = time.perf_counter()
        coordinator._document()
        best_document = min(best_document, time.perf_counter() - start)
    return [
        Figure(f"statistics snapshot with {count} waiters", best_snapshot * 1e3, "ms", 50),
        Figure("  the whole JSON document", best_document * 1e3, "ms", 50),
    ]


def run(quick: bool) -> list[Figure]:
    """All figures of the observe section (``quick``: smaller sizes, for a smoke run)."""
    return [*_otel_figures(quick), *_snapshot_figures(quick)]

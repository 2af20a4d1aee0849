"""OpenTelemetry metrics and wait spans for a lovely-coordinator (CONTRACT §7).

:func:`instrument` registers two things with a coordinator:

* a ``lovely_coordinator.Instrument`` (the core's permit-lifecycle hooks) that records each
  wait in the ``lovely_coordinator.permit.wait_time`` histogram, each settlement in the
  ``lovely_coordinator.request.tokens`` counter, and, for a wait that lasted at least
  ``wait_span_threshold`` seconds, a span covering it, parented to whatever span was
  current where the caller started waiting (an SDK's own span around the call, say), so
  waits show in traces where they happened;
* observable instruments (counts, gates, budgets) whose callbacks read
  ``coordinator.statistics()`` when a reader collects: nothing runs on the hot path.

The OpenTelemetry API cannot remove an instrument from a meter, and a meter hands back
the instrument it already has when one of the same name is created again (ignoring new
callbacks). So instruments are created once per meter provider and shared: each
:func:`instrument` call adds a *registration* that the shared callbacks read, and the
returned uninstrument removes it. Identical attribute sets from two registrations (two
coordinators with the same tuples, without ``attributes`` to tell them apart) are
combined: counts add up, a gate reads closed if any of them is, a budget reads its
smallest available amount.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Final, Generic, TypeVar
from weakref import WeakKeyDictionary

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import SpanKind, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from lovely_coordinator import (
    AgentCoordinator,
    Instrument,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    TupleStatistics,
)

__all__ = [
    "DEFAULT_WAIT_SPAN_THRESHOLD",
    "MODEL",
    "OUTCOME",
    "PROVIDER",
    "WAIT_SPAN_NAME",
    "WAIT_TIME_BUCKETS",
    "instrument",
]

PROVIDER: Final = "gen_ai.provider.name"
MODEL: Final = "gen_ai.request.model"
OUTCOME: Final = "outcome"
WAIT_SPAN_NAME: Final = "lovely_coordinator.permit.wait"
DEFAULT_WAIT_SPAN_THRESHOLD: Final = 0.1
# Explicit bucket boundaries (seconds) advised for the wait-time histogram: 0 on its own
# (granted at once), then from milliseconds to the minutes a closed gate can last.
WAIT_TIME_BUCKETS: Final = (
    0.0,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

_SCOPE: Final = "lovely_coordinator"
_THRESHOLD_MESSAGE: Final = "wait_span_threshold must be None or a finite number of seconds >= 0"

Attributes = dict[str, AttributeValue]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lovely-coordinator-opentelemetry")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return ""


def instrument(
    coordinator: AgentCoordinator,
    *,
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
    wait_span_threshold: float | None = DEFAULT_WAIT_SPAN_THRESHOLD,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Callable[[], None]:
    """Record ``coordinator``'s metrics (and long waits as spans) until uninstrumented.

    Args:
        coordinator: the coordinator to observe.
        meter_provider: where the metrics go (default: the global meter provider, which
            should then be set before this call).
        tracer_provider: where wait spans go (default: the global tracer provider).
        wait_span_threshold: a wait that lasted at least this many seconds becomes a span
            (``None``: no spans).
        attributes: extra attributes for every measurement and span, e.g.
            ``{"lovely_coordinator.pool": "bash"}`` to tell two coordinators apart.

    Returns:
        An idempotent uninstrument: the coordinator is no longer observed by this call.

    Raises:
        InvalidArgumentTypeError: ``coordinator`` is not an ``AgentCoordinator``.
        InvalidArgumentError: a bad ``wait_span_threshold``.
    """
    if not isinstance(coordinator, AgentCoordinator):
        raise InvalidArgumentTypeError("coordinator must be an AgentCoordinator")
    threshold = _threshold(wait_span_threshold)
    extra = dict(attributes or {})
    shared = _shared_metrics(meter_provider)
    tracer = trace.get_tracer(_SCOPE, _version(), tracer_provider=tracer_provider)
    hooks = _WaitInstrument(shared, tracer, threshold, extra)
    remove = coordinator.add_instrument(hooks)
    return shared.register(_Registration(coordinator, extra), remove)


def _threshold(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(_THRESHOLD_MESSAGE)
    if not math.isfinite(value) or value < 0:
        raise InvalidArgumentError(_THRESHOLD_MESSAGE)
    return float(value)


def _tuple_attributes(model_tuple: ModelTuple, extra: Attributes) -> Attributes:
    return {PROVIDER: model_tuple.provider, MODEL: model_tuple.model, **extra}


class _WaitInstrument(Instrument):
    """The core hooks: wait times, settled tokens and long-wait spans."""

    def __init__(
        self,
        shared: _SharedMetrics,
        tracer: trace.Tracer,
        threshold: float | None,
        extra: Attributes,
    ) -> None:
        self._wait_time = shared.wait_time
        self._tokens = shared.tokens
        self._tracer = tracer
        self._threshold = threshold
        self._extra = extra
        # Where each queued wait started (its caller's context): the parent of its span.
        # Hooks run under the coordinator's lock, so this needs no lock of its own.
        self._parents: dict[object, Context] = {}
        self._attributes: dict[tuple[ModelTuple, str], Attributes] = {}

    def wait_started(self, wait: object, model_tuple: ModelTuple) -> None:
        if self._threshold is not None:
            self._parents[wait] = otel_context.get_current()

    def wait_ended(
        self, wait: object, model_tuple: ModelTuple, outcome: str, waited: float
    ) -> None:
        parent = self._parents.pop(wait, None) if self._parents else None
        key = (model_tuple, outcome)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = self._attributes[key] = {
                **_tuple_attributes(model_tuple, self._extra),
                OUTCOME: outcome,
            }
        self._wait_time.record(waited, attributes, parent)
        if self._threshold is not None and waited >= self._threshold:
            self._span(parent, attributes, outcome, waited)

    def _span(
        self, parent: Context | None, attributes: Attributes, outcome: str, waited: float
    ) -> None:
        end = time.time_ns()
        span = self._tracer.start_span(
            WAIT_SPAN_NAME,
            context=parent if parent is not None else otel_context.get_current(),
            kind=SpanKind.INTERNAL,
            attributes={**attributes, "lovely_coordinator.waited": waited},
            start_time=end - int(waited * 1e9),
        )
        if outcome == "rejected":
            span.set_status(StatusCode.ERROR, "rejected by the coordinator")
        span.end(end_time=end)

    def tokens_settled(self, model_tuple: ModelTuple, tokens: int) -> None:
        key = (model_tuple, "")
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = self._attributes[key] = _tuple_attributes(model_tuple, self._extra)
        self._tokens.add(tokens, attributes)


class _Registration:
    """One instrument() call, as the shared observable callbacks see it."""

    __slots__ = ("coordinator", "extra", "seen")

    def __init__(self, coordinator: AgentCoordinator, extra: Attributes) -> None:
        self.coordinator = coordinator
        self.extra = extra
        self.seen: dict[ModelTuple, None] = {}  # tuples reported once: idle ones read 0

    def readings(self) -> Iterable[tuple[ModelTuple, TupleStatistics | None]]:
        listed = {t.tuple: t for t in self.coordinator.statistics().tuples}
        self.seen.update(dict.fromkeys(listed))
        for model_tuple in self.seen:
            yield model_tuple, listed.get(model_tuple)


_Read = Callable[[TupleStatistics | None], float | None]


_R = TypeVar("_R", bound=Hashable)
_S = TypeVar("_S")


class _Registry(Generic[_R]):
    """The registrations of instruments shared per meter provider (the OpenTelemetry API
    cannot remove an instrument, so each ``instrument*()`` call registers with them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registrations: dict[_R, None] = {}

    def register(self, registration: _R, remove: Callable[[], None]) -> Callable[[], None]:
        """Add ``registration``; the idempotent uninstrument returned calls ``remove`` (the
        hook on the observed object) and takes the registration out."""
        with self._lock:
            self._registrations[registration] = None
        done = False

        def uninstrument() -> None:
            nonlocal done
            if not done:
                done = True
                remove()
                with self._lock:
                    self._registrations.pop(registration, None)

        return uninstrument

    def registrations(self) -> list[_R]:
        """The registrations now, for a collector's callback."""
        with self._lock:
            return list(self._registrations)


class _PerProvider(Generic[_S]):
    """One ``build(provider)`` per meter provider (``None``: the global one), kept as long
    as the provider lives."""

    def __init__(self, build: Callable[[MeterProvider], _S]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._built: WeakKeyDictionary[MeterProvider, _S] = WeakKeyDictionary()

    def __call__(self, provider: MeterProvider | None) -> _S:
        resolved = provider if provider is not None else metrics.get_meter_provider()
        with self._lock:
            built = self._built.get(resolved)
            if built is None:
                built = self._built[resolved] = self._build(resolved)
            return built


class _SharedMetrics(_Registry[_Registration]):
    """The instruments of one meter provider, shared by its registrations."""

    def __init__(self, provider: MeterProvider | None) -> None:
        super().__init__()
        meter = metrics.get_meter(_SCOPE, _version(), meter_provider=provider)
        self.wait_time = meter.create_histogram(
            "lovely_coordinator.permit.wait_time",
            unit="s",
            description="How long permits and model requests waited, from enqueue to "
            "grant, cancellation or rejection",
            explicit_bucket_boundaries_advisory=WAIT_TIME_BUCKETS,
        )
        self.tokens = meter.create_counter(
            "lovely_coordinator.request.tokens",
            unit="{token}",
            description="Tokens settled by model requests (their reported usage)",
        )

        def count(read: _Read) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _options: self._observe(read, sum)

        def smallest(read: _Read) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _options: self._observe(read, min)

        meter.create_observable_up_down_counter(
            "lovely_coordinator.permits.active",
            [count(lambda t: 0 if t is None else t.active)],
            unit="{permit}",
            description="Slots taken: held permits and model requests on a slot of their own",
        )
        meter.create_observable_up_down_counter(
            "lovely_coordinator.permits.queued",
            [count(lambda t: 0 if t is None else t.queued)],
            unit="{waiter}",
            description="Waiters: permits, reservations, model requests and reacquires",
        )
        meter.create_observable_up_down_counter(
            "lovely_coordinator.permits.lent",
            [count(lambda t: 0 if t is None else t.lent)],
            unit="{permit}",
            description="Permits lent while their holders wait (reacquiring ones included)",
        )
        meter.create_observable_gauge(
            "lovely_coordinator.gate.open",
            [smallest(lambda t: 1 if t is None or t.open else 0)],
            unit="1",
            description="1 while the tuple's gate is open, 0 while it is closed",
        )
        meter.create_observable_gauge(
            "lovely_coordinator.budget.tokens_available",
            [smallest(lambda t: None if t is None else t.tokens_available)],
            unit="{token}",
            description="Tokens the tuple's budget holds now (negative: a debt)",
        )
        meter.create_observable_gauge(
            "lovely_coordinator.budget.requests_available",
            [smallest(lambda t: None if t is None else t.requests_available)],
            unit="{request}",
            description="Requests the tuple's budget holds now (negative: a debt)",
        )

    def _observe(
        self, read: _Read, combine: Callable[[Iterable[float]], float]
    ) -> list[Observation]:
        values: dict[tuple[tuple[str, AttributeValue], ...], list[float]] = {}
        attributes: dict[tuple[tuple[str, AttributeValue], ...], Attributes] = {}
        for registration in self.registrations():
            for model_tuple, statistics in registration.readings():
                value = read(statistics)
                if value is None:
                    continue
                tagged = _tuple_attributes(model_tuple, registration.extra)
                key = tuple(sorted(tagged.items(), key=lambda item: item[0]))
                values.setdefault(key, []).append(value)
                attributes[key] = tagged
        return [Observation(combine(found), attributes[key]) for key, found in values.items()]


_shared_metrics = _PerProvider(_SharedMetrics)

"""OpenTelemetry for lovely-coordinator: metrics of every wait, gate and budget, and spans
for long waits (CONTRACT §7).

``uninstrument = instrument(coordinator, meter_provider=provider)`` — see :func:`instrument`
and the README for every instrument, unit and attribute; :func:`instrument_fleet` records a
``RedisFleet``'s admissions and fleet-wide view.
"""

from ._fleet import FLEET as FLEET
from ._fleet import instrument_fleet as instrument_fleet
from ._instrument import DEFAULT_WAIT_SPAN_THRESHOLD as DEFAULT_WAIT_SPAN_THRESHOLD
from ._instrument import MODEL as MODEL
from ._instrument import OUTCOME as OUTCOME
from ._instrument import PROVIDER as PROVIDER
from ._instrument import WAIT_SPAN_NAME as WAIT_SPAN_NAME
from ._instrument import WAIT_TIME_BUCKETS as WAIT_TIME_BUCKETS
from ._instrument import instrument as instrument

__all__ = [
    "DEFAULT_WAIT_SPAN_THRESHOLD",
    "FLEET",
    "MODEL",
    "OUTCOME",
    "PROVIDER",
    "WAIT_SPAN_NAME",
    "WAIT_TIME_BUCKETS",
    "instrument",
    "instrument_fleet",
]

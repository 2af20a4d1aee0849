"""The README's python example runs as pasted and instruments the global coordinator."""

from __future__ import annotations

from lovely_coordinator_dev.testing.readme import Readme, run_example

README = Readme.of(__file__)

# What the README says comes first: the application sets the global meter provider.
_BEFORE = """
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
"""

# Then one call is granted, and the reader sees its wait; then it is uninstrumented.
_AFTER = """
import anyio
from lovely_coordinator import ModelTuple

async def main() -> None:
    async with get_agent_coordinator().permit(ModelTuple("openai", "gpt-4o")):
        pass

anyio.run(main)
data = reader.get_metrics_data()
for rm in data.resource_metrics:
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            for point in m.data.data_points:
                print(m.name, dict(point.attributes)["gen_ai.request.model"], point.count)
uninstrument()
uninstrument()  # idempotent
"""


def test_the_example_runs_as_pasted() -> None:
    (block,) = README.blocks()
    printed = run_example(_BEFORE + block + _AFTER)
    # One wait, granted at once: one measurement of the wait-time histogram.
    assert printed.splitlines() == ["lovely_coordinator.permit.wait_time gpt-4o 1"]

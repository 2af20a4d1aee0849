"""examples/prometheus_example.py runs and serves the §7 metrics in Prometheus' format,
rendered by OpenTelemetry's Prometheus exporter (nothing here writes that format)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import httpx
import pytest

EXAMPLE = Path(__file__).parent.parent / "examples" / "prometheus_example.py"

# Metric names after the exporter's conversion (units as suffixes, counters as _total).
NAMES = [
    "lovely_coordinator_permit_wait_time_seconds_bucket",
    "lovely_coordinator_permit_wait_time_seconds_count",
    "lovely_coordinator_permits_active",
    "lovely_coordinator_permits_queued",
    "lovely_coordinator_permits_lent",
    "lovely_coordinator_gate_open",
    "lovely_coordinator_budget_tokens_available",
    "lovely_coordinator_budget_requests_available",
    "lovely_coordinator_request_tokens_total",
]


def samples(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_example_serves_every_metric() -> None:
    with anyio.fail_after(60):
        async with await anyio.open_process(
            [sys.executable, str(EXAMPLE), "--port", "0", "--seconds", "30"]
        ) as process:
            assert process.stdout is not None
            line = b""
            async for chunk in process.stdout:
                line += chunk
                if b"\n" in line:
                    break
            url = line.decode().strip().removeprefix("metrics at ")
            assert url.startswith("http://127.0.0.1:")
            async with httpx.AsyncClient() as client:
                while True:  # until the fleet has been through a closed gate and back
                    text = (await client.get(url)).text
                    if all(samples(text, name) for name in NAMES) and 'le="+Inf"' in text:
                        gate = samples(text, "lovely_coordinator_gate_open")
                        if any(s.endswith(" 0.0") for s in gate):
                            break
                    await anyio.sleep(0.2)
            process.terminate()
    assert "# TYPE lovely_coordinator_permit_wait_time_seconds histogram" in text
    assert "# TYPE lovely_coordinator_request_tokens_total counter" in text
    assert "# TYPE lovely_coordinator_gate_open gauge" in text
    for name in NAMES:
        for sample in samples(text, name):
            assert 'gen_ai_provider_name="' in sample, sample
            assert 'gen_ai_request_model="' in sample, sample
    waits = samples(text, "lovely_coordinator_permit_wait_time_seconds_count")
    assert all('outcome="' in sample for sample in waits)
    closed = [s for s in samples(text, "lovely_coordinator_gate_open") if s.endswith(" 0.0")]
    assert all('gen_ai_request_model="claude-sonnet-4"' in s for s in closed)

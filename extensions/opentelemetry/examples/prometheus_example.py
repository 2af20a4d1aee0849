"""A coordinator's metrics on a Prometheus endpoint, through OpenTelemetry.

    pip install lovely-coordinator-opentelemetry opentelemetry-sdk \\
        opentelemetry-exporter-prometheus
    python prometheus_example.py            # then: curl http://127.0.0.1:9464/metrics

OpenTelemetry's Prometheus exporter is a metric reader: it renders whatever the SDK has
collected when Prometheus scrapes, and prometheus_client serves it. A small simulated
fleet (a cap of 2, three models, one of them rate limited for a while) keeps the
coordinator busy. ``--port 0`` picks a free port; ``--seconds N`` stops after N seconds.
"""

from __future__ import annotations

import argparse
import random

import anyio
from lovely_coordinator_opentelemetry import instrument
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server

from lovely_coordinator import AgentCoordinator, create_agent_coordinator

MODELS = [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4"), ("google", "gemini-2.5-pro")]


async def agent(coordinator: AgentCoordinator, number: int) -> None:
    t = MODELS[number % len(MODELS)]
    while True:
        async with coordinator.request(t, tokens=400) as call:
            await anyio.sleep(random.uniform(0.05, 0.2))  # the provider answers
            call.settle(random.randint(100, 400))  # its reported usage


async def main(port: int, seconds: float | None) -> None:
    # Serve first: a port in use fails here, before anything else starts.
    server, _thread = start_http_server(port, addr="127.0.0.1")
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    coordinator = create_agent_coordinator(2)
    coordinator.set_budget(MODELS[0], requests_per_minute=120, tokens_per_minute=60_000)
    uninstrument = instrument(coordinator, meter_provider=provider)
    print(f"metrics at http://127.0.0.1:{server.server_port}/metrics", flush=True)
    try:
        with anyio.move_on_after(seconds if seconds is not None else float("inf")):
            async with anyio.create_task_group() as tg:
                for number in range(6):
                    tg.start_soon(agent, coordinator, number)
                while True:  # a rate limit now and then: the gate closes for a while
                    await anyio.sleep(2)
                    coordinator.close_tuple(MODELS[1], reopen_after=1.5)
    finally:
        uninstrument()
        provider.shutdown()
        server.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=9464)
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args()
    anyio.run(main, args.port, args.seconds)

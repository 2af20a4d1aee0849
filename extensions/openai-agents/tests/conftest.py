"""The Agents SDK runs on asyncio only (it starts asyncio tasks for streamed runs and tool
calls), so the async tests of this extension run under anyio's plugin with the asyncio
backend alone. They share the local fake provider of ``lovely_coordinator_limits.testing``.
Tracing is off: the SDK would otherwise export traces to OpenAI from a background thread.
"""

from __future__ import annotations

import pytest
from agents import set_tracing_disabled
from lovely_coordinator_limits.testing import fake_provider as fake_provider
from lovely_coordinator_limits.testing import fake_provider_server as fake_provider_server
from lovely_coordinator_limits.testing import fake_provider_url as fake_provider_url

set_tracing_disabled(True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

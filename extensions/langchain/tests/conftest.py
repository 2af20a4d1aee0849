"""LangChain's async code (and LangGraph's) runs on asyncio only (``asyncio.gather``,
``run_in_executor``, asyncio tasks for tool calls), so the async tests of this extension run
under anyio's plugin with the asyncio backend alone. They share the local fake provider of
``lovely_coordinator_limits.testing``."""

from __future__ import annotations

import pytest
from lovely_coordinator_limits.testing import fake_provider as fake_provider
from lovely_coordinator_limits.testing import fake_provider_server as fake_provider_server
from lovely_coordinator_limits.testing import fake_provider_url as fake_provider_url


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

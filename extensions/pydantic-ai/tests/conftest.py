"""pydantic-ai runs its agents on asyncio only (it calls ``asyncio.create_task``), so the
tests of this extension are asyncio-only: marked ``pytest.mark.asyncio`` (pytest-asyncio in
strict mode), and any anyio-marked test gets the asyncio backend alone. The tests that need
a provider on the wire share the local fake provider of ``lovely_coordinator_limits.testing``."""

from __future__ import annotations

import pytest
from lovely_coordinator_limits.testing import fake_provider as fake_provider
from lovely_coordinator_limits.testing import fake_provider_server as fake_provider_server
from lovely_coordinator_limits.testing import fake_provider_url as fake_provider_url


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

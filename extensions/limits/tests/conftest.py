"""Every async test of this extension runs on asyncio and on trio; the SDK tests share
one local fake provider per module (the fixtures of ``lovely_coordinator_limits.testing``)."""

from __future__ import annotations

import pytest
from lovely_coordinator_limits.testing import fake_provider as fake_provider
from lovely_coordinator_limits.testing import fake_provider_server as fake_provider_server
from lovely_coordinator_limits.testing import fake_provider_url as fake_provider_url


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend

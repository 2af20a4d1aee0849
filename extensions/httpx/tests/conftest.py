"""Every async test of this extension runs on asyncio and on trio, against one local fake
provider per test module (the fixtures of ``lovely_coordinator_limits.testing``; its
scripts and records are reset for each test)."""

from __future__ import annotations

import pytest
from lovely_coordinator_limits.testing import FakeProvider
from lovely_coordinator_limits.testing import fake_provider as fake_provider
from lovely_coordinator_limits.testing import fake_provider_server as fake_provider_server
from lovely_coordinator_limits.testing import fake_provider_url as fake_provider_url


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


@pytest.fixture
def provider(fake_provider: FakeProvider) -> FakeProvider:
    """Short name for the shared fixture, as these tests use it everywhere."""
    return fake_provider


@pytest.fixture
def url(fake_provider_url: str) -> str:
    return fake_provider_url

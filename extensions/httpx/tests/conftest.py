"""Every async test of this extension runs on asyncio and on trio, against one local fake
provider per test module (its scripts and records are reset for each test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lovely_coordinator_limits.testing import FakeProvider, serve


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeProvider, str]]:
    provider = FakeProvider()
    with serve(provider) as url:
        yield provider, url


@pytest.fixture
def provider(served: tuple[FakeProvider, str]) -> FakeProvider:
    served[0].reset()
    return served[0]


@pytest.fixture
def url(served: tuple[FakeProvider, str]) -> str:
    return served[1]

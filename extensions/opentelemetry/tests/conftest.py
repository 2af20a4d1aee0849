"""Every async test of this extension runs on asyncio and on trio."""

from __future__ import annotations

import pytest


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend

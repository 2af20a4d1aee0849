"""pydantic-ai runs its agents on asyncio only (it calls ``asyncio.create_task``), so the
tests of this extension are asyncio-only: marked ``pytest.mark.asyncio`` (pytest-asyncio in
strict mode), and any anyio-marked test gets the asyncio backend alone."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

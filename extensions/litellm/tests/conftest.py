"""litellm runs on asyncio only (its clients and caches are asyncio's), so the async tests
of this extension run under anyio's plugin with the asyncio backend alone. They share the
local fake provider of ``lovely_coordinator_limits.testing``.

litellm fetches its model price map from the network when imported unless told to use
the copy it ships; the tests never touch the network.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from lovely_coordinator_limits.testing import fake_provider as fake_provider
from lovely_coordinator_limits.testing import (
    fake_provider_server as fake_provider_server,
)
from lovely_coordinator_limits.testing import fake_provider_url as fake_provider_url


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

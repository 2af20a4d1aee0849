"""Private implementation of :mod:`lovely_coordinator.redis` (asyncio-only)."""

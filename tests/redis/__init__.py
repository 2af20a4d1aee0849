"""Tests of lovely_coordinator/_redis, on real throwaway servers (asyncio-only)."""

"""Lanes (CONTRACT §2): one activation per key under a global cap — the pure state
machine, its configuration and outcomes, and the async runner."""

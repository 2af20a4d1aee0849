"""Servers and processes the tests and benchmarks start themselves (never mocks)."""

"""Servers and processes the tests and benchmarks start themselves (never mocks), and the
runner of the READMEs' examples (``readme``)."""

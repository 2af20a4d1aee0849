"""Servers and processes the tests and benchmarks start themselves (never mocks), the
runner of the READMEs' examples (``readme``) and the waits the extensions' tests share
(``waits``)."""

"""The README's examples run as pasted, each in a fresh interpreter with warnings as errors."""

from __future__ import annotations

from lovely_coordinator_dev.testing.readme import Readme, run_example

README = Readme.of(__file__)
BLOCKS = README.blocks()


def test_the_readme_has_its_examples() -> None:
    assert BLOCKS
    assert README.installs("extensions/limits")


def test_the_example_waits_out_the_limit() -> None:
    (example,) = BLOCKS
    assert run_example(example).splitlines() == ["limited; gate open: False", "ok"]

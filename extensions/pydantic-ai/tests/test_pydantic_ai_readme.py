"""The README's examples run as pasted, each in a fresh interpreter with warnings as errors."""

from __future__ import annotations

from lovely_coordinator_dev.testing.readme import Readme, run_example

README = Readme.of(__file__)
BLOCKS = README.blocks()


def test_the_readme_has_its_examples() -> None:
    assert BLOCKS
    assert README.installs("extensions/pydantic-ai")


def test_the_tree_example() -> None:
    assert run_example(BLOCKS[0]).splitlines() == [
        '{"research":"two designs compared"}',
        "0 sub-agents left",
    ]


def test_the_fallback_recipe() -> None:
    assert run_example(BLOCKS[1]).splitlines() == ["big answered", "small answered"]

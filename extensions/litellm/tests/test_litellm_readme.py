"""The examples run as pasted (this extension's README, and the litellm part of the
project README's "Using it with your framework"), in a fresh interpreter with warnings as
errors (but for a warning pydantic gives about litellm's own TypedDicts)."""

from __future__ import annotations

from lovely_coordinator_dev.testing.readme import Readme, python_blocks, run_example

README = Readme.of(__file__)
BLOCKS = README.blocks()
PROJECT_README = Readme(README.path.parents[2] / "README.md")


def _run(source: str) -> str:
    # Importing litellm alone takes seconds.
    return run_example(source, timeout=110, ignore=["ignore:Item:UserWarning"])


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) == 2
    assert README.installs("extensions/litellm")


def test_the_example_keeps_both_providers_within_the_cap() -> None:
    assert _run(BLOCKS[0]).splitlines() == ["8 answers", "at most 2 calls at once"]


def test_the_sync_example_keeps_threads_within_the_cap() -> None:
    assert _run(BLOCKS[1]).splitlines() == ["6 answers, at most 2 at once"]


def test_the_project_readme_example() -> None:
    section = PROJECT_README.section("litellm")
    (block,) = python_blocks(section)
    assert _run(block).splitlines() == ["2"]
    assert "Covers:" in section
    assert "Does not cover:" in section

"""The examples run as pasted (this extension's README, and the OpenAI Agents SDK part of the
project README's "Using it with your framework"), each in a fresh interpreter with
warnings as errors."""

from __future__ import annotations

from lovely_coordinator_dev.testing.readme import Readme, python_blocks, run_example

README = Readme.of(__file__)
BLOCKS = README.blocks()
PROJECT_README = Readme(README.path.parents[2] / "README.md")


def _run(source: str) -> str:
    return run_example(source, timeout=90)


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) == 1
    assert README.installs("extensions/openai-agents")


def test_the_delegating_agent_example_runs_at_cap_1() -> None:
    assert _run(BLOCKS[0]).splitlines() == ["compared", "3 calls, at most 1 at once"]


def test_the_project_readme_example() -> None:
    section = PROJECT_README.section("OpenAI Agents SDK")
    (block,) = python_blocks(section)
    assert _run(block).splitlines() == ["done", "3"]
    assert "Covers:" in section
    assert "Does not cover:" in section

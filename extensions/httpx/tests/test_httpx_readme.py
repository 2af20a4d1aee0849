"""The README's examples run as pasted, each in a fresh interpreter with warnings as errors."""

from __future__ import annotations

from lovely_coordinator_dev.testing.readme import Readme, run_example

README = Readme.of(__file__)
BLOCKS = README.blocks()


def test_the_readme_has_its_examples() -> None:
    assert BLOCKS
    assert README.installs("extensions/httpx")


def test_the_example_keeps_fanned_out_calls_within_the_cap() -> None:
    example, _ = BLOCKS
    lines = run_example(example).splitlines()
    assert lines[:2] == ["at the provider, at most 4 calls at once", "claude says ok"]
    prefix, _, rest = lines[2].partition(": ")
    assert prefix == "learned budget left"
    left = float(rest.split()[0])
    assert 580 <= left <= 600


def test_the_threads_example_keeps_sync_calls_within_the_cap() -> None:
    _, example = BLOCKS
    assert run_example(example).splitlines() == ["16 answers, at most 3 at once"]

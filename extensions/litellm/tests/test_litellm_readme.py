"""The examples run as pasted (this extension's README, and the litellm part of the
project README's "Using it with your framework"), in a fresh interpreter with warnings as
errors (but for a warning pydantic gives about litellm's own TypedDicts)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
PROJECT_README = README.parents[2] / "README.md"


def _project_section(title: str) -> str:
    text = PROJECT_README.read_text(encoding="utf-8")
    start = text.index(f"\n### {title}")
    end = re.search(r"\n##+ ", text[start + 1 :])
    return text[start : start + 1 + end.start()] if end else text[start:]


def _run(source: str) -> str:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-W", "ignore:Item:UserWarning", "-c", source],
        capture_output=True,
        text=True,
        timeout=110,  # importing litellm alone takes seconds
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) == 2
    commands = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert any(
        "pip install -e" in command and "extensions/litellm" in command for command in commands
    )


def test_the_example_keeps_both_providers_within_the_cap() -> None:
    assert _run(BLOCKS[0]).splitlines() == ["8 answers", "at most 2 calls at once"]


def test_the_sync_example_keeps_threads_within_the_cap() -> None:
    assert _run(BLOCKS[1]).splitlines() == ["6 answers, at most 2 at once"]


def test_the_project_readme_example() -> None:
    section = _project_section("litellm")
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert _run(block).splitlines() == ["2"]
    assert "Covers:" in section
    assert "Does not cover:" in section

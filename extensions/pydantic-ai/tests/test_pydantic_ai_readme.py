"""The README's examples run as pasted, each in a fresh interpreter with warnings as errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def _run(source: str) -> str:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", source],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_readme_has_its_examples() -> None:
    assert BLOCKS
    commands = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert any(
        "pip install -e" in command and "extensions/pydantic-ai" in command for command in commands
    )


def test_the_tree_example() -> None:
    assert _run(BLOCKS[0]).splitlines() == [
        '{"research":"two designs compared"}',
        "0 sub-agents left",
    ]


def test_the_fallback_recipe() -> None:
    assert _run(BLOCKS[1]).splitlines() == ["big answered", "small answered"]

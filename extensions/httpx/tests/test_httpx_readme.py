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
        "pip install -e" in command and "extensions/httpx" in command for command in commands
    )


def test_the_example_keeps_fanned_out_calls_within_the_cap() -> None:
    example, _ = BLOCKS
    lines = _run(example).splitlines()
    assert lines[:2] == ["at the provider, at most 4 calls at once", "claude says ok"]
    prefix, _, rest = lines[2].partition(": ")
    assert prefix == "learned budget left"
    left = float(rest.split()[0])
    assert 580 <= left <= 600


def test_the_threads_example_keeps_sync_calls_within_the_cap() -> None:
    _, example = BLOCKS
    assert _run(example).splitlines() == ["16 answers, at most 3 at once"]

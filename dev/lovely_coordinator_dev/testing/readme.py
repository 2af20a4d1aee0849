"""Running a README's examples as pasted, for the extensions' README tests.

Each example runs in a fresh interpreter with warnings as errors, so it passes only as a
reader would run it: nothing is imported, configured or patched by the test run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, final

__all__ = ["Readme", "python_blocks", "run_example"]

_PYTHON: Final = re.compile(r"```python\n(.*?)```", re.DOTALL)
_SH: Final = re.compile(r"```sh\n(.*?)```", re.DOTALL)
_HEADING: Final = re.compile(r"\n##+ ")


def python_blocks(text: str) -> list[str]:
    """The ``python`` code blocks of a Markdown ``text``, in order."""
    return _PYTHON.findall(text)


@final
class Readme:
    """A README: its text, its ``python`` examples, its ``sh`` commands and its sections."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = path.read_text(encoding="utf-8")

    @classmethod
    def of(cls, test_file: str) -> Readme:
        """The README.md of the distribution whose ``tests/`` folder holds ``test_file``
        (pass ``__file__``)."""
        return cls(Path(test_file).resolve().parent.parent / "README.md")

    def blocks(self) -> list[str]:
        """The ``python`` code blocks, in order."""
        return python_blocks(self.text)

    def commands(self) -> list[str]:
        """The ``sh`` code blocks, in order."""
        return _SH.findall(self.text)

    def installs(self, path: str) -> bool:
        """Whether one of its ``sh`` blocks installs ``path`` editable (``pip install -e``)."""
        return any("pip install -e" in command and path in command for command in self.commands())

    def section(self, title: str) -> str:
        """The section under the ``### title`` heading, up to the next heading.

        Raises:
            ValueError: no such heading.
        """
        start = self.text.index(f"\n### {title}")
        end = _HEADING.search(self.text, start + 1)
        return self.text[start : end.start()] if end else self.text[start:]


def run_example(source: str, *, timeout: float = 60, ignore: Sequence[str] = ()) -> str:
    """Run ``source`` in a fresh interpreter with warnings as errors and return what it
    printed.

    Args:
        source: the example's code.
        timeout: seconds it may take (``subprocess.TimeoutExpired`` past them).
        ignore: ``-W`` filters that the example may break, e.g. ``"ignore:Item:UserWarning"``
            for a warning a dependency gives on import.

    Raises:
        AssertionError: the example exited with an error; the message is its stderr.
    """
    filters = [arg for spec in ignore for arg in ("-W", spec)]
    result = subprocess.run(
        [sys.executable, "-W", "error", *filters, "-c", source],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(result.stderr)
    return result.stdout

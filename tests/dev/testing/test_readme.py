"""lovely_coordinator_dev.testing.readme: what the extensions' README tests read and run."""

from __future__ import annotations

from pathlib import Path

import pytest
from lovely_coordinator_dev.testing.readme import Readme, python_blocks, run_example

_TEXT = """# Title

```sh
pip install -e ./extensions/x
```

### One

```python
print("one")
```

#### Deeper

```python
print("deeper")
```

### Two

```python
print("two")
```
"""


@pytest.fixture
def readme(tmp_path: Path) -> Readme:
    (tmp_path / "tests").mkdir()
    (tmp_path / "README.md").write_text(_TEXT, encoding="utf-8")
    return Readme.of(str(tmp_path / "tests" / "test_x_readme.py"))


def test_blocks_and_commands_in_order(readme: Readme) -> None:
    assert readme.blocks() == ['print("one")\n', 'print("deeper")\n', 'print("two")\n']
    assert readme.commands() == ["pip install -e ./extensions/x\n"]
    assert readme.installs("extensions/x")
    assert not readme.installs("extensions/y")


def test_a_section_ends_at_the_next_heading_of_any_level(readme: Readme) -> None:
    one = readme.section("One")
    assert one.startswith("\n### One")
    assert python_blocks(one) == ['print("one")\n']
    assert python_blocks(readme.section("Two")) == ['print("two")\n']  # the last one: to the end
    with pytest.raises(ValueError, match="substring not found"):
        readme.section("Three")


def test_run_example_returns_what_it_printed() -> None:
    assert run_example('print("ok")') == "ok\n"


def test_run_example_fails_with_the_example_stderr() -> None:
    with pytest.raises(AssertionError, match=r"^boom\n$"):
        run_example('import sys; print("boom", file=sys.stderr); raise SystemExit(1)')


def test_warnings_are_errors_but_for_the_filters_given() -> None:
    source = 'import warnings; warnings.warn("Item x", UserWarning); print("warned")'
    with pytest.raises(AssertionError, match="UserWarning: Item x"):
        run_example(source)
    assert run_example(source, ignore=["ignore:Item:UserWarning"]) == "warned\n"

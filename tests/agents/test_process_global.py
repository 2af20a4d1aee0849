"""The process-global coordinators: one per process, shared by every copy of the library."""

from __future__ import annotations

import ast
import importlib
import logging
import shutil
import subprocess
import sys
import textwrap
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import lovely_coordinator
from lovely_coordinator import (
    AGENT_COORDINATOR_VERSION,
    AgentCoordinator,
    IncompatibleCoordinatorError,
    InvalidArgumentError,
    create_agent_coordinator,
    get_agent_coordinator,
    get_bash_coordinator,
)
from lovely_coordinator._agents.process_global import (
    _ATTRIBUTES,
    _METHODS,
    AGENT_KEY,
    BASH_KEY,
    _warned,
)
from lovely_coordinator._base.errors import InvalidArgumentTypeError

AGENT_MESSAGE = r"^Incompatible process-global Lovely Agents coordinator$"
BASH_MESSAGE = r"^Incompatible process-global Lovely Bash coordinator$"
LIMIT_MESSAGE = r"^max_concurrency must be a positive integer$"

GETTERS = [
    pytest.param(get_agent_coordinator, AGENT_KEY, AGENT_MESSAGE, id="agent"),
    pytest.param(get_bash_coordinator, BASH_KEY, BASH_MESSAGE, id="bash"),
]


@pytest.fixture(autouse=True)
def fresh_globals() -> Iterator[None]:
    """Each test starts without process-global coordinators; the originals come back after."""
    keys: tuple[str, ...] = (AGENT_KEY, BASH_KEY)
    saved = {key: sys.modules.pop(key) for key in keys if key in sys.modules}
    yield
    for key in keys:
        sys.modules.pop(key, None)
    sys.modules.update(saved)
    _warned.clear()


@pytest.mark.parametrize(("get", "key", "message"), GETTERS)
def test_the_first_call_creates_later_calls_share(get: Any, key: str, message: str) -> None:
    assert key not in sys.modules
    coordinator = get(2)
    assert isinstance(coordinator, AgentCoordinator)
    assert coordinator.max_concurrency == 2
    sentinel = sys.modules[key]
    assert isinstance(sentinel, types.ModuleType)
    assert sentinel.AGENT_COORDINATOR_VERSION == AGENT_COORDINATOR_VERSION
    assert coordinator.version == AGENT_COORDINATOR_VERSION
    assert get() is coordinator
    assert get(7) is coordinator  # the argument of a later call is ignored
    assert coordinator.max_concurrency == 2


@pytest.mark.anyio
async def test_the_bash_pool_is_independent_of_the_agent_pool() -> None:
    with anyio.fail_after(5):
        agents = get_agent_coordinator(1)
        bash = get_bash_coordinator(1)
        assert agents is not bash
        async with agents.permit(("openai", "gpt-4o")):
            assert (agents.active_count, bash.active_count) == (1, 0)
            # The agent pool is full; the bash pool still grants at once.
            async with bash.permit(("bash", "sh")):
                assert (agents.active_count, bash.active_count) == (1, 1)
        agents.close_tuple(("openai", "gpt-4o"))
        assert not agents.is_tuple_open(("openai", "gpt-4o"))
        assert bash.is_tuple_open(("openai", "gpt-4o"))
        agents.open_tuple(("openai", "gpt-4o"))


@pytest.mark.parametrize(("get", "key", "message"), GETTERS)
@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (0, InvalidArgumentError),
        (-1, InvalidArgumentError),
        (True, InvalidArgumentTypeError),
        (2.0, InvalidArgumentTypeError),
        ("4", InvalidArgumentTypeError),
    ],
)
def test_the_argument_is_validated_on_every_call(
    get: Any, key: str, message: str, bad: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=LIMIT_MESSAGE):
        get(bad)
    assert key not in sys.modules  # a failed first call creates nothing
    coordinator = get(3)
    with pytest.raises(error, match=LIMIT_MESSAGE):
        get(bad)
    assert get() is coordinator
    assert coordinator.max_concurrency == 3


class _Shaped:
    """Looks like a coordinator to the shape check, but is not one."""

    def __init__(self, version: object, missing: str = "") -> None:
        self.version = version
        for name in ("max_concurrency", "active_count", "queued_count", "resident_count"):
            setattr(self, name, 0)
        for name in dir(AgentCoordinator):
            if not name.startswith("_") and callable(getattr(AgentCoordinator, name)):
                setattr(self, name, lambda *args, **kwargs: None)
        if missing:
            delattr(self, missing)


def _sentinel(key: str, coordinator: object, version: object = AGENT_COORDINATOR_VERSION) -> Any:
    sentinel = types.ModuleType(key)
    sentinel.AGENT_COORDINATOR_VERSION = version  # type: ignore[attr-defined]
    sentinel.coordinator = coordinator  # type: ignore[attr-defined]
    return sentinel


def _incompatible_sentinels(key: str) -> list[object]:
    good = create_agent_coordinator()
    return [
        _sentinel(key, good, version=AGENT_COORDINATOR_VERSION + 1),  # a newer library
        _sentinel(key, good, version=True),  # bool is not a version
        _sentinel(key, _Shaped(AGENT_COORDINATOR_VERSION + 1)),
        _sentinel(key, _Shaped(AGENT_COORDINATOR_VERSION, missing="reserve")),
        _sentinel(key, _Shaped(AGENT_COORDINATOR_VERSION, missing="with_lent_permit")),
        _sentinel(key, _Shaped(AGENT_COORDINATOR_VERSION, missing="resident_count")),
        _sentinel(key, None),
        types.ModuleType(key),  # no version, no coordinator
        good,  # the coordinator itself, not a sentinel module
        object(),
    ]


@pytest.mark.parametrize(("get", "key", "message"), GETTERS)
def test_an_incompatible_sentinel_is_refused(get: Any, key: str, message: str) -> None:
    for sentinel in _incompatible_sentinels(key):
        sys.modules[key] = sentinel  # type: ignore[assignment]
        with pytest.raises(IncompatibleCoordinatorError, match=message):
            get()
        assert sys.modules[key] is sentinel  # left alone


@pytest.mark.parametrize(("get", "key", "message"), GETTERS)
def test_a_compatible_foreign_sentinel_is_used(get: Any, key: str, message: str) -> None:
    shaped = _Shaped(AGENT_COORDINATOR_VERSION)
    sys.modules[key] = _sentinel(key, shaped)
    assert get() is shaped
    # A sentinel replaced afterwards is checked again, not taken from a cache.
    sys.modules[key] = _sentinel(key, shaped, version=AGENT_COORDINATOR_VERSION + 1)
    with pytest.raises(IncompatibleCoordinatorError, match=message):
        get()


def test_the_shape_check_covers_what_the_first_party_extensions_call() -> None:
    # Issue 17: an older copy passed the check without learn_budget, tuple_statistics or
    # add_instrument, and the extensions then failed on it with an AttributeError. Every
    # public attribute read off something named ``*coordinator`` in their source counts.
    root = Path(__file__).resolve().parents[2] / "extensions"
    called: dict[str, str] = {}
    for path in sorted(root.glob("*/lovely_coordinator_*/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or node.attr.startswith("_"):
                continue
            owner = node.value
            name = (
                owner.id
                if isinstance(owner, ast.Name)
                else owner.attr
                if isinstance(owner, ast.Attribute)
                else ""
            )
            if name.lstrip("_").endswith("coordinator"):
                called.setdefault(node.attr, str(path.relative_to(root)))
    assert {"request", "learn_budget", "add_instrument"} <= called.keys()  # the scan works
    missing = {n: where for n, where in called.items() if n not in _METHODS + _ATTRIBUTES}
    assert not missing, f"add these to _global._METHODS: {missing}"


def test_concurrent_first_calls_from_threads_agree() -> None:
    threads = 16
    barrier = threading.Barrier(threads)
    results: list[object] = []

    def first_call() -> None:
        barrier.wait()
        results.append(get_agent_coordinator())

    workers = [threading.Thread(target=first_call) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=10)
    assert len(results) == threads
    assert all(result is results[0] for result in results)
    assert sys.modules[AGENT_KEY].coordinator is results[0]


@pytest.fixture
def vendored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A second, independent copy of the library, imported as ``vendored_lovely``."""
    shutil.copytree(
        Path(lovely_coordinator.__file__).parent,
        tmp_path / "vendored_lovely",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield importlib.import_module("vendored_lovely")
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "vendored_lovely"]:
            del sys.modules[name]


@pytest.mark.anyio
@pytest.mark.parametrize("vendored_first", [False, True], ids=["ours-first", "vendored-first"])
async def test_a_vendored_copy_shares_the_coordinators(
    vendored: types.ModuleType, vendored_first: bool
) -> None:
    with anyio.fail_after(5):
        # It really is another copy: its classes are not ours.
        assert vendored.AgentCoordinator is not AgentCoordinator
        if vendored_first:
            theirs = vendored.get_agent_coordinator(2)
            ours = get_agent_coordinator()
        else:
            ours = get_agent_coordinator(2)
            theirs = vendored.get_agent_coordinator()
        assert ours is theirs
        assert vendored.get_bash_coordinator() is get_bash_coordinator()
        assert vendored.get_bash_coordinator() is not ours
        # Both copies schedule against the one pool.
        async with ours.permit(("openai", "gpt-4o")), theirs.permit(("openai", "gpt-4o")):
            assert ours.active_count == 2
            assert ours.statistics().active == 2


def test_a_reloaded_library_shares_the_coordinators() -> None:
    # In a fresh interpreter: dropping every module of the package and importing it
    # again is what a hot reload does; it must not be done in this test process.
    code = textwrap.dedent(
        """
        import sys
        import lovely_coordinator
        before = lovely_coordinator.get_agent_coordinator(3)
        bash = lovely_coordinator.get_bash_coordinator()
        old_class = lovely_coordinator.AgentCoordinator
        for name in [n for n in sys.modules if n.split(".")[0] == "lovely_coordinator"]:
            del sys.modules[name]
        import lovely_coordinator as reloaded
        assert reloaded.AgentCoordinator is not old_class
        assert reloaded.get_agent_coordinator() is before
        assert reloaded.get_bash_coordinator() is bash
        assert before.max_concurrency == 3
        print("shared")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(lovely_coordinator.__file__).parent.parent,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "shared\n"


@pytest.mark.anyio
async def test_a_vendored_copy_shares_the_current_permit_and_the_error_classes(
    vendored: types.ModuleType,
) -> None:
    # Regression: the copies shared the coordinator but not the current permit, and
    # `except CoordinatorError` in one copy missed the other copy's errors.
    with anyio.fail_after(5):
        assert vendored.CoordinatorError is lovely_coordinator.CoordinatorError
        assert vendored.InvalidArgumentError is InvalidArgumentError
        assert vendored.UsageError is lovely_coordinator.UsageError
        with pytest.raises(lovely_coordinator.CoordinatorError):
            vendored.create_agent_coordinator(0)
        ours = get_agent_coordinator()
        theirs = vendored.get_agent_coordinator()
        async with ours.permit(("openai", "gpt-4o")) as permit:
            assert vendored.current_permit() is permit
            assert theirs.current_permit() is permit

            async def child() -> None:
                assert vendored.current_permit() is permit

            await theirs.with_lent_permit(child)  # the other copy lends our permit
            assert permit.held


def test_an_ignored_max_concurrency_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="lovely_coordinator"):
        get_agent_coordinator(4)
        get_agent_coordinator()  # the default: nothing was asked, nothing ignored
        get_agent_coordinator(4)  # the same value: nothing ignored
        assert caplog.records == []
        get_agent_coordinator(8)
        get_agent_coordinator(8)
        get_agent_coordinator(16)
    [record] = caplog.records
    message = record.getMessage()
    assert "max_concurrency=8" in message
    assert "max_concurrency=4" in message
    assert get_agent_coordinator().max_concurrency == 4

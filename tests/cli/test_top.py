"""_cli/top: ``python -m lovely_coordinator top URL`` and ``demo --top``, as a person sees them.

The live view runs in a real terminal: tmux starts it (on a private tmux server),
``capture-pane`` reads the screen, ``send-keys`` types ``q`` or Ctrl-C. The endpoint it
watches is served by the test's own event loop. Screens are polled until they show what
is expected, within a deadline (a terminal has no event to wait on). Without tmux the
tests skip, except under ``CI=true``, where they fail (CI installs tmux).
"""

from __future__ import annotations

import os
import pty
import shutil
import sys
import termios
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import pytest
from anyio import wait_all_tasks_blocked
from lovely_coordinator_dev.demo.simulated import demo_top
from rich.console import Console

from lovely_coordinator import AgentCoordinator, ModelTuple, create_agent_coordinator
from lovely_coordinator._base.json_endpoint import serve_document
from lovely_coordinator._cli import top as _top
from lovely_coordinator._cli.top import _snapshot, main, render, seconds, watch

A = ModelTuple("openai", "gpt-4o")
B = ModelTuple("anthropic", "claude-sonnet-4")
C = ModelTuple("google", "gemini-2.5-pro")


def test_durations_read_as_people_say_them() -> None:
    assert [seconds(s) for s in (0, 3.21, 9.96, 14.2, 59.4, 125, 3725, -1)] == [
        "0.0 s",
        "3.2 s",
        "10.0 s",
        "14 s",
        "59 s",
        "2 min 05 s",
        "1 h 02 min",
        "0.0 s",
    ]


def text(document: dict[str, object] | None, error: str | None = None) -> str:
    console = Console(width=120, record=True, force_terminal=False)
    console.print(render(document, "http://127.0.0.1:1", error))
    return console.export_text()


def test_render_shows_durations_never_clock_values() -> None:
    document = {
        "max_concurrency": 2,
        "active": 2,
        "queued": 3,
        "lent": 1,
        "residents": 0,
        "waiters_per_tuple": 100,
        "tuples": [
            {
                "tuple": ["anthropic", "claude-sonnet-4"],
                "active": 0,
                "queued": 2,
                "lent": 0,
                "limit": None,
                "open": False,
                "reopens_at": 1092.11,
                "reopens_in": 14.2,
                "requests_available": None,
                "tokens_available": None,
            },
            {
                "tuple": ["openai", "gpt-4o"],
                "active": 2,
                "queued": 1,
                "lent": 1,
                "limit": 2,
                "open": True,
                "reopens_at": None,
                "reopens_in": None,
                "requests_available": 12.4,
                "tokens_available": 30500.0,
            },
        ],
        "waiters": [
            {"tuple": ["anthropic", "claude-sonnet-4"], "acceptance_order": 4, "waited": 3.21,
             "reason": "gate", "kind": "permit"},
            {"tuple": ["anthropic", "claude-sonnet-4"], "acceptance_order": 7, "waited": 0.5,
             "reason": "inactive", "kind": "reservation"},
            {"tuple": ["openai", "gpt-4o"], "acceptance_order": 9, "waited": 61.0,
             "reason": "tuple_limit", "kind": "request"},
        ],
    }  # fmt: skip
    screen = text(document)
    assert "active 2/2 · queued 3 · lent 1 · residents 0" in screen
    assert "closed · reopens in 14 s" in screen
    assert "12 req · 30k tok" in screen
    assert "1092" not in screen  # the raw clock value is never shown
    lines = screen.splitlines()
    longest = lines.index("longest waiters")
    waiting = [line.split() for line in lines[longest + 2 : longest + 5]]
    assert [line[:3] for line in waiting] == [
        ["waited", "1", "min"],  # the longest first
        ["waited", "3.2", "s"],
        ["waited", "0.5", "s"],
    ]
    assert "tuple at its limit of 2" in screen
    assert "gate closed, reopens in 14 s" in screen
    assert "reservation not activated" in screen


def test_render_when_the_endpoint_is_unreachable_or_idle() -> None:
    assert "cannot reach http://127.0.0.1:1: refused; retrying" in text(None, "refused")
    idle = {
        "max_concurrency": 4,
        "active": 0,
        "queued": 0,
        "lent": 0,
        "residents": 0,
        "tuples": [],
        "waiters": [],
        "waiters_per_tuple": 100,
    }
    screen = text(idle)
    assert "no tuple has work" in screen
    assert "nobody waits" in screen


@asynccontextmanager
async def fleet() -> AsyncIterator[tuple[AgentCoordinator, str]]:
    """A served coordinator whose waiters wait for a gate, a slot and activation."""
    coordinator = create_agent_coordinator(1)
    coordinator.set_budget(C, requests_per_minute=60, tokens_per_minute=30_000)
    holder = await coordinator.acquire(A)
    coordinator.close_tuple(B, reopen_after=120)
    reservation = coordinator.reserve(C)
    async with anyio.create_task_group() as tg:
        tg.start_soon(coordinator.run, B, anyio.lowlevel.checkpoint)
        tg.start_soon(coordinator.run, A, anyio.lowlevel.checkpoint)
        await wait_all_tasks_blocked()
        async with coordinator.serve_statistics() as (host, port):
            yield coordinator, f"http://{host}:{port}"
        tg.cancel_scope.cancel()
    holder.release()
    reservation.cancel()


@pytest.mark.slow
@pytest.mark.anyio
async def test_top_once_prints_one_snapshot() -> None:
    with anyio.fail_after(30):
        async with fleet() as (_coordinator, url):
            done = await anyio.run_process(
                [sys.executable, "-m", "lovely_coordinator", "top", "--once", url],
                env={**os.environ, "COLUMNS": "120"},
            )
        out = done.stdout.decode()
        assert "anthropic/claude-sonnet-4" in out
        assert "closed · reopens in" in out
        assert "all 1 slots taken" in out


@pytest.mark.slow
@pytest.mark.anyio
async def test_top_arguments_are_checked() -> None:
    with anyio.fail_after(30):
        done = await anyio.run_process(
            [sys.executable, "-m", "lovely_coordinator", "top", "127.0.0.1:1"], check=False
        )
        assert done.returncode == 2
        assert b"must start with http://" in done.stderr
        done = await anyio.run_process(
            [sys.executable, "-m", "lovely_coordinator", "top", "--once", "http://127.0.0.1:1"],
            check=False,
        )
        assert done.returncode == 1
        assert b"cannot reach" in done.stdout


# -- in a real terminal ---------------------------------------------------------------------


def _tmux() -> str:
    found = shutil.which("tmux")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is required in CI (.ci/run installs it)")
        pytest.skip("tmux is not installed")
    return found


class Terminal:
    """A tmux pane on a private tmux server, running one command."""

    def __init__(self, tmux: str, name: str) -> None:
        self.tmux = tmux
        self.socket = f"lovely-test-{os.getpid()}-{name}"

    async def run(self, *args: str) -> str:
        done = await anyio.run_process([self.tmux, "-L", self.socket, *args])
        return done.stdout.decode()

    async def start(self, command: str) -> None:
        # The shell prints the exit status and stays, so the last screen can be read.
        await self.run(
            "new-session", "-d", "-s", "top", "-x", "120", "-y", "40",
            f"{command}; echo EXIT=$?; sleep 600",
        )  # fmt: skip

    async def screen(self) -> str:
        return await self.run("capture-pane", "-p", "-t", "top")

    async def wait_for(self, seen: Callable[[str], bool], seconds: float = 30) -> str:
        with anyio.fail_after(seconds):
            while True:
                screen = await self.screen()
                if seen(screen):
                    return screen
                await anyio.sleep(0.1)

    async def keys(self, *keys: str) -> None:
        await self.run("send-keys", "-t", "top", *keys)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.run_process([self.tmux, "-L", self.socket, "kill-server"], check=False)


@asynccontextmanager
async def terminal(name: str) -> AsyncIterator[Terminal]:
    term = Terminal(_tmux(), name)
    try:
        yield term
    finally:
        await term.close()


def command(*args: str) -> str:
    # The terminal's own size, not one inherited from the test's environment.
    return " ".join(["env -u COLUMNS -u LINES", sys.executable, "-m", "lovely_coordinator", *args])


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("leave", ["q", "C-c"])
async def test_top_live_in_a_terminal(leave: str) -> None:
    with anyio.fail_after(60):
        async with fleet() as (coordinator, url), terminal(f"live-{leave}") as term:
            await term.start(command("top", url, "--interval", "0.2"))
            screen = await term.wait_for(lambda s: "longest waiters" in s and "waited" in s)
            assert f"lovely-coordinator · {url}" in screen
            assert "active 1/1 · queued 3 · lent 0 · residents 0" in screen
            rows = {line.split()[0]: line for line in screen.splitlines() if "/" in line[:30]}
            assert "closed · reopens in" in rows["anthropic/claude-sonnet-4"]
            assert "60 req · 30k tok" in rows["google/gemini-2.5-pro"]
            assert "gate closed, reopens in" in screen
            assert "all 1 slots taken" in screen
            assert "reservation not activated" in screen
            reopens_at = coordinator.statistics().tuples[0].reopens_at
            assert reopens_at is not None
            assert f"{reopens_at:.0f}" not in screen  # never a raw clock value
            # It refreshes: a change shows up without a keypress.
            coordinator.open_tuple(B)
            await term.wait_for(lambda s: "closed · reopens in" not in s and "open" in s)
            await term.keys(leave)
            screen = await term.wait_for(lambda s: "EXIT=" in s)
            assert "EXIT=0" in screen
            assert "longest waiters" not in screen  # the alternate screen is gone


@pytest.mark.slow
@pytest.mark.anyio
async def test_top_shows_an_unreachable_endpoint_and_keeps_trying() -> None:
    with anyio.fail_after(60):
        async with terminal("unreachable") as term:
            await term.start(command("top", "http://127.0.0.1:9", "--interval", "0.2"))
            screen = await term.wait_for(lambda s: "cannot reach" in s)
            assert "retrying" in screen
            await term.keys("q")
            assert "EXIT=0" in await term.wait_for(lambda s: "EXIT=" in s)


@pytest.mark.slow
@pytest.mark.anyio
async def test_demo_top_shows_the_fleet_and_exits_0() -> None:
    with anyio.fail_after(120):
        async with terminal("demo") as term:
            await term.start(command("demo", "--top", "--scale", "1"))
            seen = await term.wait_for(
                lambda s: "anthropic/claude-sonnet-4" in s and "EXIT" not in s
            )
            assert "lovely-coordinator · http://127.0.0.1:" in seen
            assert "q or Ctrl-C to leave" in seen
            screen = await term.wait_for(lambda s: "EXIT=" in s, seconds=90)
            assert "EXIT=0" in screen
            assert "finished in" in screen  # the demo's report, after the live view


# -- the same code paths in this process (so coverage sees them) --------------------------


@pytest.mark.anyio
async def test_watch_refreshes_until_done() -> None:
    with anyio.fail_after(30):
        async with fleet() as (_coordinator, url):
            calls = 0

            def done() -> bool:
                nonlocal calls
                calls += 1
                return calls > 5

            assert await anyio.to_thread.run_sync(partial(watch, url, 0.02, done=done)) == 0
            assert calls == 6  # (not a terminal here: rich draws no live screen to read)


@pytest.mark.anyio
async def test_watch_leaves_on_q_typed_in_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    with anyio.fail_after(30):
        async with fleet() as (_coordinator, url):
            master, replica = pty.openpty()
            with os.fdopen(replica, "r") as terminal:
                monkeypatch.setattr(sys, "stdin", terminal)
                before = termios.tcgetattr(replica)
                typed = anyio.Event()

                def done() -> bool:  # type q once the view is up
                    if not typed.is_set():
                        os.write(master, b"xq")
                        anyio.from_thread.run_sync(typed.set)
                    return False

                assert await anyio.to_thread.run_sync(partial(watch, url, 0.05, done=done)) == 0
                assert termios.tcgetattr(replica) == before  # the terminal is restored
            os.close(master)


@pytest.mark.slow
@pytest.mark.anyio
async def test_main_and_demo_top_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    with anyio.fail_after(60):
        async with fleet() as (_coordinator, url):
            assert await anyio.to_thread.run_sync(main, ["--once", url]) == 0
        assert "all 1 slots taken" in capsys.readouterr().out
        assert main(["--once", "http://127.0.0.1:9"]) == 1
        assert "cannot reach" in capsys.readouterr().out
        for bad in (["127.0.0.1:9"], ["http://x", "--interval", "0"]):
            with pytest.raises(SystemExit) as exit_:
                main(bad)
            assert exit_.value.code == 2
        assert await anyio.to_thread.run_sync(demo_top, 0.05, "asyncio") == 0
        out = capsys.readouterr().out
        assert "finished in" in out


def test_without_rich(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)  # as if not installed
    assert main(["--once", "http://127.0.0.1:9"]) == 2
    assert demo_top(1.0, "asyncio") == 2
    assert "pip install 'lovely-coordinator[top]'" in capsys.readouterr().err


def test_render_shows_names_as_written_never_as_markup() -> None:
    # Regression: names went through rich markup, so "gpt-4o[beta]" showed as "gpt-4o"
    # and a name with "[/]" crashed the view (MarkupError).
    odd = ["openai", "gpt-4o[beta]"]
    closing = ["lab[bold]", "m[/]"]
    document = {
        "max_concurrency": 1,
        "active": 1,
        "queued": 1,
        "lent": 0,
        "residents": 0,
        "waiters_per_tuple": 100,
        "tuples": [
            {"tuple": t, "active": 1, "queued": 0, "lent": 0, "limit": None, "open": True,
             "reopens_at": None, "reopens_in": None, "requests_available": None,
             "tokens_available": None}
            for t in (odd, closing)
        ],
        "waiters": [
            {"tuple": closing, "acceptance_order": 2, "waited": 1.0, "reason": "capacity",
             "kind": "[red]permit"},
        ],
    }  # fmt: skip
    console = Console(width=160, record=True, force_terminal=False)
    console.print(render(document, "http://[::1]:8123"))
    screen = console.export_text()
    assert "openai/gpt-4o[beta]" in screen
    assert screen.count("lab[bold]/m[/]") == 2
    assert "[red]permit" in screen
    assert "http://[::1]:8123" in screen


@pytest.mark.anyio
@pytest.mark.parametrize(
    "body",
    [b"[]", b'{"active": 1}', b'{"max_concurrency": "x", "tuples": 5}', b"null", b"<html>"],
    ids=["list", "fields", "types", "null", "not-json"],
)
async def test_top_shows_a_document_it_cannot_read_and_keeps_trying(body: bytes) -> None:
    # Regression: JSON that is not a statistics document (another service's URL, say)
    # crashed the view with a KeyError or TypeError traceback.
    with anyio.fail_after(30):
        async with serve_document("127.0.0.1", 0, "/statistics", lambda: body) as (host, port):
            url = f"http://{host}:{port}"
            console = Console(width=120, record=True, force_terminal=False)
            screen, ok = await anyio.to_thread.run_sync(_snapshot, f"{url}/statistics", url, 5.0)
            console.print(screen)
            assert not ok
            assert f"cannot reach {url}" in console.export_text()
            calls = 0

            def done() -> bool:
                nonlocal calls
                calls += 1
                return calls > 2

            assert await anyio.to_thread.run_sync(partial(watch, url, 0.02, done=done)) == 0
            assert await anyio.to_thread.run_sync(main, ["--once", url]) == 1


@pytest.mark.anyio
async def test_top_refuses_a_document_larger_than_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Regression: the whole response was read into memory, however large.
    monkeypatch.setattr(_top, "MAX_DOCUMENT", 1000)
    body = b'{"pad": "' + b"x" * 5000 + b'"}'
    with anyio.fail_after(30):
        async with serve_document("127.0.0.1", 0, "/statistics", lambda: body) as (host, port):
            url = f"http://{host}:{port}"
            screen, ok = await anyio.to_thread.run_sync(_snapshot, f"{url}/statistics", url, 5.0)
            console = Console(width=120, record=True, force_terminal=False)
            console.print(screen)
            assert not ok
            assert "larger than 1000 bytes" in console.export_text()


@pytest.mark.anyio
async def test_top_shows_a_server_that_does_not_speak_http() -> None:
    # Regression: http.client's BadStatusLine (not an OSError) crashed the view.
    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(b"SSH-2.0-OpenSSH_9.6\r\n")

    with anyio.fail_after(30):
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, answer)
            url = f"http://127.0.0.1:{port}"
            screen, ok = await anyio.to_thread.run_sync(_snapshot, f"{url}/statistics", url, 5.0)
            assert await anyio.to_thread.run_sync(main, ["--once", url]) == 1
            tg.cancel_scope.cancel()
        console = Console(width=120, record=True, force_terminal=False)
        console.print(screen)
        assert not ok
        assert "BadStatusLine" in console.export_text()

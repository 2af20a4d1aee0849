"""``python -m lovely_coordinator top URL``: a live terminal view of ``serve_statistics()``.

It polls ``URL/statistics`` and redraws in place (rich's ``Live`` on the terminal's
alternate screen, like ``top``): per tuple its active, queued and lent work, its cap, its
gate ("closed · reopens in 14 s") and what its budget has left; then the longest waiters
and why they wait ("waited 3.2 s"). Times are shown as durations, never as clock values.
``q`` or Ctrl-C leaves. An unreachable endpoint, or a URL that answers something else
(not HTTP, not a statistics document, more than ``MAX_DOCUMENT`` bytes), is shown and
retried, never fatal.

Needs ``rich``: ``pip install 'lovely-coordinator[top]'``. ``demo --top`` runs the demo's
fleet with an endpoint and this view on it (``lovely_coordinator_dev.demo.simulated.demo_top``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

__all__ = ["NEEDS_RICH", "main", "render", "seconds", "watch"]

NEEDS_RICH: Final = "top needs rich: pip install 'lovely-coordinator[top]'"
LONGEST: Final = 10  # waiters shown
# The most of a response read: a URL that streams gigabytes is an error, not a crash.
MAX_DOCUMENT: Final = 64 * 1024 * 1024


def seconds(value: float) -> str:
    """A duration for people: ``3.2 s``, ``14 s``, ``2 min 05 s``, ``1 h 02 min``."""
    value = max(0.0, value)
    if value < 10:
        return f"{value:.1f} s"
    if value < 60:
        return f"{value:.0f} s"
    whole = int(value)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _amount(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.0f}k"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.1f}"


def _name(pair: list[str]) -> str:
    return f"{pair[0]}/{pair[1]}"


def _gate(entry: dict[str, Any]) -> Text:
    from rich.text import Text

    if entry["open"]:
        return Text("open", style="green")
    reopens_in = entry.get("reopens_in")
    if reopens_in is None:
        return Text("closed · until opened", style="red")
    return Text(f"closed · reopens in {seconds(reopens_in)}", style="red")


def _budget(entry: dict[str, Any]) -> str:
    parts = []
    if entry.get("requests_available") is not None:
        parts.append(f"{_amount(entry['requests_available'])} req")
    if entry.get("tokens_available") is not None:
        parts.append(f"{_amount(entry['tokens_available'])} tok")
    return " · ".join(parts) if parts else "-"


def _fleet(fleet: dict[str, Any], widest: int) -> list[RenderableType]:
    """The fleet's view (RedisFleet): members, and per tuple in flight, queued, budget."""
    from rich.table import Table
    from rich.text import Text

    state = "" if fleet["available"] else " · Redis unreachable: this member's share"
    heading = Text.assemble(
        ("fleet ", "bold"), Text(str(fleet["name"])), f" · {fleet['members']} members{state}"
    )
    table = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    for column in ("tuple", "in flight", "queued", "limit", "gate", "budget left"):
        table.add_column(column, justify="left" if column in ("tuple", "gate") else "right")
    table.columns[0].no_wrap = True
    table.columns[0].min_width = widest
    for entry in fleet["tuples"]:
        table.add_row(
            Text(_name(entry["tuple"])),
            Text(str(entry["in_flight"])),
            Text(str(entry["queued"])),
            Text("-" if entry["limit"] is None else str(entry["limit"])),
            _gate(entry),
            Text(_budget(entry)),
        )
    return [heading, table if fleet["tuples"] else Text("the fleet governs no tuple")]


def _why(waiter: dict[str, Any], tuples: dict[str, dict[str, Any]], limit: int) -> str:
    entry = tuples.get(_name(waiter["tuple"]), {})
    reason = waiter["reason"]
    if reason == "gate":
        reopens_in = entry.get("reopens_in")
        return "gate closed" + ("" if reopens_in is None else f", reopens in {seconds(reopens_in)}")
    if reason == "tuple_limit":
        return f"tuple at its limit of {entry.get('limit')}"
    if reason == "budget":
        return "budget exhausted"
    if reason == "inactive":
        return "reservation not activated"
    return f"all {limit} slots taken"


def render(document: dict[str, Any] | None, url: str, error: str | None = None) -> RenderableType:
    """The screen for one snapshot (``document`` is the endpoint's JSON).

    Everything the document says is shown as plain text, never read as rich markup: a
    model named ``gpt-4o[beta]`` shows as itself.

    Raises:
        KeyError, TypeError, AttributeError: ``document`` is not a statistics document.
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = Text.assemble(("lovely-coordinator", "bold"), f" · {url}")
    if document is None:
        return Group(title, Text(""), Text(f"cannot reach {url}: {error}; retrying", style="red"))
    limit = document["max_concurrency"]
    summary = Text.assemble(
        "active ",
        (str(document["active"]), "bold"),
        f"/{limit} · queued ",
        (str(document["queued"]), "bold"),
        f" · lent {document['lent']} · residents {document['residents']}",
    )
    tuples = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    for column, justify in (
        ("tuple", "left"),
        ("active", "right"),
        ("queued", "right"),
        ("lent", "right"),
        ("limit", "right"),
        ("gate", "left"),
        ("budget left", "left"),
    ):
        tuples.add_column(column, justify=justify)  # type: ignore[arg-type]
    by_name = {_name(t["tuple"]): t for t in document["tuples"]}
    names = [*by_name, *(_name(w["tuple"]) for w in document["waiters"])]
    widest = max(map(len, names), default=5)
    tuples.columns[0].no_wrap = True  # a narrow terminal wraps the other columns instead
    tuples.columns[0].min_width = widest
    for name, entry in by_name.items():
        tuples.add_row(
            Text(name),
            Text(str(entry["active"])),
            Text(str(entry["queued"])),
            Text(str(entry["lent"])),
            Text("-" if entry["limit"] is None else str(entry["limit"])),
            _gate(entry),
            Text(_budget(entry)),
        )
    waiting = sorted(document["waiters"], key=lambda w: -w["waited"])[:LONGEST]
    waiters = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    for column in ("how long", "tuple", "order", "kind", "why"):
        waiters.add_column(
            column, justify="right" if column == "order" else "left", no_wrap=column != "why"
        )
    waiters.columns[1].min_width = widest
    for waiter in waiting:
        waiters.add_row(
            Text(f"waited {seconds(waiter['waited'])}"),
            Text(_name(waiter["tuple"])),
            Text(str(waiter["acceptance_order"])),
            Text(str(waiter["kind"])),
            Text(_why(waiter, by_name, limit)),
        )
    parts: list[RenderableType] = [title, summary, Text("")]
    parts.append(tuples if by_name else Text("no tuple has work, a cap, a budget or a closed gate"))
    if isinstance(document.get("fleet"), dict):
        parts += [Text(""), *_fleet(document["fleet"], widest)]
    parts += [Text(""), Text("longest waiters", style="bold")]
    parts.append(waiters if waiting else Text("nobody waits"))
    parts += [Text(""), Text("q or Ctrl-C to leave", style="dim")]
    return Group(*parts)


def _statistics_url(url: str) -> str:
    return url if url.rstrip("/").endswith("/statistics") else url.rstrip("/") + "/statistics"


def _fetch(url: str, timeout: float) -> dict[str, Any]:
    """The endpoint's JSON object.

    Raises:
        OSError: unreachable, refused, an HTTP error.
        http.client.HTTPException: the server does not speak HTTP.
        ValueError: not JSON, not an object, or larger than ``MAX_DOCUMENT`` bytes.
    """
    with urllib.request.urlopen(url, timeout=timeout) as response:
        data = response.read(MAX_DOCUMENT + 1)
    if len(data) > MAX_DOCUMENT:
        raise ValueError(f"the response is larger than {MAX_DOCUMENT} bytes")
    document = json.loads(data)
    if not isinstance(document, dict):
        raise ValueError("the response is not a statistics document")
    return document


def _snapshot(endpoint: str, url: str, timeout: float) -> tuple[RenderableType, bool]:
    """The screen for ``endpoint``'s document now, and whether it could be read.

    Whatever the URL answers is shown, never raised: an endpoint that is down, JSON that
    is not a statistics document (another service's URL, say), a response too large.
    """
    try:
        document = _fetch(endpoint, timeout)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # Unreachable, refused, not HTTP, not JSON, too large.
        return render(None, url, f"{type(exc).__name__}: {exc}"), False
    try:
        return render(document, url), True
    except (KeyError, TypeError, AttributeError, ValueError):  # JSON of another shape
        return render(None, url, "the response is not a statistics document"), False


@contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """``wait(timeout)``: the next key pressed within ``timeout`` seconds, or None."""
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():

        def sleep(timeout: float) -> str | None:
            time.sleep(timeout)
            return None

        yield sleep
        return
    import termios
    import tty

    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)  # keys arrive one by one, unechoed; Ctrl-C still interrupts

    def wait(timeout: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode(errors="replace") if ready else None

    try:
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def watch(url: str, interval: float = 1.0, *, done: Callable[[], bool] | None = None) -> int:
    """Show ``url``'s statistics live until ``q``, Ctrl-C or ``done()``; returns 0."""
    from rich.console import Console
    from rich.live import Live

    endpoint = _statistics_url(url)
    console = Console()
    try:
        with (
            _keys() as key,
            Live(console=console, screen=True, auto_refresh=False, transient=False) as live,
        ):
            while True:
                live.update(_snapshot(endpoint, url, 2.0)[0], refresh=True)
                deadline = time.monotonic() + interval
                while (left := deadline - time.monotonic()) > 0:
                    if key(min(left, 0.1)) in ("q", "Q"):
                        return 0
                    if done is not None and done():
                        return 0
    except KeyboardInterrupt:
        return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lovely_coordinator top",
        description="A live view of a coordinator's serve_statistics() endpoint.",
    )
    parser.add_argument("url", help="the endpoint's base URL, e.g. http://127.0.0.1:8123")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error("--interval must be positive")
    if not args.url.startswith(("http://", "https://")):
        parser.error("the URL must start with http:// (or https://)")
    try:
        import rich  # noqa: F401
    except ImportError:
        print(NEEDS_RICH, file=sys.stderr)
        return 2
    if args.once:
        from rich.console import Console

        screen, ok = _snapshot(_statistics_url(args.url), args.url, 5.0)
        Console().print(screen)
        return 0 if ok else 1
    return watch(args.url, args.interval)

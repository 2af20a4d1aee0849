"""_agents/observe and _base/json_endpoint: serve_statistics(), a read-only JSON endpoint
(CONTRACT §7).

Real clients only: httpx for well-formed requests, raw TCP for garbage. Every test that
talks to the server checks afterwards that nothing changed (the scheduler's version and
statistics, its invariants) and that the server still answers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from anyio import wait_all_tasks_blocked

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    create_agent_coordinator,
)
from lovely_coordinator._agents import observe as _observe
from lovely_coordinator._base import json_endpoint as _statserver

A = ModelTuple("openai", "gpt-4o")
B = ModelTuple("anthropic", "claude-sonnet-4")
C = ModelTuple("google", "gemini-2.5-pro")


@asynccontextmanager
async def fleet() -> AsyncIterator[tuple[AgentCoordinator, str]]:
    """A coordinator with waiters of several kinds, served; yields it and the base URL."""
    coordinator = create_agent_coordinator(1)
    coordinator.set_budget(C, requests_per_minute=30, tokens_per_minute=9000)
    holder = await coordinator.acquire(A)
    coordinator.close_tuple(B, reopen_after=60)
    reservation = coordinator.reserve(C)
    async with anyio.create_task_group() as tg:
        tg.start_soon(coordinator.run, A, anyio.lowlevel.checkpoint)
        tg.start_soon(coordinator.run, B, anyio.lowlevel.checkpoint)
        await wait_all_tasks_blocked()
        async with coordinator.serve_statistics() as (host, port):
            assert host == "127.0.0.1"
            yield coordinator, f"http://{host}:{port}"
        coordinator.open_tuple(B)
        holder.release()
    reservation.cancel()


def state(coordinator: AgentCoordinator) -> tuple[int, Any]:
    """What serving may never change: the scheduler's version (every mutator moves it)
    and the statistics (without the seconds to a reopen, which time moves)."""
    coordinator._scheduler.check_invariants()
    statistics = coordinator.statistics()
    tuples = tuple(dataclasses.replace(t, reopens_in=None) for t in statistics.tuples)
    return coordinator._scheduler.version, dataclasses.replace(statistics, tuples=tuples)


async def raw(url: str, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; everything the server sends until it closes."""
    host, port = url.removeprefix("http://").split(":")
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(data)
        received = b""
        with anyio.fail_after(5):
            while True:
                try:
                    received += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return received


@pytest.mark.anyio
async def test_get_serves_statistics_and_the_waiters() -> None:
    with anyio.fail_after(10):
        async with fleet() as (coordinator, url), httpx.AsyncClient() as client:
            before = state(coordinator)
            response = await client.get(f"{url}/statistics")
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/json"
            assert response.headers["cache-control"] == "no-store"
            document = response.json()
            statistics = coordinator.statistics()
            assert document["max_concurrency"] == 1
            assert (document["active"], document["queued"], document["lent"]) == (1, 3, 0)
            assert document["residents"] == 0
            assert document["waiters_per_tuple"] == 100
            assert [t["tuple"] for t in document["tuples"]] == [
                list(t.tuple) for t in statistics.tuples
            ]
            by_tuple = {tuple(t["tuple"]): t for t in document["tuples"]}
            gated = by_tuple[tuple(B)]
            assert gated["open"] is False
            assert 0 < gated["reopens_in"] <= 60
            assert gated["reopens_at"] is not None
            budgeted = by_tuple[tuple(C)]
            assert budgeted["requests_available"] == pytest.approx(30, abs=1)
            assert budgeted["tokens_available"] == pytest.approx(9000, abs=10)
            assert set(budgeted) == {
                "tuple",
                "active",
                "queued",
                "lent",
                "limit",
                "open",
                "reopens_at",
                "reopens_in",
                "requests_available",
                "tokens_available",
            }
            waiters = [(tuple(w["tuple"]), w["reason"], w["kind"]) for w in document["waiters"]]
            assert waiters == [
                (tuple(B), "gate", "permit"),
                (tuple(C), "inactive", "reservation"),
                (tuple(A), "capacity", "permit"),
            ]
            orders = {tuple(w["tuple"]): w["acceptance_order"] for w in document["waiters"]}
            assert orders[tuple(C)] == 2  # the reservation; then the two runs (3 and 4)
            assert {orders[tuple(A)], orders[tuple(B)]} == {3, 4}
            assert all(0 <= w["waited"] < 10 for w in document["waiters"])
            assert state(coordinator) == before


@pytest.mark.anyio
async def test_other_methods_paths_and_head() -> None:
    with anyio.fail_after(10):
        async with fleet() as (coordinator, url), httpx.AsyncClient() as client:
            before = state(coordinator)
            head = await client.head(f"{url}/statistics")
            assert head.status_code == 200
            assert head.content == b""
            assert int(head.headers["content-length"]) > 0
            for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
                response = await client.request(method, f"{url}/statistics")
                assert response.status_code == 405, method
                assert response.headers["allow"] == "GET, HEAD"
                assert response.json() == {
                    "error": "method not allowed; the statistics are read-only"
                }
            posted = await client.post(f"{url}/statistics", json={"max_concurrency": 99})
            assert posted.status_code == 405
            assert posted.headers["connection"] == "close"
            for path in ("/", "/statistics/", "/statistics/x", "/stats", "/close_tuple"):
                response = await client.get(f"{url}{path}")
                assert response.status_code == 404, path
                assert "/statistics" in response.json()["error"]
            query = await client.get(f"{url}/statistics?pretty=1")
            assert query.status_code == 200
            assert state(coordinator) == before
            assert (await client.get(f"{url}/statistics")).status_code == 200


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"\x00\xff\xfegarbage\r\n\r\n", 400),
        (b"GET /statistics HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 requires a Host header
        (b"GET /statistics HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
        # Headers that never end, past h11's bound on what it buffers: 431.
        (b"GET /statistics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20_000, 431),
        (b"GET /statistics HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\n", 400),
    ],
    ids=["bytes", "no-host", "header", "huge-header", "length"],
)
async def test_malformed_requests_get_an_error_and_the_server_goes_on(
    data: bytes, status: int
) -> None:
    with anyio.fail_after(10):
        async with fleet() as (coordinator, url), httpx.AsyncClient() as client:
            before = state(coordinator)
            answer = await raw(url, data)
            assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:80]
            assert b"connection: close" in answer.lower()
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "malformed request"}
            assert state(coordinator) == before
            assert (await client.get(f"{url}/statistics")).status_code == 200


@pytest.mark.anyio
async def test_clients_that_vanish_or_go_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_statserver, "IDLE_TIMEOUT", 0.2)
    with anyio.fail_after(10):
        async with fleet() as (coordinator, url), httpx.AsyncClient() as client:
            before = state(coordinator)
            host, port = url.removeprefix("http://").split(":")
            # Half a request, then gone; a connection that never says anything (closed
            # by the server when idle); a request with a body (answered, then closed).
            async with await anyio.connect_tcp(host, int(port)) as stream:
                await stream.send(b"GET /stat")
            assert await raw(url, b"") == b""
            # The rest with the usual idle timeout: on a loaded machine a stall of 0.2 s
            # between two requests of one connection is no idle client.
            monkeypatch.undo()
            answer = await raw(
                url, b"PUT /statistics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            )
            assert answer.startswith(b"HTTP/1.1 405 ")
            # HTTP/1.0 and keep-alive both work.
            answer = await raw(url, b"GET /statistics HTTP/1.0\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 ")
            pipelined = b"GET /statistics HTTP/1.1\r\nHost: x\r\n\r\n" * 2
            pipelined += b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            answer = await raw(url, pipelined)
            assert answer.count(b"HTTP/1.1 200 ") == 2
            assert answer.count(b"HTTP/1.1 404 ") == 1
            assert state(coordinator) == before
            assert (await client.get(f"{url}/statistics")).status_code == 200


@pytest.mark.anyio
async def test_a_document_that_fails_is_a_500_and_the_server_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(10):
        async with fleet() as (_coordinator, url), httpx.AsyncClient() as client:

            def broken(*args: object) -> object:
                raise RuntimeError("a bug")

            with monkeypatch.context() as patch:
                patch.setattr(_observe, "waiters", broken)
                with caplog.at_level(logging.ERROR, "lovely_coordinator.statistics"):
                    response = await client.get(f"{url}/statistics")
            assert response.status_code == 500
            assert any(r.exc_info for r in caplog.records)
            assert (await client.get(f"{url}/statistics")).status_code == 200


@pytest.mark.anyio
async def test_leaving_the_block_stops_the_server_and_errors_pass_through() -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(1)
        with pytest.raises(ValueError, match=r"^mine$"):  # not wrapped in a group
            async with coordinator.serve_statistics() as (host, port):
                raise ValueError("mine")
        with pytest.raises(OSError, match=r"(?i)connect"):
            await anyio.connect_tcp(host, port)
        async with coordinator.serve_statistics() as (host, port):
            with pytest.raises(OSError, match=r"(?i)in use"):  # taken
                async with coordinator.serve_statistics(port=port):
                    pass
        with anyio.move_on_after(0.01) as scope:  # a cancellation passes through too
            async with coordinator.serve_statistics():
                await anyio.sleep_forever()
        assert scope.cancelled_caught


@pytest.mark.parametrize(
    ("host", "port", "error", "message"),
    [
        ("", 0, InvalidArgumentError, "host must be a nonempty string"),
        (5, 0, InvalidArgumentTypeError, "host must be a nonempty string"),
        ("127.0.0.1", -1, InvalidArgumentError, "port must be an integer from 0 to 65535"),
        ("127.0.0.1", 65536, InvalidArgumentError, "port must be an integer from 0 to 65535"),
        ("127.0.0.1", True, InvalidArgumentTypeError, "port must be an integer from 0 to 65535"),
        ("127.0.0.1", "80", InvalidArgumentTypeError, "port must be an integer from 0 to 65535"),
    ],
)
def test_bad_arguments(host: Any, port: Any, error: type[Exception], message: str) -> None:
    coordinator = create_agent_coordinator(1)
    with pytest.raises(error, match=f"^{message}$"):
        coordinator.serve_statistics(host, port)


@pytest.mark.anyio
async def test_connections_past_the_bound_are_refused_and_the_server_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Regression: every connection was kept (for up to IDLE_TIMEOUT), however many, so a
    # flood of idle clients could take all the process's file descriptors.
    monkeypatch.setattr(_statserver, "MAX_CONNECTIONS", 3)
    request = b"GET /statistics HTTP/1.1\r\nHost: x\r\n\r\n"
    with anyio.fail_after(10):
        async with fleet() as (coordinator, url):
            before = state(coordinator)
            host, port = url.removeprefix("http://").split(":")
            held = []
            for _ in range(3):  # served, then idle on keep-alive: each holds a place
                stream = await anyio.connect_tcp(host, int(port))
                held.append(stream)
                await stream.send(request)
                received = b""
                while b"\r\n\r\n" not in received:
                    received += await stream.receive()
                assert received.startswith(b"HTTP/1.1 200 ")
            answer = await raw(url, b"")  # one more: told so at once, and closed
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:80]
            assert b"connection: close" in answer.lower()
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {
                "error": "too many connections; try again later"
            }
            await held.pop().aclose()  # a place frees when its client leaves
            await wait_all_tasks_blocked()
            answer = await raw(url, request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            assert answer.startswith(b"HTTP/1.1 200 ")
            for stream in held:
                await stream.aclose()
            assert state(coordinator) == before

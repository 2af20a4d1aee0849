"""A tiny read-only HTTP/1.1 server for one JSON document, on anyio streams (asyncio, trio).

The protocol is h11's (a small, pure-Python, well-kept HTTP/1.1 state machine); this
module only moves bytes between it and an anyio socket, so no HTTP is parsed by hand.

What it answers, and why it can never change anything: ``GET`` (and ``HEAD``) of the one
path gets the document, built by the caller's callable at that moment; any other path is
404, any other method on the path 405 (with ``Allow``), and a request h11 cannot parse is
400 (or the status h11 suggests, e.g. 431 for oversized headers). Request bodies are
never read into anything: a request with one is answered and its connection closed.

It keeps serving whatever a client does: every connection is handled in its own task,
whatever goes wrong in it (a reset, garbage, a client that stops reading) ends only that
connection, and a connection idle for ``IDLE_TIMEOUT`` seconds is closed, so stalled
clients cannot pile up. At most ``MAX_CONNECTIONS`` are served at once: one more is told
503 at once and closed, so a flood of clients can never take the process's file
descriptors (which its model requests need). Keep-alive works as HTTP/1.1 says.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11
from anyio.abc import SocketAttribute

__all__ = ["IDLE_TIMEOUT", "MAX_CONNECTIONS", "serve_document"]

_log = logging.getLogger("lovely_coordinator.statistics")

IDLE_TIMEOUT: Final = 10.0  # seconds a connection may take to send a whole request
MAX_CONNECTIONS: Final = 64  # connections served at once (a live view needs one or two)
_MAX_HEADERS: Final = 16 * 1024  # bytes of request line and headers h11 accepts
_RECEIVE: Final = 64 * 1024
_ALLOW: Final = "GET, HEAD"


def _error(status: int, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"error": message}).encode()


@asynccontextmanager
async def serve_document(
    host: str, port: int, path: str, document: Callable[[], bytes]
) -> AsyncIterator[tuple[str, int]]:
    """Serve ``document()`` (JSON bytes) at ``GET path`` on ``host:port``; yields the
    bound ``(host, port)``. Leaving the block stops the server and closes every connection.

    Raises:
        OSError: the address cannot be bound (in use, not local, ...).
    """
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    bound = listener.extra(SocketAttribute.local_address)
    address = (str(bound[0]), int(bound[1]))

    served = 0  # connections being served (all in this event loop's thread)
    most = MAX_CONNECTIONS  # (read here, so a test can lower it)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        nonlocal served
        try:
            await _connection(stream, path, document)
        except Exception:  # one connection's trouble never stops the server
            _log.debug("lovely_coordinator: statistics connection ended", exc_info=True)
        finally:
            served -= 1

    async def accept(sublistener: anyio.abc.SocketListener) -> None:
        nonlocal served
        while True:
            try:
                stream = await sublistener.accept()
            except OSError:  # e.g. out of file descriptors: wait a moment, go on serving
                _log.warning("lovely_coordinator: accepting a connection failed", exc_info=True)
                await anyio.sleep(0.1)
                continue
            if served >= most:
                await _refuse(stream)
                continue
            served += 1
            tg.start_soon(handle, stream)

    _log.info("lovely_coordinator: serving statistics on http://%s:%d%s", *address, path)
    failure: BaseException | None = None
    async with listener, anyio.create_task_group() as tg:
        for sublistener in listener.listeners:
            assert isinstance(sublistener, anyio.abc.SocketListener)  # TCP listeners
            tg.start_soon(accept, sublistener)
        try:
            yield address
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:
            # Re-raised below, outside the task group, so the caller gets its own
            # exception back rather than one wrapped in an exception group.
            failure = exc
        tg.cancel_scope.cancel()
    if failure is not None:
        try:
            raise failure
        finally:
            failure = None  # no reference cycle through the traceback


async def _refuse(stream: anyio.abc.SocketStream) -> None:
    # A fresh socket's send buffer takes these few bytes at once; the bound is for a
    # peer that is already gone. Nothing is read, so the close is clean.
    with anyio.move_on_after(1.0):
        try:
            conn = h11.Connection(h11.SERVER)
            await _send(
                stream, conn, *_error(503, "too many connections; try again later"), close=True
            )
        except Exception:
            _log.debug("lovely_coordinator: refusing a statistics connection failed", exc_info=True)
    await stream.aclose()


async def _connection(
    stream: anyio.abc.SocketStream, path: str, document: Callable[[], bytes]
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEADERS)
    async with stream:
        while True:
            with anyio.move_on_after(IDLE_TIMEOUT):
                keep = await _cycle(stream, conn, path, document)
                if keep and conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()
                    continue
            return  # closed, timed out, or the connection cannot go on


async def _next_event(stream: anyio.abc.SocketStream, conn: h11.Connection) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive(_RECEIVE)
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            data = b""
        conn.receive_data(data)


async def _cycle(
    stream: anyio.abc.SocketStream,
    conn: h11.Connection,
    path: str,
    document: Callable[[], bytes],
) -> bool:
    """Answer one request; True if the connection may serve another."""
    try:
        event = await _next_event(stream, conn)
    except h11.RemoteProtocolError as exc:
        # The status only: the error's text may quote the request's bytes.
        status = exc.error_status_hint
        _log.debug("lovely_coordinator: malformed statistics request (%d)", status)
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await _send(stream, conn, *_error(status, "malformed request"), close=True)
        return False
    if not isinstance(event, h11.Request):
        return False  # the client closed the connection (or h11 ended it)
    method = event.method.decode("ascii", "replace")
    target = urlsplit(event.target.decode("ascii", "replace")).path
    has_body = any(
        name == b"content-length" and value != b"0" for name, value in event.headers
    ) or any(name == b"transfer-encoding" for name, value in event.headers)
    extra: list[tuple[bytes, bytes]] = []
    if target != path:
        status, body = _error(404, f"not found; the statistics are at {path}")
    elif method not in ("GET", "HEAD"):
        status, body = _error(405, "method not allowed; the statistics are read-only")
        extra.append((b"allow", _ALLOW.encode()))
    else:
        try:
            status, body = 200, document()
        except Exception:
            _log.exception("lovely_coordinator: building the statistics document failed")
            status, body = _error(500, "the statistics could not be built")
    close = has_body or status >= 500
    await _send(
        stream,
        conn,
        status,
        b"" if method == "HEAD" else body,
        close=close,
        extra=extra,
        length=len(body),
    )
    if close:
        return False
    event = await _next_event(stream, conn)  # the (empty) end of the request
    return isinstance(event, h11.EndOfMessage)


async def _send(
    stream: anyio.abc.SocketStream,
    conn: h11.Connection,
    status: int,
    body: bytes,
    *,
    close: bool,
    extra: list[tuple[bytes, bytes]] | None = None,
    length: int | None = None,
) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body) if length is None else length).encode()),
        (b"cache-control", b"no-store"),
        *(extra or ()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    data = conn.send(h11.Response(status_code=status, headers=headers))
    assert data is not None
    if body:
        data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send(data)

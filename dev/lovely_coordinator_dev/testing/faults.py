"""A loopback TCP fault proxy between Redis clients and a real server (asyncio).

Clients connect to the proxy's port instead of the server's; every byte goes through
unchanged until a fault is switched on:

* :meth:`FaultProxy.delay`: bytes arrive that many seconds late (replies, requests or
  both), as on a slow or congested link; the latency is constant, never cumulative.
* :meth:`FaultProxy.cut_replies`: requests reach the server, replies are thrown away (a
  reply lost in the network: the server did the work, the client never learns it).
* :meth:`FaultProxy.drop`: nothing goes through in either direction, and connections stay
  open and silent (a black hole: the client only notices by its own timeouts).
* :meth:`FaultProxy.partition`: every connection is reset and new ones are refused.
* :meth:`FaultProxy.heal`: back to normal.

A fault applies to every connection, open or new, unless ``only_open=True`` limits it to
the connections open at that moment (the client's next connection then works, as after
a reconnect). :meth:`FaultProxy.replace_in_replies` rewrites reply bytes (of equal length),
to make a real server report something else (an older version).

The proxy runs on the caller's event loop (asyncio), for the fault tests, the chaos runs
and the benchmark (which measures what a proxy hop costs); nothing in it blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Literal, Self

__all__ = ["Fault", "FaultProxy", "proxy_to"]

Direction = Literal["replies", "requests", "both"]


@dataclasses.dataclass(frozen=True)
class Fault:
    """What happens to the bytes of one connection."""

    request_delay: float = 0.0
    reply_delay: float = 0.0
    cut_replies: bool = False
    drop: bool = False


_HEALTHY = Fault()


class _Link:
    """One client connection and its upstream connection, with two pumps."""

    def __init__(
        self,
        proxy: FaultProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.fault = proxy.fault
        self.client_writer = client[1]
        self.server_writer = server[1]
        self.tasks = [
            asyncio.ensure_future(self._pump(client[0], server[1], replies=False)),
            asyncio.ensure_future(self._pump(server[0], client[1], replies=True)),
        ]

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, replies: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(65536):
                fault = self.fault
                if fault.drop or (replies and fault.cut_replies):
                    continue
                if replies:
                    for old, new in self.proxy.replacements:
                        data = data.replace(old, new)
                delay = fault.reply_delay if replies else fault.request_delay
                queue.put_nowait((loop.time() + delay, data))
            queue.put_nowait(None)
            await sender
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
            writer.close()

    def reset(self) -> None:
        for writer in (self.client_writer, self.server_writer):
            transport = writer.transport
            if not transport.is_closing():
                transport.abort()  # a reset, not an orderly close

    async def close(self) -> None:
        self.reset()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class FaultProxy:
    """A proxy from a free loopback port to ``127.0.0.1:upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.fault = _HEALTHY
        self.partitioned = False
        self.replacements: list[tuple[bytes, bytes]] = []
        self.connections = 0  # accepted so far
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.partitioned:
            writer.transport.abort()
            return
        try:
            upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()  # the server is down: so is the connection
            return
        link = _Link(self, (reader, writer), upstream)
        self._links.add(link)

        def forget(_: object) -> None:
            self._links.discard(link)

        for task in link.tasks:
            task.add_done_callback(forget)

    def _set(self, fault: Fault, only_open: bool) -> None:
        if not only_open:
            self.fault = fault
        for link in self._links:
            link.fault = fault

    def delay(
        self, seconds: float, direction: Direction = "replies", *, only_open: bool = False
    ) -> None:
        """Deliver bytes ``seconds`` late in ``direction``."""
        self._set(
            Fault(
                request_delay=seconds if direction in ("requests", "both") else 0.0,
                reply_delay=seconds if direction in ("replies", "both") else 0.0,
            ),
            only_open,
        )

    def cut_replies(self, *, only_open: bool = False) -> None:
        """Forward requests; throw replies away."""
        self._set(Fault(cut_replies=True), only_open)

    def drop(self, *, only_open: bool = False) -> None:
        """Forward nothing, in either direction; keep connections open."""
        self._set(Fault(drop=True), only_open)

    def partition(self) -> None:
        """Reset every connection and refuse new ones until :meth:`heal`."""
        self.partitioned = True
        for link in list(self._links):
            link.reset()

    def heal(self) -> None:
        """No fault, for open and new connections alike."""
        self.partitioned = False
        self._set(_HEALTHY, only_open=False)

    def replace_in_replies(self, old: bytes, new: bytes) -> None:
        """Rewrite ``old`` to ``new`` in every reply chunk (same length: framing holds)."""
        if len(old) != len(new):
            raise ValueError("a replacement must keep the length of the reply")
        self.replacements.append((old, new))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            await link.close()
        if self._server is not None:
            await self._server.wait_closed()


@contextlib.asynccontextmanager
async def proxy_to(upstream_port: int) -> AsyncIterator[FaultProxy]:
    """A started :class:`FaultProxy`, closed on the way out."""
    proxy = await FaultProxy(upstream_port).start()
    try:
        yield proxy
    finally:
        await proxy.close()

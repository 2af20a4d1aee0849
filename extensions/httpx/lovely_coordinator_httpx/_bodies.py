"""The response bodies the transports hand out, per httpx generation: reading one feeds
the call's usage meter, closing it ends the call.

Both httpx generations have the same response and stream shapes but separate classes,
and a response accepts only its own generation's streams; :func:`generation` builds the
metered streams for one generation's classes and gathers them with its ``PoolTimeout``,
so a transport module only names its library.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, final

import anyio
from lovely_coordinator_limits import UsageMeter

from ._flow import Call

__all__ = ["Generation", "Watch", "generation"]

Watch = Callable[[Any, Call], bool]
"""Wraps a response's body so that reading it feeds the call's meter and closing it ends
the call; ``False`` when the body is not a stream it can wrap."""


@final
class _Chunks:
    """An async body's iterator, feeding the meter (a class, not an async generator:
    nothing of ours is left to finalize when a reader abandons the body half-way)."""

    __slots__ = ("_chunks", "_meter")

    def __init__(self, chunks: AsyncIterator[bytes], meter: UsageMeter) -> None:
        self._chunks = chunks
        self._meter = meter

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._chunks.__anext__()
        self._meter.feed(chunk)
        return chunk


@final
class _SyncChunks:
    """A sync body's iterator, feeding the meter."""

    __slots__ = ("_chunks", "_meter")

    def __init__(self, chunks: Iterator[bytes], meter: UsageMeter) -> None:
        self._chunks = chunks
        self._meter = meter

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        chunk = next(self._chunks)
        self._meter.feed(chunk)
        return chunk


@final
@dataclass(frozen=True, slots=True)
class Generation:
    """What the shells use of one httpx generation: its ``PoolTimeout``, and the async and
    sync body wrappers for its responses, which accept only its own stream classes."""

    pool_timeout: type[Exception]
    watch_async: Watch
    watch_sync: Watch


def generation(library: Any) -> Generation:
    """The :class:`Generation` of ``library`` (the ``httpx2`` or the ``httpx`` module)."""

    class Metered(library.AsyncByteStream):  # type: ignore[misc]
        """A response body whose chunks feed the call's meter; closing it ends the call."""

        def __init__(self, stream: Any, meter: UsageMeter, call: Call) -> None:
            self._stream = stream
            self._meter = meter
            self._call = call

        def __aiter__(self) -> AsyncIterator[bytes]:
            return _Chunks(self._stream.__aiter__(), self._meter)

        async def aclose(self) -> None:
            try:
                # Shielded so a cancelled reader still hands its connection back to the pool.
                with anyio.CancelScope(shield=True):
                    await self._stream.aclose()
            finally:
                self._call.close()

    class MeteredSync(library.SyncByteStream):  # type: ignore[misc]
        """The same for a sync client's body."""

        def __init__(self, stream: Any, meter: UsageMeter, call: Call) -> None:
            self._stream = stream
            self._meter = meter
            self._call = call

        def __iter__(self) -> Iterator[bytes]:
            return _SyncChunks(iter(self._stream), self._meter)

        def close(self) -> None:
            try:
                self._stream.close()
            finally:
                self._call.close()

    def watch_async(response: Any, call: Call) -> bool:
        stream = response.stream
        if not isinstance(stream, library.AsyncByteStream):
            return False
        response.stream = Metered(stream, call.meter(response.headers), call)
        return True

    def watch_sync(response: Any, call: Call) -> bool:
        stream = response.stream
        if not isinstance(stream, library.SyncByteStream):
            return False
        response.stream = MeteredSync(stream, call.meter(response.headers), call)
        return True

    return Generation(library.PoolTimeout, watch_async, watch_sync)

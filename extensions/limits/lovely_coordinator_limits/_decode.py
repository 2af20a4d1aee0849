"""Undo a response's ``content-encoding`` as its chunks pass, for the usage meter.

A transport sees the body as it comes off the wire: compressed when the client asked for
it (httpx and the SDKs send ``Accept-Encoding: gzip, deflate`` by default, and providers
compress JSON). The caller's client decodes it for the caller; the meter needs the same
text, so it decodes its own copy, chunk by chunk, never holding more than the decoder's
window. gzip and deflate come with Python (``zlib``); br needs ``brotli`` (or
``brotlicffi``) and zstd ``zstandard`` (or Python 3.14's ``compression.zstd``), the same
optional packages httpx decodes them with. An encoding it cannot decode, or a body that
does not decode, makes the meter blind (``None``), never the caller's read fail.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from typing import Any, Protocol, final

__all__ = ["Decoder", "decoder_for"]


class Decoder(Protocol):
    """Decodes a body chunk by chunk."""

    def decode(self, chunk: bytes, limit: int) -> bytes:
        """The decoded bytes ``chunk`` completes (at most about ``limit`` of them; 0: all).

        Raises:
            ValueError: the body does not decode (the meter stops reading it).
        """
        ...


@final
class _Identity:
    def decode(self, chunk: bytes, limit: int) -> bytes:
        return chunk


@final
class _Zlib:
    """gzip (``wbits`` 16+), or deflate, which servers send zlib-wrapped or raw: told
    apart by the first two bytes (a zlib header is a multiple of 31 naming deflate)."""

    __slots__ = ("_head", "_inner")

    def __init__(self, deflate: bool) -> None:
        self._inner: Any = None if deflate else zlib.decompressobj(zlib.MAX_WBITS | 16)
        self._head = b""

    def decode(self, chunk: bytes, limit: int) -> bytes:
        if self._inner is None:
            chunk = self._head + chunk
            if len(chunk) < 2:
                self._head = chunk
                return b""
            self._head = b""
            wrapped = chunk[0] & 0x0F == 8 and (chunk[0] << 8 | chunk[1]) % 31 == 0
            self._inner = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        try:
            # What does not fit under the limit is dropped: the meter stops there anyway.
            return self._inner.decompress(chunk, limit)  # type: ignore[no-any-return]
        except zlib.error as exc:
            raise ValueError(str(exc)) from None


@final
class _Module:
    """br or zstd, through whichever optional module is importable."""

    __slots__ = ("_step",)

    def __init__(self, step: Callable[[bytes], bytes]) -> None:
        self._step = step

    def decode(self, chunk: bytes, limit: int) -> bytes:
        try:
            return self._step(chunk)
        except Exception as exc:  # each library has its own error class
            raise ValueError(str(exc)) from None


def _import(*names: str) -> Any | None:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _brotli() -> Decoder | None:
    module = _import("brotli", "brotlicffi")
    if module is None:
        return None
    inner = module.Decompressor()
    step = getattr(inner, "process", None) or inner.decompress
    return _Module(step)


def _zstd() -> Decoder | None:
    stdlib = _import("compression.zstd", "backports.zstd")
    if stdlib is not None:
        return _Module(stdlib.ZstdDecompressor().decompress)
    module = _import("zstandard")
    if module is None:
        return None
    return _Module(module.ZstdDecompressor().decompressobj().decompress)


@final
class _Chain:
    """Several encodings, applied in the order listed: decoded in reverse."""

    __slots__ = ("_decoders",)

    def __init__(self, decoders: list[Decoder]) -> None:
        self._decoders = decoders

    def decode(self, chunk: bytes, limit: int) -> bytes:
        for decoder in self._decoders:
            chunk = decoder.decode(chunk, limit)
        return chunk


_BUILDERS: dict[str, Callable[[], Decoder | None]] = {
    "identity": _Identity,
    "gzip": lambda: _Zlib(deflate=False),
    "x-gzip": lambda: _Zlib(deflate=False),
    "deflate": lambda: _Zlib(deflate=True),
    "br": _brotli,
    "zstd": _zstd,
}


def decoder_for(content_encoding: str) -> Decoder | None:
    """A fresh decoder for a ``content-encoding`` header value (``""``: none needed).

    Returns:
        The decoder, or ``None`` when an encoding is unknown or its module is missing.
    """
    names = [part.strip().lower() for part in content_encoding.split(",") if part.strip()]
    decoders: list[Decoder] = []
    for name in reversed(names):
        build = _BUILDERS.get(name)
        decoder = build() if build is not None else None
        if decoder is None:
            return None
        if not isinstance(decoder, _Identity):
            decoders.append(decoder)
    if not decoders:
        return _Identity()
    return decoders[0] if len(decoders) == 1 else _Chain(decoders)

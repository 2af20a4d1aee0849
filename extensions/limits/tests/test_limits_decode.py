"""The usage meter reads compressed bodies: decoded by their content-encoding, chunk by
chunk, streamed or not; what it cannot decode it reports as no usage, never as an error."""

from __future__ import annotations

import json
import zlib

import pytest
from lovely_coordinator_limits import Usage, UsageMeter
from lovely_coordinator_limits._usage import MAX_JSON_BODY

BODY = json.dumps({"usage": {"prompt_tokens": 12, "completion_tokens": 3}}).encode()
EVENTS = (
    b'data: {"choices": [{"delta": {"content": "ok"}}]}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}\n\n'
    b"data: [DONE]\n\n"
)


def _compress(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(wbits=wbits)
    return compressor.compress(data) + compressor.flush()


def _feed(meter: UsageMeter, data: bytes, size: int) -> Usage | None:
    for start in range(0, len(data), size):
        meter.feed(data[start : start + size])
    return meter.usage()


@pytest.mark.parametrize(
    ("encoding", "wbits"),
    [
        ("gzip", zlib.MAX_WBITS | 16),
        ("x-gzip", zlib.MAX_WBITS | 16),
        ("deflate", zlib.MAX_WBITS),
        ("deflate", -zlib.MAX_WBITS),  # raw deflate, as some servers send it
        ("GZIP", zlib.MAX_WBITS | 16),
    ],
)
@pytest.mark.parametrize("size", [1, 7, 4096])
def test_a_compressed_json_body(encoding: str, wbits: int, size: int) -> None:
    meter = UsageMeter("application/json", encoding)
    assert _feed(meter, _compress(BODY, wbits), size) == Usage(12, 3)


@pytest.mark.parametrize("size", [1, 5, 64, 4096])
def test_a_compressed_event_stream_flushed_per_event(size: int) -> None:
    compressor = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    data = b"".join(
        compressor.compress(line + b"\n") + compressor.flush(zlib.Z_SYNC_FLUSH)
        for line in EVENTS.split(b"\n")[:-1]
    )
    meter = UsageMeter("text/event-stream", "gzip")
    assert _feed(meter, data + compressor.flush(), size) == Usage(7, 2)


def test_two_encodings_are_undone_in_reverse_order() -> None:
    data = _compress(_compress(BODY, zlib.MAX_WBITS), zlib.MAX_WBITS | 16)
    assert _feed(UsageMeter("application/json", "deflate, gzip"), data, 10) == Usage(12, 3)


def test_identity_and_no_encoding_pass_through() -> None:
    assert _feed(UsageMeter("application/json", "identity"), BODY, 3) == Usage(12, 3)
    assert _feed(UsageMeter("application/json", ""), BODY, 3) == Usage(12, 3)


def test_an_unknown_encoding_or_a_broken_body_reports_no_usage() -> None:
    assert _feed(UsageMeter("application/json", "compress"), BODY, 3) is None
    assert _feed(UsageMeter("application/json", "gzip"), b"not gzip at all", 3) is None
    broken = _compress(BODY, zlib.MAX_WBITS | 16)[:10] + b"\xff" * 20
    assert _feed(UsageMeter("application/json", "gzip"), broken, 4) is None


def test_a_body_that_inflates_past_the_limit_is_not_kept() -> None:
    huge = b'{"pad": "' + b"a" * (MAX_JSON_BODY + 10) + b'"}'
    meter = UsageMeter("application/json", "gzip")
    assert _feed(meter, _compress(huge, zlib.MAX_WBITS | 16), 1 << 16) is None

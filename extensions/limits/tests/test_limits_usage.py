"""Usage from JSON bodies and from event streams, read chunk by chunk as they pass."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lovely_coordinator_limits import Usage, UsageMeter, usage_from_body, usage_from_json
from lovely_coordinator_limits._usage import MAX_JSON_BODY


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}, Usage(7, 3)),
        ({"usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}, Usage(5, 2)),
        (
            {"usage": {"input_tokens": 5, "cache_creation_input_tokens": 4, "output_tokens": 1}},
            Usage(9, 1),
        ),
        ({"usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 6}}, Usage(4, 6)),
        ({"type": "response.completed", "response": {"usage": {"input_tokens": 1}}}, Usage(1, 0)),
        ({"usage": None}, None),
        ({"usage": {"prompt_tokens": -1}}, None),
        ({"usage": {"prompt_tokens": True, "completion_tokens": 2}}, Usage(0, 2)),
        ({"choices": []}, None),
        ([1, 2], None),
    ],
)
def test_usage_from_json(payload: object, expected: Usage | None) -> None:
    assert usage_from_json(payload) == expected


def test_usage_from_body() -> None:
    assert usage_from_body(b'{"usage": {"prompt_tokens": 2, "completion_tokens": 1}}') == Usage(
        2, 1
    )
    assert usage_from_body("{broken") is None
    assert Usage(2, 1).total == 3


def _sse(events: list[tuple[str | None, object]]) -> bytes:
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {json.dumps(data)}\n\n")
    return "".join(out).encode()


OPENAI_STREAM = (
    _sse(
        [
            (None, {"choices": [{"delta": {"content": "usage is a word"}}], "usage": None}),
            (None, {"choices": [{"delta": {}}], "usage": None}),
            (None, {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 4}}),
        ]
    )
    + b"data: [DONE]\n\n"
)

ANTHROPIC_STREAM = _sse(
    [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 9, "output_tokens": 1}},
            },
        ),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"text": "hi"}}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 3}}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ]
)


@pytest.mark.parametrize(
    ("stream", "expected"), [(OPENAI_STREAM, Usage(12, 4)), (ANTHROPIC_STREAM, Usage(9, 5))]
)
@given(cuts=st.lists(st.integers(0, 2000), max_size=12))
def test_a_stream_cut_anywhere_gives_the_same_usage(
    stream: bytes, expected: Usage, cuts: list[int]
) -> None:
    meter = UsageMeter("text/event-stream; charset=utf-8")
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    for start, end in itertools.pairwise(points):
        meter.feed(stream[start:end])
    assert meter.usage() == expected


def test_a_stream_without_usage_has_none() -> None:
    meter = UsageMeter("text/event-stream")
    meter.feed(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\ndata: [DONE]\n\n')
    assert meter.usage() is None


def test_a_stream_keeps_only_the_current_line() -> None:
    meter = UsageMeter("text/event-stream")
    for _ in range(1000):
        meter.feed(b'data: {"choices": [{"delta": {"content": "' + b"x" * 100 + b'"}}]}\n\n')
    assert len(meter._pending) == 0
    meter.feed(b"data: {")
    assert len(meter._pending) == len(b"data: {")


def test_an_overlong_event_line_is_skipped_not_buffered() -> None:
    meter = UsageMeter("text/event-stream")
    meter.feed(b"data: " + b"x" * (2 * 1024 * 1024))
    assert len(meter._pending) == 0
    meter.feed(b"x" * 1000 + b"\n\n")
    meter.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n')
    assert meter.usage() == Usage(1, 1)


def test_a_json_body_in_chunks() -> None:
    body = json.dumps({"id": "x", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
    meter = UsageMeter("application/json")
    for i in range(0, len(body), 7):
        meter.feed(body[i : i + 7])
    assert meter.usage() == Usage(3, 2)
    assert meter.usage() == Usage(3, 2)  # asking again changes nothing


def test_a_huge_json_body_is_not_held() -> None:
    meter = UsageMeter("application/json")
    meter.feed(b"x" * (MAX_JSON_BODY + 1))
    assert len(meter._pending) == 0
    meter.feed(b'{"usage": {"prompt_tokens": 1}}')
    assert meter.usage() is None


def test_bodies_nested_past_the_parser_have_no_usage() -> None:
    """Regression: JSON nested deeper than the parser goes raised RecursionError, out of
    the transport (while the caller read a stream, or when it closed a body)."""
    deep = b"[" * 100_000
    assert usage_from_body(deep) is None
    meter = UsageMeter("application/json")
    meter.feed(deep)
    assert meter.usage() is None
    events = UsageMeter("text/event-stream")
    events.feed(b'data: {"usage": ' + deep + b"\n\n")
    events.feed(b'data: {"usage": {"prompt_tokens": 2, "completion_tokens": 1}}\n\n')
    assert events.usage() == Usage(2, 1)

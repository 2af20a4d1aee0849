"""The fake provider's OpenAI Responses API (``POST /v1/responses``), JSON or streamed.

A response holds one output item: an assistant ``message`` with the answer's text, or a
``function_call`` when the provider answers with a tool call (see ``_fake_tools``). Its
``usage`` counts ``input_tokens`` and ``output_tokens`` as the chat completions count
prompt and completion tokens. A streamed answer is the event sequence the SDKs read:
``response.created``, the item's ``added`` / delta / ``done`` events, and
``response.completed`` carrying the whole response and its usage, which is what a
usage meter settles from.
"""

from __future__ import annotations

import json
from typing import Any

from ._fake_tools import CALL_ID, ToolCall

__all__ = ["response_body", "response_events"]

_RESPONSE_ID = "resp_fake"
_ITEM_ID = "msg_fake"


def response_body(
    model: str, text: str, prompt: int, output: int, cut: bool, call: ToolCall | None
) -> dict[str, Any]:
    """A complete response object: its one output item, status and usage."""
    item = _call_item(call) if call is not None else _message_item(text)
    return _response(model, "incomplete" if cut else "completed", [item], prompt, output, cut)


def response_events(
    model: str, text: str, prompt: int, output: int, cut: bool, call: ToolCall | None
) -> list[bytes]:
    """A streamed response: server-sent events, the text a few characters a delta."""
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": _response(model, "in_progress", [], None, 0, False),
        }
    ]
    if call is not None:
        item = _call_item(call)
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "arguments": ""},
            },
            {
                "type": "response.function_call_arguments.delta",
                "output_index": 0,
                "item_id": item["id"],
                "delta": call.arguments,
            },
            {
                "type": "response.function_call_arguments.done",
                "output_index": 0,
                "item_id": item["id"],
                "arguments": call.arguments,
            },
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ]
    else:
        item = _message_item(text)
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"output_index": 0, "item_id": _ITEM_ID, "content_index": 0}
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []},
            },
            {"type": "response.content_part.added", **where, "part": part},
            *(
                {
                    "type": "response.output_text.delta",
                    **where,
                    "delta": text[i : i + 8],
                    "logprobs": [],
                }
                for i in range(0, len(text), 8)
            ),
            {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **where, "part": {**part, "text": text}},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ]
    final = _response(model, "incomplete" if cut else "completed", [item], prompt, output, cut)
    events.append(
        {"type": "response.incomplete" if cut else "response.completed", "response": final}
    )
    return [
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n".encode()
        for n, e in enumerate(events)
    ]


def _message_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": _ITEM_ID,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_fake_1",
        "call_id": CALL_ID,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


def _response(
    model: str,
    status: str,
    output: list[dict[str, Any]],
    prompt: int | None,
    generated: int,
    cut: bool,
) -> dict[str, Any]:
    # A response in progress has no usage yet (None), as the API's own.
    usage = None
    if prompt is not None:
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        }
    return {
        "id": _RESPONSE_ID,
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": usage,
    }

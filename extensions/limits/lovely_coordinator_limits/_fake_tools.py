"""The fake provider's tool calls: enough of each API's function calling to test delegation.

A provider with tools in use (``FakeProvider.use_tools = True``) answers a request that
offers tools, and holds no tool result yet, with a call of the first tool offered; once the
conversation holds a tool result it answers with text as usual. So an agent whose only
tool is a sub-agent calls it exactly once per run, and then answers.

The call's arguments fill the tool's JSON schema: every required property gets a value of
its type (strings say ``"delegated task"``), so a tool built from a typed function
accepts them. Three APIs:

- OpenAI chat completions: ``tools`` of ``{"type": "function", "function": {...}}``,
  results as ``role: "tool"`` messages; the call is the message's ``tool_calls``;
- OpenAI responses: ``tools`` of ``{"type": "function", "name": ...}``, results as
  ``function_call_output`` input items; the call is a ``function_call`` output item;
- Anthropic messages: ``tools`` of ``{"name", "input_schema"}``, results as
  ``tool_result`` content blocks; the call is a ``tool_use`` content block.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, final

from ._estimate import CHARS_PER_TOKEN

__all__ = ["ToolCall", "anthropic_tool_events", "openai_tool_chunks", "tool_call_for"]

CALL_ID = "call_fake_1"
"""The id of every call the fake provider makes (one call per answer)."""

_SAMPLES: Mapping[str, object] = {
    "string": "delegated task",
    "integer": 1,
    "number": 1,
    "boolean": True,
    "array": [],
    "object": {},
}


@final
@dataclass(frozen=True, slots=True)
class ToolCall:
    """The call an answer makes: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: str

    @property
    def tokens(self) -> int:
        """The output tokens the call counts as (its name and arguments, characters / 4)."""
        return max(1, math.ceil((len(self.name) + len(self.arguments)) / CHARS_PER_TOKEN))


def tool_call_for(path: str, payload: Mapping[str, Any]) -> ToolCall | None:
    """The call to answer ``payload`` with: its first tool, unless a result is back already.

    ``None`` when the request offers no tool, or its conversation holds a tool result.
    """
    tools = payload.get("tools")
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], Mapping):
        return None
    first: Mapping[str, Any] = tools[0]
    if path == "/v1/chat/completions":
        function = first.get("function")
        spec: Mapping[str, Any] = function if isinstance(function, Mapping) else {}
        schema, answered = spec.get("parameters"), _any_role(payload.get("messages"), "tool")
    elif path == "/v1/responses":
        spec = first
        schema, answered = spec.get("parameters"), _any_type(payload.get("input"))
    elif path == "/v1/messages":
        spec = first
        schema, answered = spec.get("input_schema"), _any_tool_result(payload.get("messages"))
    else:
        return None
    name = spec.get("name")
    if answered or not isinstance(name, str) or not name:
        return None
    return ToolCall(name, json.dumps(_arguments(schema)))


def openai_tool_chunks(model: str, call: ToolCall) -> list[dict[str, Any]]:
    """The chat-completion chunks of a streamed tool call (without the usage chunk)."""
    delta = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "index": 0,
                "id": CALL_ID,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ],
    }
    return [_chunk(model, delta, None), _chunk(model, {}, "tool_calls")]


def openai_tool_message(call: ToolCall) -> dict[str, Any]:
    """The assistant message of a non-streamed chat completion that calls ``call``."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ],
    }


def anthropic_tool_block(call: ToolCall) -> dict[str, Any]:
    """The ``tool_use`` content block of a non-streamed message that calls ``call``."""
    return {
        "type": "tool_use",
        "id": CALL_ID,
        "name": call.name,
        "input": json.loads(call.arguments),
    }


def anthropic_tool_events(call: ToolCall) -> list[tuple[str, object]]:
    """The content-block events of a streamed ``tool_use`` block (index 0)."""
    block = {"type": "tool_use", "id": CALL_ID, "name": call.name, "input": {}}
    delta = {"type": "input_json_delta", "partial_json": call.arguments}
    return [
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]


def _arguments(schema: object) -> dict[str, object]:
    if not isinstance(schema, Mapping):
        return {}
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        return {}
    arguments: dict[str, object] = {}
    for name in required:
        spec = properties.get(name)
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        arguments[str(name)] = _SAMPLES.get(kind, "delegated task") if isinstance(kind, str) else ""
    return arguments


def _any_role(messages: object, role: str) -> bool:
    return isinstance(messages, list) and any(
        isinstance(m, Mapping) and m.get("role") == role for m in messages
    )


def _any_type(items: object) -> bool:
    return isinstance(items, list) and any(
        isinstance(i, Mapping) and i.get("type") == "function_call_output" for i in items
    )


def _any_tool_result(messages: object) -> bool:
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content
        ):
            return True
    return False


def _chunk(model: str, delta: object, finish: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }

"""The fake provider's Responses API and tool calls, read by the real openai and anthropic SDKs."""

from __future__ import annotations

import gc
import json

import anthropic
import anyio
import openai
import pytest
from lovely_coordinator_limits import Usage, UsageMeter
from lovely_coordinator_limits._fake_tools import tool_call_for
from lovely_coordinator_limits._fake_wire import answer_text, parse_ask, stream_events
from lovely_coordinator_limits.testing import FakeProvider, Quota, openai_sse_on_trio

pytestmark = pytest.mark.anyio

_SCHEMA = {
    "type": "object",
    "properties": {"task": {"type": "string"}, "depth": {"type": "integer"}},
    "required": ["task", "depth"],
}
_CHAT_TOOLS = [{"type": "function", "function": {"name": "delegate", "parameters": _SCHEMA}}]
_RESPONSE_TOOLS = [{"type": "function", "name": "delegate", "parameters": _SCHEMA}]
_ANTHROPIC_TOOLS = [{"name": "delegate", "input_schema": _SCHEMA}]


def _openai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="test", base_url=f"{url}/v1", max_retries=0)


def test_the_first_tool_is_called_until_a_result_is_back() -> None:
    asked: list[object] = [{"role": "user", "content": "go"}]
    chat = {"messages": asked, "tools": _CHAT_TOOLS}
    call = tool_call_for("/v1/chat/completions", chat)
    assert call is not None
    assert (call.name, json.loads(call.arguments)) == (
        "delegate",
        {"task": "delegated task", "depth": 1},
    )
    answered = {**chat, "messages": [*asked, {"role": "tool", "content": "done"}]}
    assert tool_call_for("/v1/chat/completions", answered) is None
    assert tool_call_for("/v1/chat/completions", {"messages": []}) is None
    responses = {"input": [{"type": "function_call_output", "output": "done"}]}
    assert tool_call_for("/v1/responses", {**responses, "tools": _RESPONSE_TOOLS}) is None
    result = {"role": "user", "content": [{"type": "tool_result", "content": "done"}]}
    assert tool_call_for("/v1/messages", {"messages": [result], "tools": _ANTHROPIC_TOOLS}) is None
    assert tool_call_for("/v1/messages", {"messages": [], "tools": _ANTHROPIC_TOOLS}) is not None
    assert tool_call_for("/v1/other", {"tools": _CHAT_TOOLS}) is None


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("tools", [False, True])
def test_streams_report_usage_with_or_without_a_call(path: str, tools: bool) -> None:
    offered = {"/v1/responses": _RESPONSE_TOOLS, "/v1/chat/completions": _CHAT_TOOLS}
    payload: dict[str, object] = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello"}],
        "input": "hello",
        "max_tokens": 8,
    }
    if tools:
        payload["tools"] = offered.get(path, _ANTHROPIC_TOOLS)
    ask = parse_ask("POST", path, json.dumps(payload).encode())
    assert ask is not None
    assert (ask.tool_call is not None) == tools
    text, output, cut = answer_text("ok", ask.output_limit)
    meter = UsageMeter("text/event-stream")
    for event in stream_events(ask, text, output, cut):
        meter.feed(event)
    assert meter.usage() == Usage(ask.prompt_tokens, output)


async def test_the_responses_api_answers_json_and_streams(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        fake_provider.limit("gpt-test", Quota(requests_per_minute=600))
        async with _openai(fake_provider_url) as client:
            raw = await client.responses.with_raw_response.create(
                model="gpt-test", input="hello there", max_output_tokens=20
            )
            reply = raw.parse()
            assert reply.output_text == "ok"
            assert reply.usage is not None
            assert reply.usage.output_tokens == 1
            assert raw.headers["x-ratelimit-limit-requests"] == "600"
            texts = []
            async with client.responses.stream(model="gpt-test", input="hello") as stream:
                async for event in stream:
                    if event.type == "response.output_text.delta":
                        texts.append(event.delta)
                final = await stream.get_final_response()
            assert "".join(texts) == final.output_text == "ok"
        gc.collect()
        assert [s.api for s in fake_provider.seen()] == ["responses", "responses"]


@openai_sse_on_trio
async def test_tools_are_called_once_per_conversation(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        fake_provider.use_tools = True
        async with _openai(fake_provider_url) as client:
            chat = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "go"}],
                tools=_CHAT_TOOLS,  # type: ignore[arg-type]
            )
            calls = chat.choices[0].message.tool_calls
            assert calls is not None
            assert chat.choices[0].finish_reason == "tool_calls"
            response = await client.responses.create(
                model="m",
                input="go",
                tools=_RESPONSE_TOOLS,  # type: ignore[arg-type]
            )
            (item,) = response.output
            assert item.type == "function_call"
            assert item.name == "delegate"
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "go"}],
                tools=_CHAT_TOOLS,  # type: ignore[arg-type]
                stream=True,
            )
            assert isinstance(stream, openai.AsyncStream)
            names = [
                c.function.name
                async for chunk in stream
                for c in (chunk.choices[0].delta.tool_calls or [])
                if c.function is not None
            ]
            assert names == ["delegate"]
        async with anthropic.AsyncAnthropic(
            api_key="test", base_url=fake_provider_url, max_retries=0
        ) as claude:
            message = await claude.messages.create(
                model="c",
                max_tokens=50,
                messages=[{"role": "user", "content": "go"}],
                tools=_ANTHROPIC_TOOLS,  # type: ignore[arg-type]
            )
            assert message.stop_reason == "tool_use"
            assert message.content[0].type == "tool_use"
            async with claude.messages.stream(
                model="c",
                max_tokens=50,
                messages=[{"role": "user", "content": "go"}],
                tools=_ANTHROPIC_TOOLS,  # type: ignore[arg-type]
            ) as streamed:
                final = await streamed.get_final_message()
            assert final.content[0].type == "tool_use"
            assert final.content[0].input == {"task": "delegated task", "depth": 1}
        gc.collect()

"""Token estimates: characters / 4 of the prompt plus the output limit; tokenizers fall back."""

from __future__ import annotations

import json
import sys

import pytest
from lovely_coordinator_limits import (
    estimate_tokens,
    output_limit,
    prompt_text,
    text_tokens,
    tiktoken_tokenizer,
)


def test_openai_chat_prompt_and_max_tokens() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Be brief."},  # 9 characters
            {"role": "user", "content": [{"type": "text", "text": "x" * 30}]},
        ],
        "max_tokens": 200,
        "temperature": 0.5,
    }
    assert prompt_text(body) == "Be brief.\n" + "x" * 30
    assert estimate_tokens(body) == 10 + 200  # 40 characters, a newline between the parts
    assert estimate_tokens(json.dumps(body)) == 210
    assert estimate_tokens(json.dumps(body).encode()) == 210
    body["messages"][0]["content"] = "Be brief!!"  # type: ignore[index]
    assert estimate_tokens(body) == 11 + 200  # 41 characters: rounded up


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"max_completion_tokens": 50, "max_tokens": 7}, 50),
        ({"max_output_tokens": 64}, 64),
        ({"generationConfig": {"maxOutputTokens": 32}}, 32),
        ({"max_tokens": 10, "n": 3}, 30),
        ({"max_tokens": None, "max_output_tokens": 5}, 5),
        ({}, 0),
        ({"max_tokens": -1}, 0),
        ({"max_tokens": True}, 0),
        ({"max_tokens": "200"}, 0),
    ],
)
def test_the_output_limit(body: dict[str, object], expected: int) -> None:
    assert output_limit(body) == expected


def test_anthropic_gemini_and_responses_prompts() -> None:
    anthropic = {
        "system": [{"type": "text", "text": "abcd", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "efgh"}],
        "tools": [{"name": "search", "description": "find"}],
        "max_tokens": 8,
    }
    assert prompt_text(anthropic) == "abcd\nefgh\nsearch\nfind"
    gemini = {
        "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
        "systemInstruction": {"parts": [{"text": "sys"}]},
    }
    assert prompt_text(gemini) == "sys\nhello"
    responses = {"instructions": "be nice", "input": "question", "max_output_tokens": 3}
    assert estimate_tokens(responses) == 4 + 3  # "be nice\nquestion": 16 characters


def test_binary_payloads_and_structure_are_not_prompt_text() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + "A" * 999},
                    },
                    {"type": "input_audio", "input_audio": {"data": "B" * 999}},
                    {"type": "text", "text": "what is this?"},
                ],
            }
        ]
    }
    assert prompt_text(body) == "what is this?"


# The last: nested deeper than the JSON parser goes (it raised RecursionError).
@pytest.mark.parametrize("body", [b"\x89PNG", b"[1, 2]", "not json", b"", b"[" * 100_000])
def test_bodies_that_are_not_json_objects_cost_nothing(body: bytes | str) -> None:
    assert estimate_tokens(body) == 0


def test_a_working_tokenizer_counts_the_prompt() -> None:
    calls: list[str] = []

    def words(text: str) -> int:
        calls.append(text)
        return len(text.split())

    body = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 1}
    assert estimate_tokens(body, words) == 3 + 1
    assert calls == ["one two three"]


@pytest.mark.parametrize("result", [RuntimeError("offline"), -1, 2.5, None, True])
def test_a_failing_tokenizer_falls_back_to_characters(result: object) -> None:
    def tokenizer(text: str) -> int:
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[return-value]

    assert text_tokens("x" * 9, tokenizer) == 3


def test_tiktoken_missing_falls_back_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if tiktoken were not installed: the import fails, every count uses characters,
    # and the import is not attempted again.
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    tokenizer = tiktoken_tokenizer()
    assert text_tokens("x" * 8, tokenizer) == 2
    monkeypatch.delitem(sys.modules, "tiktoken")
    assert tokenizer("x" * 12) == 3


def test_tiktoken_failing_to_load_its_encoding_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # tiktoken downloads an encoding at first use; offline, get_encoding raises.
    class Offline:
        calls = 0

        @classmethod
        def get_encoding(cls, name: str) -> object:
            cls.calls += 1
            raise ConnectionError(f"cannot download {name}")

    monkeypatch.setitem(sys.modules, "tiktoken", Offline)
    tokenizer = tiktoken_tokenizer("cl100k_base")
    assert tokenizer("x" * 5) == 2
    assert tokenizer("x" * 5) == 2
    assert Offline.calls == 1


def test_tiktoken_when_its_encoding_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    class Encoding:
        def encode(self, text: str, *, disallowed_special: tuple[str, ...]) -> list[int]:
            assert disallowed_special == ()
            return [0] * len(text.split())

    class Loaded:
        @staticmethod
        def get_encoding(name: str) -> Encoding:
            assert name == "o200k_base"
            return Encoding()

    monkeypatch.setitem(sys.modules, "tiktoken", Loaded)
    assert tiktoken_tokenizer()("a b c <|endoftext|>") == 4

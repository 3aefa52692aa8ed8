"""The campaign's validators can fail: each rejects clearly invalid requests, accepts valid ones."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fuzz.generators import FORMATS, draw_session, render
from fuzz.validators import (
    FIRST_USER,
    validate,
    validate_anthropic,
    validate_normandy,
    validate_openai,
)
from normandy_core import AgentMemory


def _call(cid: str, name: str = "grep") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": '{"q": 1}'}}


OPENAI_OK: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "find it"},
    {"role": "assistant", "content": None, "tool_calls": [_call("c1"), _call("c2")]},
    {"role": "tool", "tool_call_id": "c2", "content": "two"},
    {"role": "tool", "tool_call_id": "c1", "content": "one"},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]},
    {"role": "assistant", "content": "found"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "", "tool_calls": [_call("c3")]},
]


def test_openai_accepts_a_valid_request_with_an_open_round() -> None:
    assert validate_openai(OPENAI_OK) == []
    assert validate_openai({"messages": OPENAI_OK}) == []


@pytest.mark.parametrize(
    ("case", "messages", "expected"),
    [
        (
            "orphaned tool result first",
            [{"role": "tool", "tool_call_id": "c1", "content": "x"}, *OPENAI_OK[1:]],
            "does not answer a tool call",
        ),
        (
            "unanswered tool call in the middle",
            [OPENAI_OK[1], OPENAI_OK[2], OPENAI_OK[3], OPENAI_OK[6]],
            "are not answered",
        ),
        (
            "tool message after a user message",
            [*OPENAI_OK[:4], {"role": "user", "content": "hm"}, OPENAI_OK[4]],
            "does not answer a tool call",
        ),
        ("tool call id twice", [*OPENAI_OK[:5], *OPENAI_OK[2:5]], "is also used"),
        ("role the API lacks", [{"role": "function", "content": "x"}], "not a Chat Completions"),
        ("empty content array", [{"role": "user", "content": []}], "empty array"),
        ("empty tool_calls", [{"role": "assistant", "tool_calls": []}], "empty array"),
        ("assistant without content", [{"role": "assistant"}], "content is missing"),
        (
            "arguments not JSON",
            [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{"}}
                    ],
                }
            ],
            "not JSON",
        ),
        ("no messages", [], "empty"),
    ],
)
def test_openai_rejects(case: str, messages: list[Any], expected: str) -> None:
    problems = validate_openai(messages)
    assert any(expected in p for p in problems), (case, problems)


def test_openai_open_round_only_where_allowed() -> None:
    assert any("never answered" in p for p in validate_openai(OPENAI_OK, allow_open_round=False))
    partial = [*OPENAI_OK[:2], OPENAI_OK[2], OPENAI_OK[3]]  # c1 of the batch unanswered
    assert any("never answered" in p for p in validate_openai(partial))


def _use(uid: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": uid, "name": "grep", "input": {"q": 1}}


def _result(uid: str, content: Any = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": uid, "content": content}


IMAGE = {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}
ANTHROPIC_OK: dict[str, Any] = {
    "system": [{"type": "text", "text": "be brief"}],
    "messages": [
        {"role": "user", "content": "find it"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "c2ln"},
                {"type": "redacted_thinking", "data": "b3BhcXVl"},
                _use("toolu_1"),
                _use("toolu_2"),
            ],
        },
        {
            "role": "user",
            "content": [
                _result("toolu_2", [{"type": "text", "text": "two"}, IMAGE]),
                _result("toolu_1"),
                {"type": "text", "text": "and then?"},
            ],
        },
        {"role": "user", "content": "also this"},  # consecutive user turns are combined
        {"role": "assistant", "content": "found"},
        {"role": "user", "content": [{"type": "text", "text": "again"}, IMAGE]},
        {"role": "assistant", "content": [_use("toolu_3")]},
    ],
}


def test_anthropic_accepts_a_valid_request_with_an_open_round() -> None:
    assert validate_anthropic(ANTHROPIC_OK) == []
    assert validate_anthropic(ANTHROPIC_OK["messages"]) == []


def _with(messages: list[Any]) -> dict[str, Any]:
    return {"system": "s", "messages": messages}


M = ANTHROPIC_OK["messages"]


@pytest.mark.parametrize(
    ("case", "request_", "expected"),
    [
        ("assistant first", _with(M[4:]), FIRST_USER),
        (
            "orphaned tool result",
            _with([{"role": "user", "content": [_result("toolu_9")]}, *M[4:]]),
            "unexpected tool_use_id",
        ),
        (
            "unanswered tool use in the middle",
            _with([M[0], M[1], {"role": "user", "content": "what?"}, *M[4:]]),
            "without tool_result blocks",
        ),
        (
            "one tool use of a batch unanswered",
            _with([M[0], M[1], {"role": "user", "content": [_result("toolu_1")]}, *M[4:]]),
            "without tool_result blocks",
        ),
        (
            "tool result after text",
            _with([M[0], M[1], {"role": "user", "content": "x"}, M[2], *M[4:]]),
            "must come first",
        ),
        ("system role in messages", _with([{"role": "system", "content": "x"}]), "not 'user'"),
        (
            "thinking in a user message",
            _with([{"role": "user", "content": [{"type": "thinking", "thinking": "t"}]}]),
            "not allowed in a user message",
        ),
        (
            "image in an assistant message",
            _with([M[0], {"role": "assistant", "content": [IMAGE]}]),
            "not allowed in a assistant message",
        ),
        ("empty text", _with([{"role": "user", "content": " \n"}, *M[4:]]), "whitespace"),
        ("empty content", _with([{"role": "user", "content": []}, *M[4:]]), "empty array"),
        ("tool use id twice", _with([*M[:3], M[4], M[5], M[1]]), "also used"),
        (
            "bad tool use id",
            _with([M[0], {"role": "assistant", "content": [_use("toolu 1")]}]),
            "does not match",
        ),
        ("no messages", {"system": "s", "messages": []}, "empty"),
    ],
)
def test_anthropic_rejects(case: str, request_: Any, expected: str) -> None:
    problems = validate_anthropic(request_)
    assert any(expected in p for p in problems), (case, problems)


def test_anthropic_open_round_only_where_allowed() -> None:
    problems = validate_anthropic(ANTHROPIC_OK, allow_open_round=False)
    assert any("no tool_result" in p for p in problems)


def _memory() -> AgentMemory:
    mem = AgentMemory()
    mem.add_message("system", "be brief", pinned=True)
    mem.add_message("user", "find it", turn_id="t1")
    mem.add_message("assistant", [_use("toolu_1")], turn_id="t1")
    mem.add_message("user", [_result("toolu_1")], turn_id="t1")
    mem.add_message("assistant", "found", turn_id="t1")
    return mem


def test_normandy_accepts_a_valid_dump_with_a_branch() -> None:
    mem = _memory()
    fork = mem.fork(mem.entries()[1].id)
    fork.add_message("assistant", "abandoned", turn_id="t1")
    assert validate_normandy(fork.fork(mem.head).dump()) == []
    assert validate_normandy(mem.dump()) == []


def test_normandy_rejects_broken_dumps() -> None:
    entries = _memory().entries()
    orphan = AgentMemory.from_entries([entries[0], entries[1], entries[3], entries[4]])
    assert any("without its tool use" in p for p in validate_normandy(orphan.dump()))
    unanswered = AgentMemory.from_entries([entries[0], entries[1], entries[2], entries[4]])
    assert any("not answered" in p for p in validate_normandy(unanswered.dump()))
    assistant_first = AgentMemory.from_entries([entries[0], entries[4]])
    assert any(FIRST_USER in p for p in validate_normandy(assistant_first.dump()))
    broken = _memory().dump()
    broken["head"] = "nope"
    assert any("parent chain" in p for p in validate_normandy(broken))


@pytest.mark.parametrize("fmt", FORMATS)
def test_generated_sessions_are_valid(fmt: Any) -> None:
    rng = random.Random(f"validators:{fmt}")
    for _ in range(25):
        session = draw_session(rng, fmt)
        assert validate(fmt, render(session)) == []

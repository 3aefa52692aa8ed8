"""The campaign's validators can fail: each rejects clearly invalid requests, accepts valid ones."""

from __future__ import annotations

import json
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
    validate_responses,
    validate_sdk,
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
        lc = bool(session.shape.get("lc_thinking"))
        assert validate(fmt, render(session), thinking=lc) == []


# -- decorated Chat Completions and Anthropic ------------------------------------------


def test_openai_custom_tool_calls() -> None:
    custom = {"id": "c9", "type": "custom", "custom": {"name": "patch", "input": "*** x"}}
    ok = [
        {"role": "user", "content": "go", "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": [custom]},
        {"role": "tool", "tool_call_id": "c9", "content": "applied"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
    ]
    assert validate_openai(ok) == []
    bad = {**custom, "custom": {"name": "patch", "input": {"x": 1}}}
    problems = validate_openai([ok[0], {**ok[1], "tool_calls": [bad]}, ok[2]])
    assert any("custom.input is not a string" in p for p in problems)


SERVER = [
    {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {"q": "x"}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": []},
    {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "f", "server_name": "s", "input": {}},
    {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "content": "ok"},
]


def test_anthropic_accepts_server_tools_search_results_and_future_blocks() -> None:
    request = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
                {
                    "type": "search_result",
                    "source": "https://x",
                    "title": "X",
                    "content": [{"type": "text", "text": "body"}],
                },
                {"type": "container_upload", "file_id": "file_1"},
                {"type": "fuzz_future_block", "payload": 1},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "compaction", "content": "earlier: greetings"},
                *SERVER,
                {
                    "type": "text",
                    "text": "done",
                    "citations": [{"type": "char_location", "cited_text": "b"}],
                },
            ],
        },
    ]
    assert validate_anthropic(request) == []


@pytest.mark.parametrize(
    ("case", "blocks", "expected"),
    [
        ("server use without result", SERVER[:1], "has no result in its assistant turn"),
        ("result before its use", [SERVER[1], SERVER[0]], "answers no server or MCP tool use"),
        (
            "result of another tool",
            [SERVER[0], {**SERVER[1], "type": "web_fetch_tool_result"}],
            "answers a 'web_search' tool use",
        ),
        ("bad server id", [{**SERVER[0], "id": "toolu_1"}, SERVER[1]], "does not match"),
        ("mcp result twice", [*SERVER[2:], SERVER[3]], "answers its tool use twice"),
        (
            "bad cache_control",
            [{"type": "text", "text": "x", "cache_control": {"type": "x"}}],
            "cache_control",
        ),
    ],
)
def test_anthropic_rejects_broken_server_tools(case: str, blocks: Any, expected: str) -> None:
    problems = validate_anthropic(
        [{"role": "user", "content": "go"}, {"role": "assistant", "content": blocks}]
    )
    assert any(expected in p for p in problems), (case, problems)


# -- OpenAI Responses -----------------------------------------------------------------


def _fc(cid: str, n: int = 0) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{cid}",
        "call_id": cid,
        "name": "read",
        "arguments": json.dumps({"n": n}),
    }


def _out(cid: str, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": cid, "output": "ok"}


REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
RESPONSES_OK: list[dict[str, Any]] = [
    {"role": "developer", "content": "be brief"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA"},
    REASONING,
    _fc("c1"),
    {"type": "custom_tool_call", "call_id": "c2", "name": "grep", "input": "TODO"},
    _out("c2", "custom_tool_call_output"),
    _out("c1"),
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "done", "annotations": []}],
    },
    {"role": "user", "content": "again"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
    _fc("c3"),
]


def test_responses_accepts_a_valid_list_with_an_open_round() -> None:
    assert validate_responses(RESPONSES_OK) == []
    assert validate_sdk("responses", RESPONSES_OK) == []
    problems = validate_responses(RESPONSES_OK, allow_open_round=False)
    assert any("never answered" in p for p in problems)


R = RESPONSES_OK


@pytest.mark.parametrize(
    ("case", "items", "expected"),
    [
        ("output without its call", [R[1], _out("zz")], "has no function_call before it"),
        ("call unanswered before the user", [R[1], _fc("c1"), R[9]], "have no output before"),
        ("output twice", [R[1], _fc("c1"), _out("c1"), _out("c1")], "answered twice"),
        (
            "output of another type",
            [R[1], _fc("c1"), _out("c1", "custom_tool_call_output")],
            "answers a function_call",
        ),
        ("call id twice", [R[1], _fc("c1"), _out("c1"), _fc("c1", 1), _out("c1")], "also used"),
        ("reasoning without its item", [R[1], REASONING, R[9]], "without its required following"),
        ("reasoning last", [R[1], REASONING], "without its required following"),
        (
            "reasoning before an output",
            [R[1], _fc("c1"), REASONING, _out("c1")],
            "without its required following",
        ),
        ("partly answered batch", [R[1], _fc("a"), _fc("b"), _out("a")], "never answered"),
        ("unknown item", [R[1], {"type": "function_result"}], "not a Responses input item"),
        ("call without name", [R[1], {**_fc("c1"), "name": None}, _out("c1")], "without 'name'"),
        ("arguments not JSON", [R[1], {**_fc("c1"), "arguments": "{"}, _out("c1")], "not JSON"),
        ("reasoning id prefix", [R[1], {**REASONING, "id": "x1"}, _fc("c1")], "begin with"),
        (
            "input part in an assistant message",
            [R[1], {**R[8], "content": [{"type": "input_text", "text": "x"}]}],
            "not allowed in an assistant message",
        ),
        (
            "output message without id",
            [R[1], {k: v for k, v in R[8].items() if k != "id"}],
            "without an id",
        ),
        (
            "image without detail",
            [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "https://x/a.png"}],
                }
            ],
            "detail",
        ),
        ("no items", [], "empty"),
    ],
)
def test_responses_rejects(case: str, items: list[Any], expected: str) -> None:
    problems = validate_responses(items)
    assert any(expected in p for p in problems), (case, problems)


def test_responses_local_shell_outputs_name_their_call_by_id() -> None:
    call = {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "call_ls1",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
    }
    out = {"type": "local_shell_call_output", "id": "call_ls1", "output": "{}"}
    assert validate_responses([R[1], call, out]) == []
    problems = validate_responses([R[1], call, {**out, "id": "lsh_1"}])
    assert any("has no local_shell_call before it" in p for p in problems)


def test_the_sdk_oracle_checks_in_depth() -> None:
    """The SDKs type arrays as ``Iterable``: without consuming them nothing inside is checked."""
    bad_block = [{"role": "user", "content": [{"type": "tool_result"}]}]
    assert validate_sdk("anthropic", bad_block)
    bad_call = [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function"}]}]
    assert validate_sdk("openai", bad_call)
    assert validate_sdk("responses", [{"type": "function_call", "call_id": "x"}])
    future = [{"role": "user", "content": [{"type": "fuzz_future_block", "x": 1}]}]
    assert validate_sdk("anthropic", future) == []
    assert validate_sdk("openai", OPENAI_OK) == []
    assert validate_sdk("anthropic", ANTHROPIC_OK) == []


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "responses"])
def test_generated_sessions_pass_the_sdk_oracle(fmt: Any) -> None:
    rng = random.Random(f"sdk:{fmt}")
    for _ in range(25):
        session = draw_session(rng, fmt)
        lc = bool(session.shape.get("lc_thinking"))
        assert validate_sdk(fmt, render(session), thinking=lc) == []


def test_chat_thinking_parts_are_accepted_only_when_asked_and_only_well_formed() -> None:
    think = {"type": "thinking", "thinking": "plan", "signature": "c2ln"}
    text = {"type": "text", "text": "ok"}
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [think, text]}]
    assert validate("openai", msgs)  # Chat Completions itself has no thinking parts
    assert validate("openai", msgs, thinking=True) == []
    assert validate_sdk("openai", msgs, thinking=True) == []
    late = [msgs[0], {"role": "assistant", "content": [text, think]}]
    assert any("after a text" in p for p in validate("openai", late, thinking=True))
    unsigned = [msgs[0], {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]
    assert any("signature" in p for p in validate("openai", unsigned, thinking=True))
    empty = [msgs[0], {"role": "assistant", "content": [{"type": "redacted_thinking"}, text]}]
    assert any("without data" in p for p in validate("openai", empty, thinking=True))
    in_user = [{"role": "user", "content": [think]}]
    assert validate("openai", in_user, thinking=True)

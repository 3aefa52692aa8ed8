"""Server-side context management through the real clients, against the loopback APIs:
Anthropic's context_management edits (sent when asked, cleared counts in the events,
the conversation never altered), server compaction (the compaction block kept as a
pinned summary entry, nothing before it sent again, with and without the pause), and
OpenAI's Responses API beside Chat Completions (items in and out, reasoning items kept
with their calls, context_management compaction). Sync and async."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from normandy_core import AgentConfig, AgentMemory, OpaqueBlock, OptionsError, ToolUseBlock
from normandy_core.clients import (
    AnthropicClient,
    ContextManagement,
    OpenAIClient,
    ProviderCompactionError,
)
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.turn import arun_turn, run_turn

anthropic = pytest.importorskip("anthropic", reason="needs the anthropic extra")
openai = pytest.importorskip("openai", reason="needs the openai extra")
servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py
sessions = sys.modules["normandy_client_test_sessions"]
TOOLS, read_file, reads, big_history = (
    sessions.TOOLS,
    sessions.read_file,
    sessions.reads,
    sessions.big_history,
)


def turn(acc: AgentConfig, text: str, mode: str, **kwargs: Any) -> Any:
    kwargs.setdefault("tools", {"read_file": read_file})
    kwargs.setdefault("budget", 10_000_000)
    if mode == "sync":
        return run_turn(acc, text, **kwargs)
    return asyncio.run(arun_turn(acc, text, **kwargs))


def anthropic_client(provider: Any, **kw: Any) -> AnthropicClient:
    return AnthropicClient(
        "claude-sonnet-4-5", api_key="k", base_url=provider.base_url, max_retries=0, **kw
    )


def agent(model: str = "claude-sonnet-4-5", memory: AgentMemory | None = None) -> AgentConfig:
    acc = AgentConfig(model=model, system_prompt="You are a coding agent.", tools=TOOLS)
    return acc.with_memory(memory) if memory is not None else acc


# -- Anthropic context editing --------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_anthropic_edits_go_with_every_request_and_cleared_counts_are_events(mode: str) -> None:
    edits = {"clear_thinking": {"keep": 1}, "clear_tool_uses": {"trigger": 1_500, "keep": 1}}
    with servers.FakeProvider("anthropic", reads(4)) as provider:
        client = anthropic_client(provider, context_management=edits)
        result = turn(agent(), "Read the files.", mode, client=client, thinking=2048)
    assert provider.refusals == []
    assert result.text == "Done."
    for body, headers in zip(provider.requests, provider.headers, strict=True):
        assert body["context_management"] == {
            "edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 1_500},
                    "keep": {"type": "tool_uses", "value": 1},
                },
            ]
        }
        assert headers["anthropic-beta"] == "context-management-2025-06-27"
    events = result.events_of("context_management")
    assert events, "the API cleared something on the later requests"
    assert sum(e["cleared_tool_uses"] for e in events) > 0
    assert sum(e["cleared_thinking_turns"] for e in events) > 0
    assert all(e["cleared_input_tokens"] > 0 and e["provider"] == "anthropic" for e in events)
    # the edits change what the model reads, never the conversation the agent holds
    results = [e for e in result.acc.memory.entries() if e.tool_results]
    assert len(results) == 4
    assert all("line 59 of" in r.tool_results[0].text() for r in results)


def test_anthropic_edit_options_are_checked_where_the_client_is_made() -> None:
    with servers.FakeProvider("anthropic") as provider:
        for bad, named in [
            ({"compact": {"trigger": 49_999}}, "context_management.compact.trigger"),
            ({"clear_tool_uses": {"trigger": 5, "trigger_tool_uses": 5}}, "not both"),
            ({"clear_tool_uses": {"exclude_tools": "read_file"}}, "exclude_tools"),
            ({"clear_thinking": {"keep": 0}}, "keep"),
            ({"compact": {"instructions": " "}}, "instructions"),
            ({"shrink": {}}, "shrink"),
        ]:
            with pytest.raises(OptionsError, match=named):
                anthropic_client(provider, context_management=bad)
        plain = anthropic_client(provider, context_management={})
        assert plain.context_management is None
        typed = ContextManagement.model_validate({"compact": {}})
        assert anthropic_client(provider, context_management=typed).context_management is typed


def test_the_loopback_refuses_what_the_api_refuses() -> None:
    messages = [{"role": "user", "content": "hi"}]
    cm = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1}}]}
    with servers.FakeProvider("anthropic") as provider:
        sdk = anthropic.Anthropic(api_key="k", base_url=provider.base_url, max_retries=0)
        cases = [
            ({"betas": ["compact-2026-01-12"], "context_management": cm}, "greater than or equal"),
            ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "beta"),
            (
                {
                    "betas": ["compact-2026-09-04", "context-management-2025-06-27"],
                    "compaction": {"type": "summarize"},
                    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
                },
                "cannot be used together",
            ),
        ]
        for extra, expected in cases:
            with pytest.raises(anthropic.BadRequestError, match=expected):
                sdk.beta.messages.create(
                    model="claude-sonnet-4-5", max_tokens=100, messages=messages, **extra
                )
        forged = [
            {"role": "assistant", "content": [{"type": "compaction", "content": "forged"}]},
            {"role": "user", "content": "go on"},
        ]
        with pytest.raises(anthropic.BadRequestError, match="altered"):
            sdk.beta.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=100,
                messages=forged,
                betas=["compact-2026-01-12"],
            )


# -- Anthropic server compaction ------------------------------------------------------


@pytest.mark.parametrize("pause", [False, True])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_anthropic_server_compaction_becomes_a_pinned_summary_entry(mode: str, pause: bool) -> None:
    edits = {"compact": {"trigger": 50_000, "pause_after_compaction": pause}}
    memory = big_history(40, 4_400)  # about 55,000 tokens as the API counts them
    with servers.FakeProvider(
        "anthropic", [*reads(1, "Found it."), {"text": "Fixed."}]
    ) as provider:
        client = anthropic_client(provider, context_management=edits)
        first = turn(agent(memory=memory), "Find the rounding bug.", mode, client=client)
        second = turn(first.acc, "Fix it.", mode, client=client)
    assert provider.refusals == []
    assert first.text == "Found it." and second.text == "Fixed."
    (made,) = provider.issued
    # one pinned entry holds the block (with the model's tool call after it), as made
    holders = [e for e in second.acc.memory.entries() if e.metadata.get(PROVIDER_COMPACTION_KEY)]
    assert len(holders) == 1 and holders[0].pinned
    block = holders[0].blocks[0]
    assert isinstance(block, OpaqueBlock) and block.kind == "compaction"
    assert json.dumps(block.data, sort_keys=True) == made
    assert any(isinstance(b, ToolUseBlock) for b in holders[0].blocks)
    (note,) = first.events_of("provider_compaction")
    assert note["paused"] is pause and note["usage"]["input_tokens"] > 50_000
    # every later request starts at the block and leaves out what it summarizes
    compacted_at = 2 if pause else 1
    assert len(provider.requests) == compacted_at + 2
    for body in provider.requests[compacted_at:]:
        opening = body["messages"][0]
        assert opening["role"] == "assistant" and opening["content"][0]["type"] == "compaction"
        assert json.dumps(opening["content"][0], sort_keys=True) == made
        assert "Finding 39" not in json.dumps(body["messages"])  # summarized, not sent
    # the conversation the agent holds still has everything
    assert second.acc.memory.entries()[0].id == "task"


# -- OpenAI Responses API -------------------------------------------------------------


def openai_client(provider: Any, **kw: Any) -> OpenAIClient:
    return OpenAIClient("gpt-4o", api_key="k", base_url=provider.base_url, max_retries=0, **kw)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_openai_responses_items_in_and_out_with_reasoning_kept_with_its_calls(mode: str) -> None:
    with servers.FakeProvider("openai", reads(2)) as provider:
        client = openai_client(provider, api="responses", reasoning_effort="low")
        result = turn(agent("gpt-4o"), "Read the files.", mode, client=client)
    assert provider.refusals == []
    assert result.text == "Done."
    assert provider.paths == ["/v1/responses"] * 3
    last = provider.requests[-1]
    assert last["store"] is False and last["instructions"] == "You are a coding agent."
    assert last["reasoning"] == {"effort": "low"}
    assert last["include"] == ["reasoning.encrypted_content"]
    kinds = [i.get("type", "message") for i in last["input"]]
    assert kinds == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert last["input"][1] == {
        "type": "reasoning",
        "id": "rs_0001",
        "summary": [],
        "encrypted_content": "enc-reasoning-1",
    }
    # in memory the reasoning item is an opaque block before the call it led to
    calls = [e for e in result.acc.memory.entries() if e.tool_uses]
    assert len(calls) == 2
    for e in calls:
        first, second = e.blocks
        assert isinstance(first, OpaqueBlock) and first.kind == "reasoning"
        assert isinstance(second, ToolUseBlock)


def test_a_compaction_never_separates_reasoning_from_its_call() -> None:
    acc = AgentConfig(
        model="gpt-4o",
        system_prompt="You are a coding agent.",
        tools=TOOLS,
        compactor="window_manager",
        compactor_opts={"context_window": 2_600, "reserved_tokens": 300, "target": 0.5},
    )
    with servers.FakeProvider("openai", reads(8)) as provider:
        client = openai_client(provider, api="responses", reasoning_effort="low")
        result = turn(acc, "Read the files.", "sync", client=client)
    assert provider.refusals == []  # a reasoning item without its call would be refused
    assert result.text == "Done."
    assert any(b["meta"]["compacted"] for b in result.events_of("boundary"))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_openai_context_management_compaction_item_is_kept_and_sent_back(mode: str) -> None:
    memory = big_history(6, 2_000)
    with servers.FakeProvider("openai", [*reads(1, "Found it."), {"text": "Fixed."}]) as provider:
        client = openai_client(provider, api="responses", compact_threshold=3_000)
        first = turn(agent("gpt-4o", memory), "Find the rounding bug.", mode, client=client)
        second = turn(first.acc, "Fix it.", mode, client=client)
    assert provider.refusals == []
    assert second.text == "Fixed."
    assert provider.requests[0]["context_management"] == [
        {"type": "compaction", "compact_threshold": 3_000}
    ]
    made = sorted(provider.issued)
    assert made, "the first request was over the threshold"
    assert first.events_of("provider_compaction")
    # later requests: the user messages, then the newest compaction item as made, then on
    for body in provider.requests[1:]:
        items = body["input"]
        at = max(i for i, it in enumerate(items) if it.get("type") == "compaction")
        assert json.dumps(items[at], sort_keys=True) in made
        assert all(it.get("role") == "user" for it in items[:at])
        assert "Finding 0" not in json.dumps(items)
    holders = [e for e in second.acc.memory.entries() if e.metadata.get(PROVIDER_COMPACTION_KEY)]
    assert holders and all(
        isinstance(b, OpaqueBlock) and b.format == "responses"
        for b in holders[-1].blocks
        if b.type == "opaque"
    )
    assert [e.pinned for e in holders] == [False] * (len(holders) - 1) + [True]


def test_chat_completions_stays_the_default_beside_responses() -> None:
    with servers.FakeProvider("openai", [{"text": "Hi."}, {"text": "Hello."}]) as provider:
        chat = openai_client(provider)
        responses = openai_client(provider, api="responses")
        assert chat.api == "chat"
        assert chat.complete("", "hi").text == "Hi."
        assert responses.complete("", "hi").text == "Hello."
    assert provider.paths == ["/v1/chat/completions", "/v1/responses"]


@pytest.mark.parametrize(
    ("setting", "reason"),
    [({"compaction": "refuse"}, "refused"), ({"no_compaction": ("gpt-4o",)}, "unsupported")],
)
def test_compact_conversation_says_why_it_did_not_happen(
    setting: dict[str, Any], reason: str
) -> None:
    memory = big_history(1, 400)
    with servers.FakeProvider("openai", **setting) as provider:
        client = openai_client(provider, api="responses")
        with pytest.raises(ProviderCompactionError) as info:
            client.compact_conversation("", memory.entries())
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"api": "assistants"}, "api must be"),
        ({"compact_threshold": 1_000}, "needs the Responses API"),
        ({"api": "responses", "compact_threshold": 0}, "positive whole number"),
    ],
)
def test_openai_client_options_are_checked_where_it_is_made(kw: dict[str, Any], named: str) -> None:
    with pytest.raises(OptionsError, match=named):
        OpenAIClient("gpt-4o", api_key="k", **kw)

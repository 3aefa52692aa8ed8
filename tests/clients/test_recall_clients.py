"""The recall tool through the real Anthropic and OpenAI clients, against the loopback APIs.

The provider's fake model reads a file that holds a fact, reads until window_manager
drops it, then calls ``recall``; the archive is SQLite in a temporary directory. Every
request must be one the API accepts (the loopback servers refuse what the real ones
do, tool definitions included), the recall call answered in the provider's shape.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recall_session import FACT, agent, read_file, script_actions

from normandy_core import RecallSettings
from normandy_core.clients import AnthropicClient, OpenAIClient
from normandy_core.contract.recall import RECALL_TAG
from normandy_core.conversation.calibration import default_calibration
from normandy_core.turn import arun_turn, run_turn

pytest.importorskip("anthropic", reason="needs the anthropic extra")
pytest.importorskip("openai", reason="needs the openai extra")
servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py

LIMIT = 800


@pytest.fixture(autouse=True)
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh archive; the process-wide calibration, which the providers' usage feeds,
    is reset before and after (other tests size with it)."""
    path = tmp_path / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)
    default_calibration().reset()
    yield path
    default_calibration().reset()


def _client(kind: str, provider: Any) -> Any:
    if kind == "anthropic":
        return AnthropicClient(
            "claude-sonnet-4-5", api_key="test-key", base_url=provider.base_url, max_retries=0
        )
    return OpenAIClient("gpt-4o", api_key="test-key", base_url=provider.base_url, max_retries=0)


def _session(kind: str, mode: str) -> tuple[Any, Any]:
    model = "claude-sonnet-4-5" if kind == "anthropic" else "gpt-4o"
    acc = agent(model=model, recall=RecallSettings(limit_tokens=LIMIT))
    kwargs: dict[str, Any] = {"tools": {"read_file": read_file}}
    if kind == "anthropic":
        kwargs["thinking"] = 2048
    with servers.FakeProvider(kind, script_actions("ERR-7731 ledger")) as provider:
        kwargs["client"] = _client(kind, provider)
        if mode == "sync":
            result = run_turn(acc, "Why do invoices drift?", **kwargs)
        else:
            result = asyncio.run(arun_turn(acc, "Why do invoices drift?", **kwargs))
    return provider, result


def _recall_answer(kind: str, body: dict[str, Any]) -> tuple[str, str]:
    """The recall call's id and its answer's text, from the last request's wire format."""
    msgs = body["messages"]
    if kind == "anthropic":
        use = next(b for b in msgs[-2]["content"] if b["type"] == "tool_use")
        assert use["name"] == "recall"
        result = msgs[-1]["content"][0]
        assert result["type"] == "tool_result" and result["tool_use_id"] == use["id"]
        assert not result.get("is_error")
        content = result["content"]
        text = content if isinstance(content, str) else content[0]["text"]
        return use["id"], text
    call = msgs[-2]["tool_calls"][0]
    assert call["function"]["name"] == "recall"
    assert json.loads(call["function"]["arguments"]) == {"query": "ERR-7731 ledger"}
    assert msgs[-1]["role"] == "tool" and msgs[-1]["tool_call_id"] == call["id"]
    return call["id"], msgs[-1]["content"]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_the_model_recalls_a_dropped_output_through_the_real_client(kind, mode):
    provider, result = _session(kind, mode)
    assert provider.refusals == []  # every request, the recall definition included, accepted
    assert result.text == "Done."
    assert result.compacted
    assert FACT in "\n".join(e.text() for e in result.dropped)
    # the definition went out in the provider's own format, beside the agent's tool
    tools = provider.requests[0]["tools"]
    if kind == "anthropic":
        assert [t["name"] for t in tools] == ["read_file", "recall"]
        assert tools[1]["input_schema"]["required"] == ["query"]
    else:
        assert [t["function"]["name"] for t in tools] == ["read_file", "recall"]
        assert tools[1]["function"]["parameters"]["required"] == ["query"]
    # before the recall, the fact was gone from what the model was sent; the marker said
    # how to get it back
    before = json.dumps(provider.requests[-2]["messages"])
    assert FACT not in before
    assert "`recall` tool brings them back" in before
    _, text = _recall_answer(kind, provider.requests[-1])
    assert text.startswith(RECALL_TAG)
    assert FACT in text
    counter = result.acc.prepared.counter_for(result.acc.model)
    assert counter.count_text(text) <= LIMIT
    if kind == "anthropic":  # a mid-round compaction stripped the thinking: off, then on
        assert result.events_of("thinking_disabled")

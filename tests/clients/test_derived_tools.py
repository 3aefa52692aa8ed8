"""Derived tool definitions (issue 15) as the real SDK clients send them to the loopback
providers, which refuse malformed tool definitions as the APIs do."""

from __future__ import annotations

import sys
from typing import Literal

import pytest

from normandy_core import AgentConfig
from normandy_core.clients import AnthropicClient, OpenAIClient
from normandy_core.turn import run_turn, tool_definition

servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py


def grep(
    pattern: str, paths: list[str] | None = None, mode: Literal["regex", "fixed"] = "fixed"
) -> str:
    """Find lines matching a pattern.

    Args:
        pattern: What to look for.
        paths: Files to search (default: all).
        mode: How to read ``pattern``.
    """
    return f"{mode}:{pattern} in {', '.join(paths or ['*'])}: 2 matches"


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_a_derived_definition_reaches_the_provider_in_its_format(kind: str) -> None:
    pytest.importorskip(kind, reason=f"needs the {kind} extra")
    model = "claude-sonnet-4-5" if kind == "anthropic" else "gpt-4o"
    script = [
        {"tools": [("grep", {"pattern": "round(", "paths": ["billing.py"]})]},
        {"text": "Two."},
    ]
    with servers.FakeProvider(kind, script) as provider:
        if kind == "anthropic":
            client = AnthropicClient(model, api_key="k", base_url=provider.base_url, max_retries=0)
        else:
            client = OpenAIClient(model, api_key="k", base_url=provider.base_url, max_retries=0)
        result = run_turn(AgentConfig(model=model), "How often?", client=client, tools=[grep])
    assert provider.refusals == []
    assert result.text == "Two."
    definition = tool_definition(grep)
    sent = provider.requests[0]["tools"]
    if kind == "anthropic":
        assert sent == [definition]
    else:
        assert sent == [
            {
                "type": "function",
                "function": {
                    "name": "grep",
                    "parameters": definition["input_schema"],
                    "description": "Find lines matching a pattern.",
                },
            }
        ]
    output = result.acc.memory.entries()[2].tool_results[0].text()
    assert output == "fixed:round( in billing.py: 2 matches"  # the model's call reached grep


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_the_loopback_refuses_a_malformed_tool_definition(kind: str) -> None:
    """The check the test above relies on can fail: a definition the API refuses is refused."""
    pytest.importorskip(kind, reason=f"needs the {kind} extra")
    from normandy_core.clients import ModelClientError

    bad = {"name": "has space", "input_schema": {"type": "object", "properties": {}}}
    with servers.FakeProvider(kind, [{"text": "no"}]) as provider:
        cls = AnthropicClient if kind == "anthropic" else OpenAIClient
        client = cls("m", api_key="k", base_url=provider.base_url, max_retries=0)
        with pytest.raises(ModelClientError, match="name"):
            client.complete("", "hi", tools=[bad])
    assert len(provider.refusals) == 1

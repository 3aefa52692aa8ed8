"""The turn result's typed fields: present on every turn, from the turn's boundaries."""

from __future__ import annotations

import asyncio
from typing import Any

from normandy_core import AgentConfig, TextBlock, ToolUseBlock
from normandy_core.clients import ModelReply, ScriptedClient, Usage
from normandy_core.turn import TurnResult, arun_turn, run_turn

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]


def read_file(path: str) -> str:
    return "\n".join(f"def f_{k}(x):\n    return x * {k}  # {path}" for k in range(60))


def reply(*blocks: Any) -> ModelReply:
    return ModelReply(content=tuple(blocks), usage=Usage(0, 20))


def script() -> list[ModelReply]:
    reads = [
        reply(ToolUseBlock(id=f"c{n}", name="read_file", input={"path": f"m{n}.py"}))
        for n in range(6)
    ]
    return [*reads, reply(TextBlock(text="The bug is in m3.py."))]


def agent(window: int) -> AgentConfig:
    return AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt="You are a careful coding agent.",
        tools=TOOLS,
        compactor="window_manager",
        compactor_opts={"context_window": window, "reserved_tokens": 300, "target": 0.5},
    )


def fields(result: TurnResult) -> tuple[Any, ...]:
    return (
        result.compacted,
        result.tokens_before,
        result.tokens_after,
        result.tokens_removed,
        result.dropped,
        result.error,
        result.archive,
    )


def test_a_turn_that_compacts_nothing_has_every_field() -> None:
    client = ScriptedClient([reply(TextBlock(text="Hello."))])
    result = run_turn(agent(200_000), "Hi there.", client=client)
    compacted, before, after, removed, dropped, error, archive = fields(result)
    assert compacted is False and removed == 0 and dropped == [] and error is None
    assert archive is None
    assert type(before) is int and before == after > 0  # one boundary, nothing removed
    (boundary,) = result.events_of("boundary")
    assert boundary["meta"]["tokens_before"] == boundary["meta"]["tokens_after"] == before


def test_a_turn_that_compacts_sums_its_boundaries() -> None:
    client = ScriptedClient(script())
    result = run_turn(agent(3000), "Find the bug.", client=client, tools={"read_file": read_file})
    events = [b["meta"] for b in result.events_of("boundary")]
    assert len(events) == 7 and any(m["compacted"] for m in events)
    for m in events:  # every boundary reports its figures, compacted or not
        assert isinstance(m["tokens_before"], int) and isinstance(m["tokens_after"], int)
        if not m["compacted"]:
            assert m["tokens_before"] == m["tokens_after"]
    assert result.compacted is True and result.error is None
    assert result.tokens_before == events[0]["tokens_before"]
    assert result.tokens_after == events[-1]["tokens_after"]
    assert result.tokens_removed == sum(m.get("tokens_removed", 0) for m in events) > 0
    assert [e.id for e in result.dropped] == [i for m in events for i in m["dropped_ids"]]
    last = [m for m in events if m["dropped_count"]][-1]
    # the workspace's archive hook recorded the last compaction's entries
    assert result.archive is not None and result.archive["entries"] == last["dropped_count"]


def test_a_turn_whose_compactor_fails_reports_the_error() -> None:
    client = ScriptedClient([reply(TextBlock(text="Too long to read."))])
    result = run_turn(agent(3000), "word " * 4000, client=client)
    assert result.compacted is False and result.error and "cannot fit" in result.error
    assert result.tokens_before == result.tokens_after > 3000
    assert result.tokens_removed == 0 and result.dropped == [] and result.archive is None


def test_the_async_shell_has_the_same_fields() -> None:
    client = ScriptedClient(script())
    result = asyncio.run(
        arun_turn(agent(3000), "Find the bug.", client=client, tools={"read_file": read_file})
    )
    events = [b["meta"] for b in result.events_of("boundary")]
    assert result.compacted and result.tokens_before == events[0]["tokens_before"]
    assert result.tokens_removed == sum(m.get("tokens_removed", 0) for m in events)

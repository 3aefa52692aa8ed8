"""``run_turn`` and ``arun_turn`` never change the caller's config (issue 15).

The turn used to append its messages to the caller's memory (``result.acc is agent`` until
a compaction replaced it), while configs are documented as frozen. Now the turn works on a
derived config and returns it: the caller's config and memory stay equal to a deep copy
taken before the turn, whatever the turn did (compacted, compacted nothing, failed).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from normandy_core import AgentConfig, AgentMemory, TextBlock, ToolResultBlock, ToolUseBlock
from normandy_core.clients import ModelReply, ScriptedClient, Usage
from normandy_core.turn import TurnAborted, arun_turn, run_turn

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
#: Fields compared by identity: services the config refers to, not state of its own.
SHARED = ("client", "catalog", "calibration")


def read_file(path: str) -> str:
    return "\n".join(f"def f_{k}(x):\n    return x * {k}  # {path}" for k in range(60))


def history(turns: int) -> AgentMemory:
    mem = AgentMemory()
    for t in range(turns):
        mem.add_message("user", f"Look at old{t}.py.", turn_id=f"old{t}")
        use = ToolUseBlock(id=f"old_{t}", name="read_file", input={"path": f"old{t}.py"})
        mem.add_message("assistant", (use,), turn_id=f"old{t}")
        result = ToolResultBlock(tool_use_id=use.id, content=read_file(f"old{t}.py"))
        mem.add_message("user", (result,), turn_id=f"old{t}")
        mem.add_message("assistant", f"old{t}.py is fine.", turn_id=f"old{t}")
    return mem


def agent(compactor: str, window: int, turns: int) -> AgentConfig:
    opts: dict[str, Any] = {}
    if compactor == "window_manager":
        opts = {"context_window": window, "reserved_tokens": 300, "target": 0.5}
    return AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt="You are a careful coding agent.",
        tools=TOOLS,
        compactor=compactor,
        compactor_opts=opts,
    ).with_memory(history(turns))


def script(batches: int) -> list[ModelReply]:
    reads = [
        ModelReply(
            content=(ToolUseBlock(id=f"c{n}", name="read_file", input={"path": f"m{n}.py"}),),
            usage=Usage(0, 20),
        )
        for n in range(batches)
    ]
    return [*reads, ModelReply(content=(TextBlock(text="Found it."),), usage=Usage(0, 5))]


def state(acc: AgentConfig) -> dict[str, Any]:
    """Everything observable of a config and its memory, deep-copied."""
    fields = {
        f.name: getattr(acc, f.name)
        for f in dataclasses.fields(acc)
        if not f.name.startswith("_") and f.name not in SHARED and f.name != "memory"
    }
    mem = acc.memory
    return copy.deepcopy(
        {
            "fields": fields,
            "memory": mem.dump(),
            "active": [e.model_dump() for e in mem],
            "head": mem.head,
            "version": mem.version,
            "len": len(mem),
            "prepared": id(acc.prepared),
            "prompt_tokens": acc.prompt_tokens,
        }
    )


def check_untouched(acc: AgentConfig, before: dict[str, Any], shared: dict[str, Any]) -> None:
    assert state(acc) == before
    for name, value in shared.items():
        assert getattr(acc, name) is value


def check_result(acc: AgentConfig, result: Any, batches: int) -> None:
    assert result.acc is not acc and result.acc.memory is not acc.memory
    new = result.acc.memory.entries()
    assert new[-1].text() == result.text  # the turn's messages are in the result's config
    assert sum(1 for e in new if e.tool_results and e.turn_id == result.turn_id) <= batches
    if not result.compacted:  # nothing dropped: the caller's history, then the turn
        assert [e.id for e in new[: len(acc.memory)]] == [e.id for e in acc.memory]
        assert len(new) == len(acc.memory) + 2 + 2 * batches


@pytest.mark.parametrize(
    ("compactor", "window"),
    [("window_manager", 3000), ("window_manager", 200_000), ("noop", 200_000)],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_callers_config_and_memory_are_unchanged(compactor: str, window: int, mode: str):
    acc = agent(compactor, window, turns=2)
    before = state(acc)
    shared = {name: getattr(acc, name) for name in SHARED}
    kwargs: dict[str, Any] = {
        "client": ScriptedClient(script(4)),
        "tools": {"read_file": read_file},
        "budget": 100_000,
    }
    if mode == "sync":
        result = run_turn(acc, "Find the bug.", **kwargs)
    else:
        result = asyncio.run(arun_turn(acc, "Find the bug.", **kwargs))
    assert result.compacted is (window == 3000)
    check_untouched(acc, before, shared)
    check_result(acc, result, 4)
    # the next turn starts from the result's config, and leaves that one unchanged too
    after_first = state(result.acc)
    second = run_turn(
        result.acc, "And now?", client=ScriptedClient(script(1)), tools=kwargs["tools"]
    )
    assert state(result.acc) == after_first
    assert second.acc.memory.entries()[-1].text() == "Found it."


def test_a_failed_turn_leaves_the_callers_config_unchanged():
    acc = agent("window_manager", 3000, turns=2)
    before = state(acc)
    client = ScriptedClient(script(3)[:2])  # runs out after two tool batches
    with pytest.raises(TurnAborted) as info:
        run_turn(acc, "Find the bug.", client=client, tools={"read_file": read_file})
    check_untouched(acc, before, {"client": None})
    # the turn so far is on the error's own config
    assert info.value.acc is not acc
    assert info.value.acc.memory.entries()[-1].tool_results


@settings(max_examples=15, deadline=None)
@given(
    batches=st.integers(min_value=0, max_value=4),
    turns=st.integers(min_value=0, max_value=3),
    window=st.sampled_from([2500, 4000, 8000, 200_000]),
)
def test_no_turn_changes_the_config_it_was_given(batches: int, turns: int, window: int):
    acc = agent("window_manager", window, turns)
    before = state(acc)
    client = ScriptedClient(script(batches))
    result = run_turn(acc, "Find the bug.", client=client, tools={"read_file": read_file})
    check_untouched(acc, before, {"client": None})
    check_result(acc, result, batches)
    assert result.error is None

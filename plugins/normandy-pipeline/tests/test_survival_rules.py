"""pipeline and the survival rules: every step gets them where the config is made and at
every boundary, and each step's result is checked against them."""

from __future__ import annotations

from typing import Any

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    OptionsError,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    run_compaction,
)
from normandy_core.clients.base import ModelReply
from normandy_core.clients.scripted import ScriptedClient

CLEAR = {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 2_000, "keep": 1}}


def _wm(**opts: Any) -> dict[str, Any]:
    return {
        "compactor": "window_manager",
        "opts": {"counter": "cl100k_base", "reserved_tokens": 0, **opts},
    }


def _session(rounds: int) -> AgentMemory:
    mem = AgentMemory()
    mem.add_message("system", "You are a coding agent.", id="sys")
    mem.add_message("user", "Fix the parser.", id="task", turn_id="t1")
    for r in range(rounds):
        name = "read_file" if r % 3 == 0 else "search"
        mem.add_message(
            "assistant", (ToolUseBlock(id=f"u{r}", name=name, input={"n": r}),), id=f"a{r}"
        )
        body = f"{name} output {r} " * 150
        mem.add_message("user", (ToolResultBlock(tool_use_id=f"u{r}", content=body),), id=f"r{r}")
    mem.add_message("assistant", "Read them.", id="done")
    return mem


def _acc(steps: list[dict[str, Any]], **kw: Any) -> AgentConfig:
    return AgentConfig(
        model="gpt-4o",
        compactor="pipeline",
        compactor_opts={"steps": steps, "context_window": 4_000, "counter": "cl100k_base"},
        **kw,
    )


def test_every_step_honours_the_rules() -> None:
    mem = _session(12)
    acc = _acc([CLEAR, _wm()], survival={"keep_tools": ["read_file"]}).with_memory(mem)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted, meta
    kept = {e.id: e for e in new_acc.memory.entries()}
    for eid in ["sys", "task", *(f"{x}{r}" for r in (0, 3, 6, 9) for x in "ar")]:
        assert kept[eid].content == mem.get(eid).content, eid  # neither cleared nor dropped
    assert [s["compactor"] for s in meta["steps"]] == ["clear_tool_results", "window_manager"]
    assert meta["steps"][1]["compacted"] is True  # the window step dropped search rounds


def test_summary_instructions_reach_a_summarize_step() -> None:
    client = ScriptedClient([ModelReply(content=(TextBlock(text="Searched a lot."),))] * 3)
    idle = {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 10**6}}
    steps = [idle, _wm(strategy="summarize", summarizer="model", summary_max_tokens=200)]
    acc = _acc(steps, client=client, survival={"summary_instructions": "Name every file."})
    new_acc, meta = run_compaction(acc.with_memory(_session(12)), mid_round=False)
    assert meta.compacted, meta
    assert client.requests and client.requests[0].system.endswith("\nName every file.")
    assert new_acc.memory.entries()[1].id == "task"


def test_a_step_that_cannot_honour_a_rule_refuses_the_pipeline_naming_it() -> None:
    with pytest.raises(OptionsError) as err:
        _acc([CLEAR, _wm()], survival={"summary_instructions": "Name every file."})
    text = str(err.value)
    assert text.startswith(
        "normandy_core.AgentConfig() pipeline steps[1] ('window_manager'): compactor "
        "'window_manager' cannot honour survival rule 'summary_instructions'"
    ), text

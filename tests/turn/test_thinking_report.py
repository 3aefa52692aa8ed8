"""Stripped thinking reported where users look (issue 34 item 6).

Every compaction's meta says whether it stripped thinking (``thinking_stripped``, computed
by the boundary for any compactor); every ``on_boundary`` hook learns whether the model
call after the boundary goes without thinking (``BoundaryInfo.thinking_disabled``), so
those flags sum to the turn's ``thinking_disabled_calls``; the turn result says whether
any of its compactions stripped thinking.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from normandy_core import (
    AgentConfig,
    BoundaryInfo,
    CompactionMeta,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    hookimpl,
    register_compactor,
    register_hook,
    run_compaction,
    unregister_compactor,
    unregister_hook,
)
from normandy_core.clients import ModelReply, ScriptedClient, Usage
from normandy_core.turn import TurnResult, run_turn

support = sys.modules["normandy_turn_test_support"]  # loaded by conftest.py

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


def reply(n: int, *blocks: Any) -> ModelReply:
    thought = ThinkingBlock(thinking=f"Step {n}: what next?", signature=f"sig-{n}")
    return ModelReply(content=(thought, *blocks), usage=Usage(0, 20))


def script(reads: int = 6) -> list[ModelReply]:
    calls = [
        reply(n, ToolUseBlock(id=f"c{n}", name="read_file", input={"path": f"m{n}.py"}))
        for n in range(reads)
    ]
    return [*calls, reply(reads, TextBlock(text="The bug is in m3.py."))]


def agent(compactor: str, window: int = 2600) -> AgentConfig:
    opts: dict[str, Any] = {"context_window": window}
    if compactor == "window_manager":
        opts.update(reserved_tokens=300, target=0.5, round_aware=False)
    return AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt="You are a careful coding agent.",
        tools=TOOLS,
        compactor=compactor,
        compactor_opts=opts,
    )


class _Observer:
    """An ``on_boundary`` hook plugin that keeps each boundary's meta and info."""

    def __init__(self) -> None:
        self.seen: list[tuple[CompactionMeta, BoundaryInfo]] = []

    @hookimpl
    def on_boundary(self, acc: Any, ctx: Any, meta: Any, info: BoundaryInfo) -> None:
        self.seen.append((meta, info))


@pytest.fixture
def observer() -> Iterator[_Observer]:
    recorder = _Observer()
    name = register_hook(recorder, name=f"thinking-observer-{id(recorder)}")
    yield recorder
    unregister_hook(name)


def _turn(acc: AgentConfig, thinking: int | None) -> tuple[TurnResult, ScriptedClient]:
    client = ScriptedClient(script(), model=acc.model)
    result = run_turn(
        acc, "Find the bug.", client=client, tools={"read_file": read_file}, thinking=thinking
    )
    return result, client


@pytest.mark.parametrize("compactor", ["window_manager", "stand-in"])
def test_every_compaction_says_whether_it_stripped_thinking(compactor, keep_tail, observer):
    acc = agent(keep_tail if compactor == "stand-in" else compactor)
    result, _ = _turn(acc, 2048)
    compactions = [meta for meta in result.boundaries if meta["compacted"]]
    assert compactions, "the small window should compact"
    # a compactor that does not report it (the stand-in) gets it from the boundary
    assert all(isinstance(meta["thinking_stripped"], bool) for meta in compactions)
    assert any(meta["thinking_stripped"] for meta in compactions)
    assert result.thinking_stripped
    # the boundary events of run_turn's on_event carry it too
    events = [e["meta"] for e in result.events_of("boundary") if e["meta"]["compacted"]]
    assert [e["thinking_stripped"] for e in events] == [m["thinking_stripped"] for m in compactions]
    # ...and the hooks read it as a typed property
    seen = [meta for meta, info in observer.seen if info.compacted]
    assert [meta.thinking_stripped for meta in seen] == [
        m["thinking_stripped"] for m in compactions
    ]


def test_a_compaction_that_kept_no_thinking_did_not_strip_it():
    def drop_oldest(acc: AgentConfig, ctx: Any, opts: Any) -> Any:
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[2:])), {
            "compacted": True,
            "dropped": entries[:2],
        }

    class Plugin:
        @hookimpl
        def needs_window(self, opts: Any) -> bool:
            return False

        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
            return drop_oldest(acc, ctx, opts)

    register_compactor("drop-oldest-thinking", Plugin())
    try:
        acc = AgentConfig(compactor="drop-oldest-thinking", survival={"keep_first_user": False})
        for i in range(6):
            acc.memory.add_message("user" if i % 2 == 0 else "assistant", f"message {i}")
        _, meta = run_compaction(acc, mid_round=False)
        assert meta.compacted and meta["thinking_stripped"] is False
        assert meta.thinking_stripped is False
        _, skipped = run_compaction(AgentConfig(compactor="noop"), mid_round=False)
        assert skipped.thinking_stripped is False and "thinking_stripped" not in skipped
    finally:
        unregister_compactor("drop-oldest-thinking")


@pytest.mark.parametrize("compactor", ["window_manager", "stand-in"])
def test_on_boundary_learns_which_calls_go_without_thinking(compactor, keep_tail, observer):
    acc = agent(keep_tail if compactor == "stand-in" else compactor)
    result, client = _turn(acc, 2048)
    infos = [info for _, info in observer.seen]
    # one boundary before each model call, and each says whether that call goes without
    assert len(infos) == len(client.requests)
    disabled = [req.effective_thinking is None for req in client.requests]
    assert [info.thinking_disabled for info in infos] == disabled
    assert sum(disabled) == result.thinking_disabled_calls > 0


def test_without_thinking_asked_no_call_is_counted_as_disabled(keep_tail, observer):
    result, client = _turn(agent(keep_tail), None)
    assert result.compacted and result.thinking_disabled_calls == 0
    assert not any(info.thinking_disabled for _, info in observer.seen)
    assert len(observer.seen) == len(client.requests)

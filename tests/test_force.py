"""Compaction on request: ``compact(force=True)`` and ``run_compaction(force=True)``.

A conversation well under its compactor's trigger is compacted now; a compactor that
cannot says why in ``meta["declined"]``; a compactor that does not know ``ctx.force``
keeps working and the boundary gives the reason; ``focus`` reaches the model
summarizer's request. Real installed distributions, real tokenizers, a scripted client
standing in for the summarizing model.
"""

from __future__ import annotations

from typing import Any

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    BoundaryInfo,
    TextBlock,
    compact,
    hookimpl,
    register_compactor,
    register_hook,
    run_compaction,
    unregister_compactor,
    unregister_hook,
)
from normandy_core.clients import ModelReply, ScriptedClient

WINDOW = 100_000
FOCUS = "the parser rewrite in src/parser.py"


def _reply(text: str) -> ModelReply:
    return ModelReply(content=(TextBlock(text=text),))


def _messages(turns: int = 6) -> list[dict[str, Any]]:
    """A chat of ``turns`` exchanges, a few hundred tokens: far under any trigger."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(turns):
        out.append({"role": "user", "content": f"Step {i}: look at module m{i}.py. " * 4})
        out.append({"role": "assistant", "content": f"Module m{i}.py has {i} functions. " * 6})
    return out


def _memory(turns: int = 6) -> AgentMemory:
    memory = AgentMemory()
    memory.add_message("system", "You are a coding agent.")
    for i in range(turns):
        memory.add_message("user", f"Step {i}: look at module m{i}.py. " * 4, turn_id=f"t{i}")
        memory.add_message("assistant", f"Module m{i}.py has {i} functions. " * 6, turn_id=f"t{i}")
    return memory


def test_a_conversation_under_its_trigger_is_compacted_on_request() -> None:
    messages = _messages()
    plain = compact(messages, window=WINDOW, model="gpt-4o", fresh=True)
    assert plain.meta == {"compacted": False}  # far under trigger: nothing to do
    forced = compact(messages, window=WINDOW, model="gpt-4o", fresh=True, force=True)
    assert forced.meta["compacted"] is True
    assert forced.meta["tokens_after"] < forced.meta["tokens_before"]
    # the system prompt, the task (first user message) and the newest exchange stay
    kept = forced.messages
    assert kept[0] == messages[0] and kept[1] == messages[1]
    assert kept[-1] == messages[-1]
    assert len(forced.dropped) == len(messages) - 4
    assert "declined" not in forced.meta


def test_run_compaction_force_reports_the_forced_trigger() -> None:
    seen: list[BoundaryInfo] = []

    class Observer:
        @hookimpl
        def on_boundary(self, acc: Any, ctx: Any, meta: Any, info: BoundaryInfo) -> None:
            seen.append(info)

    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={"context_window": WINDOW},
        memory=_memory(),
    )
    register_hook(Observer(), name="force-observer")
    try:
        skipped = run_compaction(acc, mid_round=False)
        forced = run_compaction(acc, mid_round=False, force=True)
    finally:
        unregister_hook("force-observer")
    assert not skipped.meta.compacted and forced.meta.compacted
    assert [info.trigger for info in seen] == ["scheduled", "forced"]
    assert acc.memory.entries() != forced.acc.memory.entries()


def test_the_focus_reaches_the_model_summarizer_request() -> None:
    client = ScriptedClient([_reply("Parser work: m0..m4 read; next m5.")])
    result = compact(
        _messages(),
        window=WINDOW,
        model="gpt-4o",
        opts={"strategy": "summarize", "summarizer": "model"},
        client=client,
        fresh=True,
        force=True,
        focus=FOCUS,
    )
    assert result.meta["compacted"] is True and result.meta["strategy"] == "summarize"
    (request,) = client.requests
    assert FOCUS in request.system
    assert "asked for, with a focus" in request.system
    assert "Parser work" in str(result.messages)


def test_without_a_focus_the_summarizer_prompt_has_no_focus_section() -> None:
    client = ScriptedClient([_reply("Summary of the parser work.")])
    compact(
        _messages(),
        window=WINDOW,
        model="gpt-4o",
        opts={"strategy": "summarize", "summarizer": "model"},
        client=client,
        fresh=True,
        force=True,
    )
    (request,) = client.requests
    assert "with a focus" not in request.system


def test_noop_declines_and_says_why() -> None:
    result = compact(_messages(), compactor="noop", fresh=True, force=True)
    assert result.meta["compacted"] is False
    assert result.meta["declined"] == "compactor 'noop' never compacts"


def test_window_manager_declines_when_nothing_may_be_dropped() -> None:
    # the task and the newest exchange are all there is: every entry is kept by a rule
    result = compact(_messages(1), window=WINDOW, model="gpt-4o", fresh=True, force=True)
    assert result.meta["compacted"] is False
    assert "nothing to compact" in result.meta["declined"]


def test_clear_tool_results_clears_on_request_and_declines_with_a_reason() -> None:
    memory = AgentMemory()
    memory.add_message("user", "Read the files.", turn_id="t0")
    for i in range(4):
        memory.add_message(
            "assistant",
            [{"type": "tool_use", "id": f"u{i}", "name": "read", "input": {"path": f"f{i}"}}],
            turn_id="t0",
        )
        memory.add_message(
            "user",
            [{"type": "tool_result", "tool_use_id": f"u{i}", "content": f"line {i}\n" * 300}],
            turn_id="t0",
        )
    memory.add_message("assistant", "Done.", turn_id="t0")
    acc = AgentConfig(
        model="gpt-4o",
        compactor="clear_tool_results",
        compactor_opts={"trigger_tokens": 1_000_000, "keep": 1},
        memory=memory,
    )
    assert not run_compaction(acc, mid_round=False).meta.compacted
    forced = run_compaction(acc, mid_round=False, force=True)
    assert forced.meta.compacted and forced.meta["trigger"] == "forced"
    assert forced.meta["cleared"] == ["u0", "u1", "u2"]
    again = run_compaction(forced.acc, mid_round=False, force=True)
    assert not again.meta.compacted
    assert "nothing worth clearing" in again.meta["declined"]


def test_a_pipeline_forces_its_steps_and_gives_their_reasons() -> None:
    acc = AgentConfig(
        model="gpt-4o",
        compactor="pipeline",
        compactor_opts={
            "steps": [
                {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 1_000_000}},
                {"compactor": "window_manager", "opts": {"context_window": WINDOW}},
            ]
        },
        memory=_memory(),
    )
    assert not run_compaction(acc, mid_round=False).meta.compacted
    forced = run_compaction(acc, mid_round=False, force=True)
    assert forced.meta.compacted
    assert [step["compactor"] for step in forced.meta["steps"]] == [
        "clear_tool_results",
        "window_manager",
    ]
    declined = run_compaction(acc.with_memory(_memory(1)), mid_round=False, force=True)
    assert "no step compacted" in declined.meta["declined"]
    assert "step 0 (clear_tool_results) nothing worth clearing" in declined.meta["declined"]
    assert "step 1 (window_manager) nothing to compact" in declined.meta["declined"]


class _Unaware:
    """A third-party compactor written before ``ctx.force``: it skips under its level."""

    @hookimpl
    def needs_window(self, opts: Any) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
        return acc, {"compacted": False}


def test_a_compactor_that_ignores_force_keeps_working_and_the_boundary_says_why() -> None:
    register_compactor("unaware_test", _Unaware())
    try:
        acc = AgentConfig(compactor="unaware_test", memory=_memory())
        scheduled = run_compaction(acc, mid_round=False)
        forced = run_compaction(acc, mid_round=False, force=True)
    finally:
        unregister_compactor("unaware_test")
    assert dict(scheduled.meta) == {"compacted": False}
    assert forced.meta.compacted is False
    assert forced.meta.declined is not None
    assert "'unaware_test'" in forced.meta.declined and "ctx.force" in forced.meta.declined


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"focus": "the parser"}, "focus is read only by a compaction on request"),
        ({"force": True, "focus": "  "}, "focus must be a non-empty string"),
        ({"force": True, "focus": 3}, "focus must be a non-empty string, got 3"),
    ],
)
def test_bad_focus_is_refused_naming_the_option(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        compact(_messages(), window=WINDOW, model="gpt-4o", fresh=True, **kwargs)
    assert str(info.value).startswith("normandy_core.compact(): ")
    with pytest.raises(ValueError, match=message):
        run_compaction(AgentConfig(memory=_memory()), mid_round=False, **kwargs)


def test_window_manager_declines_a_compaction_that_would_not_be_smaller() -> None:
    # the extractive digest of a few short messages is longer than what it replaces
    result = compact(
        _messages(),
        window=WINDOW,
        model="gpt-4o",
        opts={"strategy": "summarize", "summarizer": "extractive"},
        fresh=True,
        force=True,
    )
    assert result.meta["compacted"] is False
    assert "would not be smaller" in result.meta["declined"]
    assert result.messages == _messages()


def test_a_call_that_continues_an_earlier_one_compacts_on_request() -> None:
    first = compact(_messages(), window=WINDOW, model="gpt-4o", fresh=False)
    assert first.meta == {"compacted": False}
    grown = [*first.messages, {"role": "user", "content": "Now the tests."}]
    forced = compact(grown, window=WINDOW, model="gpt-4o", force=True)
    assert forced.continued and forced.meta["compacted"] is True
    assert forced.messages[-1] == grown[-1] and len(forced.messages) < len(grown)

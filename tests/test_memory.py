"""The conversation model's examples and refusals (the properties are in test_memory_properties)."""

from __future__ import annotations

import pytest

from normandy_core import AgentMemory, Entry, TextBlock, ToolResultBlock, ToolUseBlock


def _three() -> AgentMemory:
    memory = AgentMemory()
    for i in range(3):
        memory.add_message("user", f"m{i}", id=f"m{i}", turn_id="t1")
    return memory


def test_branches_share_a_parent_and_the_active_branch_runs_head_to_root():
    memory = _three()
    fork = memory.fork("m0")
    fork.add_message("assistant", "other answer", id="b1")
    assert [e.id for e in fork] == ["m0", "b1"]
    assert [e.id for e in memory] == ["m0", "m1", "m2"]  # the original is unchanged
    assert fork["b1"].parent_id == "m0" == fork["m1"].parent_id
    assert "m2" in fork
    assert [e.id for e in fork.fork("m2")] == ["m0", "m1", "m2"]
    assert list(memory.fork(None)) == []
    with pytest.raises(KeyError, match="nope"):
        memory.fork("nope")


def test_add_message_validates_blocks_and_refuses_a_taken_id():
    memory = _three()
    entry = memory.add_message(
        "assistant",
        [{"type": "tool_use", "id": "c1", "name": "read", "input": {"p": "a"}}],
        id="a1",
    )
    assert entry.content == (ToolUseBlock(id="c1", name="read", input={"p": "a"}),)
    result = memory.add_message("user", [ToolResultBlock(tool_use_id="c1", content="A")])
    assert result.tool_results[0].text() == "A"
    assert memory.last() is result
    with pytest.raises(ValueError, match="'m1' is already in this memory"):
        memory.add_message("user", "again", id="m1")
    with pytest.raises(ValueError, match="validation error"):
        memory.add_message("user", [{"type": "video", "url": "x"}])


def test_from_entries_refuses_duplicates_and_relinks():
    a = Entry(id="a", role="user", content="A")
    b = Entry(id="b", parent_id="zzz", role="assistant", content=(TextBlock(text="B"),))
    memory = AgentMemory.from_entries([a, b])
    assert memory["b"].parent_id == "a"
    assert memory["a"] is a
    with pytest.raises(ValueError, match="duplicate entry id 'a'"):
        AgentMemory.from_entries([a, a])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other"}, "not a Normandy memory dump"),
        ({"version": 99}, "unsupported memory dump version 99"),
        ({"head": "ghost"}, "head 'ghost' is not an entry"),
    ],
)
def test_load_refuses_what_is_not_a_dump(change, message):
    data = {**_three().dump(), **change}
    with pytest.raises(ValueError, match=message):
        AgentMemory.load(data)


def test_load_refuses_broken_graphs():
    data = _three().dump()
    dup = {**data, "entries": [*data["entries"], data["entries"][0]]}
    with pytest.raises(ValueError, match="duplicate entry id 'm0'"):
        AgentMemory.load(dup)
    orphan = {**data, "entries": data["entries"][1:]}
    with pytest.raises(ValueError, match="parent 'm0', which is missing"):
        AgentMemory.load(orphan)
    cyclic = {**data, "entries": [{**data["entries"][0], "parent_id": "m2"}, *data["entries"][1:]]}
    with pytest.raises(ValueError, match="form a cycle"):
        AgentMemory.load(cyclic)


def test_newest_first_walks_the_active_branch_backwards_without_a_copy():
    from normandy_core.conversation.structure import open_round_start, thinking_lost

    memory = AgentMemory()
    for i in range(5):
        memory.add_message("user" if i % 2 == 0 else "assistant", f"m{i}", id=f"m{i}")
    assert [e.id for e in memory.newest_first()] == ["m4", "m3", "m2", "m1", "m0"]
    walk = memory.newest_first()
    assert next(walk).id == "m4"  # lazy: only what is read
    # a closed conversation has no open round, so nothing can lose its thinking
    assert open_round_start(memory.entries()) is None
    assert not thinking_lost(memory.newest_first())

"""Properties of the conversation model: persistence, ids, drop_thinking, token caching."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings, strategies as st

from normandy_core import (
    AgentMemory,
    Entry,
    EstimateCounter,
    RedactedThinkingBlock,
    ThinkingBlock,
    TiktokenCounter,
    drop_thinking,
)
from strategies import Add, Fork, apply_step, build, conversations, entries, memories, steps

THINKING = (ThinkingBlock, RedactedThinkingBlock)


def _graph(memory: AgentMemory) -> list[Entry]:
    return memory.all_entries()


# -- persistence ------------------------------------------------------------------------


@given(memories())
def test_dump_load_round_trips_exactly(memory):
    dumped = memory.dump()
    loaded = AgentMemory.load(dumped)
    assert _graph(loaded) == _graph(memory)
    assert loaded.entries() == memory.entries()
    assert loaded.head == memory.head
    assert loaded.dump() == dumped
    # Through real JSON text too, and the dump is plain JSON.
    again = AgentMemory.load(json.loads(json.dumps(dumped)))
    assert again.dump() == dumped


@given(memories())
def test_to_json_from_json_round_trips_exactly(memory):
    text = memory.to_json()
    loaded = AgentMemory.from_json(text)
    assert loaded.to_json() == text
    assert _graph(loaded) == _graph(memory)
    assert [e.id for e in loaded] == [e.id for e in memory]


@given(memories())
def test_a_loaded_memory_keeps_growing_like_the_original(memory):
    loaded = AgentMemory.from_json(memory.to_json())
    a = memory.add_message("user", "next", id="next-id")
    b = loaded.add_message("user", "next", id="next-id")
    assert a == b
    assert loaded.entries() == memory.entries()


# -- ids --------------------------------------------------------------------------------


@given(conversations())
def test_ids_are_stable_across_add_and_fork(script):
    seen: dict[str, Entry] = {}

    def check(memory: AgentMemory) -> None:
        for e in memory.all_entries():
            if e.id in seen:
                assert memory[e.id] is seen[e.id]  # entries are never rewritten
            seen[e.id] = e
        # The active branch is linked head to root by parent ids.
        branch = memory.entries()
        assert [e.parent_id for e in branch] == [None, *[e.id for e in branch]][: len(branch)]
        assert memory.head == (branch[-1].id if branch else None)

    build(script, after_step=check)


@given(memories())
def test_ids_are_stable_across_from_entries_and_drop_thinking(memory):
    active = [e.id for e in memory]
    rebuilt = AgentMemory.from_entries(memory.entries())
    assert [e.id for e in rebuilt] == active
    assert [(e.role, e.content) for e in rebuilt] == [(e.role, e.content) for e in memory]
    stripped = drop_thinking(memory)
    assert [e.id for e in stripped] == active
    assert [e.id for e in stripped.all_entries()] == [e.id for e in memory.all_entries()]
    assert stripped.head == memory.head
    if active:
        # A tail kept by a compactor keeps its ids too.
        tail = memory.derive(memory.entries()[len(active) // 2 :])
        assert [e.id for e in tail] == active[len(active) // 2 :]


@given(st.lists(entries(), max_size=6, unique_by=lambda e: e.id))
def test_from_entries_links_any_entries_in_order(items):
    memory = AgentMemory.from_entries(items)
    assert [e.id for e in memory] == [e.id for e in items]
    assert [e.content for e in memory] == [e.content for e in items]
    assert memory.entries()[0].parent_id is None if items else memory.head is None


@given(st.lists(entries(), min_size=1, max_size=6, unique_by=lambda e: e.id))
def test_add_message_makes_the_entry_validation_would(items):
    # typed content takes the unvalidated copy: the same entry, the same fields set, as
    # validating the same fields (and as model_construct, which it replaces)
    memory = AgentMemory()
    for e in items:
        added = memory.add_message(
            e.role, e.content, id=e.id, turn_id=e.turn_id, pinned=e.pinned, metadata=e.metadata
        )
        fields = {**e.model_dump(), "parent_id": added.parent_id}
        fields["content"] = e.content
        validated = Entry(**fields)
        assert added == validated == Entry.model_construct(**fields)
        assert added.model_fields_set == validated.model_fields_set
        assert added.model_dump(exclude_unset=True) == validated.model_dump(exclude_unset=True)
        assert added.content is e.content or isinstance(e.content, str)
        assert added.metadata == e.metadata and added.metadata is not e.metadata
        assert type(added) is Entry and added.model_extra is None


# -- drop_thinking ----------------------------------------------------------------------


@given(memories())
def test_drop_thinking_removes_every_thinking_block_and_nothing_else(memory):
    before = memory.dump()
    stripped = drop_thinking(memory)
    assert memory.dump() == before  # the input is never modified
    old, new = memory.all_entries(), stripped.all_entries()
    assert len(old) == len(new)
    for o, n in zip(old, new, strict=True):
        assert (n.id, n.parent_id, n.turn_id, n.role, n.pinned, n.metadata) == (
            o.id,
            o.parent_id,
            o.turn_id,
            o.role,
            o.pinned,
            o.metadata,
        )
        if isinstance(o.content, str):
            assert n.content == o.content
        else:
            assert n.content == tuple(b for b in o.content if not isinstance(b, THINKING))
        assert not n.has_thinking
        if not o.has_thinking:
            assert n is o
    again = drop_thinking(stripped)  # nothing left to drop: an equal, independent memory
    assert again is not stripped
    assert again.dump() == stripped.dump()
    # The stripped memory is independent: growing it leaves the input alone.
    stripped.add_message("user", "after")
    assert memory.dump() == before


def test_drop_thinking_keeps_tool_blocks_and_signatureless_text():
    from normandy_core import TextBlock, ToolUseBlock

    memory = AgentMemory()
    use = ToolUseBlock(id="c1", name="read", input={"p": 1})
    memory.add_message(
        "assistant",
        (
            ThinkingBlock(thinking="hmm", signature="sig"),
            RedactedThinkingBlock(data="opaque"),
            TextBlock(text="reading"),
            use,
        ),
        id="a",
    )
    stripped = drop_thinking(memory)
    assert stripped["a"].content == (TextBlock(text="reading"), use)
    assert memory["a"].has_thinking


# -- tokens -----------------------------------------------------------------------------


class CallCounting:
    """A real counter, wrapped to record every entry it is asked to count."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = f"counting:{inner.name}"
        self.calls: list[tuple[str, Any, str]] = []

    def count_text(self, text: str) -> int:
        return int(self.inner.count_text(text))

    def count_entry(self, entry: Entry) -> int:
        self.calls.append((entry.id, entry.content, entry.role))
        return int(self.inner.count_entry(entry))

    def assert_never_twice(self) -> None:
        seen: list[tuple[str, Any, str]] = []
        for call in self.calls:
            assert call not in seen, f"entry {call[0]!r} was counted twice"
            seen.append(call)


COUNTERS = {"estimate": EstimateCounter(), "tiktoken": TiktokenCounter("cl100k_base")}


@given(conversations(), st.sampled_from(sorted(COUNTERS)), st.data())
def test_incremental_totals_equal_a_recount_after_appends_and_forks(script, which, data):
    counter = COUNTERS[which]
    memory = AgentMemory()
    for step in script:
        memory = apply_step(memory, step)
        if data.draw(st.booleans(), label="count now"):
            assert memory.tokens(counter) == sum(counter.count_entry(e) for e in memory)
    assert memory.tokens(counter) == sum(counter.count_entry(e) for e in memory)
    assert memory.tokens(counter) == memory.tokens(counter)


ACTIONS = ("add", "fork", "copy", "derive", "drop_thinking", "tokens", "entry_tokens")


@settings(max_examples=40)
@given(conversations(max_steps=8), st.data())
def test_a_cached_count_is_never_computed_twice(script, data):
    counter = CallCounting(EstimateCounter())
    family = [build(script)]
    for _ in range(data.draw(st.integers(min_value=1, max_value=12), label="actions")):
        action = data.draw(st.sampled_from(ACTIONS), label="action")
        memory = data.draw(st.sampled_from(family), label="memory")
        if action == "add":
            apply_step(memory, data.draw(steps(), label="step")[0])
        elif action == "fork":
            family.append(apply_step(memory, Fork(data.draw(st.floats(0, 1), label="at"))))
        elif action == "copy":
            family.append(memory.copy())
        elif action == "derive":
            # A compactor counts what it keeps before it derives; derive carries those
            # counts over (and only those: the new memory's cache is pruned to it).
            kept = memory.entries()[data.draw(st.integers(0, len(memory))) :]
            for e in kept:
                memory.entry_tokens(e, counter)
            family.append(memory.derive(kept))
        elif action == "drop_thinking":
            family.append(drop_thinking(memory))
        elif action == "tokens":
            memory.tokens(counter)
        else:
            for e in memory:
                memory.entry_tokens(e, counter)
    for memory in family:
        memory.tokens(counter)
        assert memory.tokens(counter) == sum(counter.inner.count_entry(e) for e in memory)
    counter.assert_never_twice()


def test_derive_carries_over_only_the_kept_entries_counts():
    counter = CallCounting(EstimateCounter())
    memory = build([Add("user", f"message {i}") for i in range(50)])
    memory.tokens(counter)
    kept = memory.entries()[40:]
    derived = memory.derive(kept)
    assert derived.tokens(counter) == sum(counter.inner.count_entry(e) for e in kept)
    assert len(counter.calls) == 50  # nothing recounted
    assert set(derived._counts[counter.name]) == {e.id for e in kept}


def test_tokens_count_only_what_was_added():
    counter = CallCounting(EstimateCounter())
    memory = build([Add("user", f"message {i}") for i in range(100)])
    memory.tokens(counter)
    assert len(counter.calls) == 100
    memory.add_message("assistant", "one more")
    memory.tokens(counter)
    assert len(counter.calls) == 101
    memory.fork(memory.head).tokens(counter)
    memory.copy().tokens(counter)
    assert len(counter.calls) == 101

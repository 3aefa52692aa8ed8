"""Entries that cannot change under anyone (issue 32, case 1).

An entry's ``metadata`` and the JSON objects of its blocks are read-only, deep down; an
entry changed in place all the same (``object.__setattr__``) is put back and refused by
the contract's one check, naming the compactor and the entry; a kept entry whose content
or metadata differs by value from the original is refused like a silent loss. Each
scenario is the issue's, and each failed on the code before (the mutations went through
and the compaction was accepted).
"""

from __future__ import annotations

import copy
import json
import pickle
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, strategies as st
from reliability_counts import (
    ABANDONED_MUTATION_SECONDS,
    IN_PLACE_CHANGES,
    MUTATING_HOOK_ENTRIES,
)

from normandy_core import (
    AgentConfig,
    AgentMemory,
    Entry,
    ImageBlock,
    OpaqueBlock,
    ToolUseBlock,
    hookimpl,
    new_id,
    register_compactor,
    register_hook,
    run_compaction,
)
from normandy_core.conversation.entries import FrozenDict, FrozenList, freeze

KEPT_FROM = 4


def _no_window(opts: Any) -> bool:
    return False


def _memory(n: int = 12, tag: str = "") -> AgentMemory:
    mem = AgentMemory()
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"message {i} {tag}" + "x" * 40
        mem.add_message(role, text, metadata={"n": i, "tags": ["a"]})
    return mem


def _acc(fn: Any, n: int = 12, tag: str = "", **kw: Any) -> AgentConfig:
    """A config of compactor ``probe``, whose ``maybe_compact`` is ``fn``."""
    plugin = SimpleNamespace(maybe_compact=hookimpl(fn), needs_window=hookimpl(_no_window))
    register_compactor("probe", plugin, replace=True)
    kw.setdefault("survival", {"keep_first_user": False})
    return AgentConfig(model="gpt-4o", compactor="probe", **kw).with_memory(_memory(n, tag))


def _cut(
    acc: AgentConfig, kept: list[Entry] | None = None, at: int = KEPT_FROM
) -> tuple[AgentConfig, dict[str, Any]]:
    """The issue's compaction: ``derive(es[4:])`` with ``dropped=es[:4]``."""
    es = acc.memory.entries()
    new = acc.memory.derive(kept if kept is not None else es[at:])
    return acc.with_memory(new), {"compacted": True, "dropped": es[:at]}


def _as_it_was(mem: AgentMemory) -> list[tuple[str, object, dict[str, Any]]]:
    return [(e.id, e.content, json.loads(json.dumps(dict(e.metadata)))) for e in mem]


# -- read-only, deep down ------------------------------------------------------------


def test_metadata_and_block_objects_are_read_only_deep_down():
    e = Entry(id="e", role="user", content="hi", metadata={"a": {"b": [1, {"c": 2}]}})
    attempts = [
        lambda: e.metadata.__setitem__("k", "x"),
        lambda: e.metadata.update(k="x"),
        lambda: e.metadata.pop("a"),
        lambda: e.metadata.setdefault("k", 1),
        lambda: e.metadata.clear(),
        lambda: e.metadata["a"].__setitem__("b", 0),
        lambda: e.metadata["a"]["b"].append(3),
        lambda: e.metadata["a"]["b"].__setitem__(0, 9),
        lambda: e.metadata["a"]["b"][1].__setitem__("c", 3),
    ]
    for attempt in attempts:
        with pytest.raises(TypeError, match="read-only"):
            attempt()
    assert e.metadata == {"a": {"b": [1, {"c": 2}]}}
    use = ToolUseBlock(id="t", name="f", input={"path": "a", "opts": {"n": [1]}})
    with pytest.raises(TypeError, match="read-only"):
        use.input["path"] = "b"  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        use.input["opts"]["n"].append(2)
    image = ImageBlock(source={"type": "url", "url": "u"})
    opaque = OpaqueBlock(format="openai", kind="k", data={"x": [1]})
    for read_only in (image.source, opaque.data, opaque.data["x"]):
        assert isinstance(read_only, (FrozenDict, FrozenList))
    # every way of making an entry gives read-only metadata
    mem = AgentMemory()
    appended = mem.add_message("user", "x", metadata={"k": ["v"]})
    copied = appended.model_copy(update={"metadata": {"k2": {"v": []}}})
    built = Entry.model_construct(id="c", role="user", content="x", metadata={"k": [1]})
    for entry in (appended, copied, built):
        assert isinstance(entry.metadata, FrozenDict)
        assert all(isinstance(v, (FrozenDict, FrozenList)) for v in entry.metadata.values())


def test_read_only_entries_round_trip_every_way():
    mem = AgentMemory()
    mem.add_message("user", "x", metadata={"k": ["v", {"w": 1}], "name": "n"})
    mem.add_message(
        "assistant", (ToolUseBlock(id="t", name="f", input={"a": [1, 2]}),), metadata={}
    )
    back = AgentMemory.from_json(mem.to_json())
    assert back.entries() == mem.entries()
    assert isinstance(back.last().content[0].input["a"], FrozenList)  # type: ignore[union-attr]
    for e in mem:
        assert Entry.model_validate_json(e.model_dump_json()) == e
        assert pickle.loads(pickle.dumps(e)) == e
        assert copy.deepcopy(e) == e
        assert e.model_copy(deep=True) == e
        assert json.loads(json.dumps(e.model_dump())) == e.model_dump(mode="json")
    plain = dict(mem.entries()[0].metadata)
    plain["k2"] = 1  # a copy is the caller's own, mutable dict
    assert "k2" not in mem.entries()[0].metadata


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=12,
    )
)
def test_freezing_keeps_the_value_and_leaves_nothing_mutable(value):
    frozen = freeze(value)
    assert frozen == value
    assert json.loads(json.dumps(frozen)) == json.loads(json.dumps(value))
    assert freeze(frozen) is frozen

    def mutable(v: object) -> bool:
        if isinstance(v, dict):
            return type(v) is not FrozenDict or any(mutable(x) for x in v.values())
        if isinstance(v, list):
            return type(v) is not FrozenList or any(mutable(x) for x in v)
        return False

    assert not mutable(frozen)


# -- the issue's compactors ----------------------------------------------------------


def test_a_compactor_changing_kept_metadata_in_place_changes_nothing():
    """The issue: ``e.metadata["k"] = "x"`` on the kept entries, then the cut."""

    def marks_kept(acc, ctx, opts):
        for e in acc.memory.entries()[KEPT_FROM:]:
            e.metadata["k"] = "x"
        return _cut(acc)

    acc = _acc(marks_kept)
    before = _as_it_was(acc.memory)
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc and not meta.compacted
    assert "compactor 'probe'" in meta.error and "read-only" in meta.error
    assert _as_it_was(acc.memory) == before


def test_a_kept_entry_rewritten_by_value_is_refused_naming_compactor_and_entry():
    """A new object with changed metadata (or content) that is not reported is refused."""
    for field, value in (("metadata", {"n": 99}), ("content", "forged")):

        def rewrites(acc, ctx, opts, field=field, value=value):
            es = acc.memory.entries()
            kept = es[KEPT_FROM:]
            kept[2] = kept[2].model_copy(update={field: value})
            return _cut(acc, kept)

        acc = _acc(rewrites)
        before = _as_it_was(acc.memory)
        target = acc.memory.entries()[KEPT_FROM + 2].id
        out, meta = run_compaction(acc, mid_round=False)
        assert out is acc and not meta.compacted, field
        assert "compactor 'probe'" in meta.error and target in meta.error, meta.error
        assert _as_it_was(acc.memory) == before


@pytest.mark.parametrize("where", ["kept", "dropped"])
@pytest.mark.parametrize("field", ["content", "metadata", "pinned", "role"])
def test_object_setattr_is_refused_naming_the_entry_and_undone(field, where):
    """``object.__setattr__(e, "content", ...)`` (the issue), and the other fields, on a
    kept or a dropped entry: refused by the check, the caller's entry put back."""
    forged = {"content": "forged", "metadata": {"k": "x"}, "pinned": True, "role": "system"}

    def forges(acc, ctx, opts):
        es = acc.memory.entries()
        target = es[KEPT_FROM + 1] if where == "kept" else es[1]
        object.__setattr__(target, field, forged[field])
        return _cut(acc)

    acc = _acc(forges)
    before = _as_it_was(acc.memory)
    roles_and_pins = [(e.role, e.pinned) for e in acc.memory]
    target = acc.memory.entries()[KEPT_FROM + 1 if where == "kept" else 1].id
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc and not meta.compacted
    assert "compactor 'probe'" in meta.error and target in meta.error, meta.error
    assert "in place" in meta.error
    assert _as_it_was(acc.memory) == before
    assert [(e.role, e.pinned) for e in acc.memory] == roles_and_pins


def test_in_place_changes_are_refused_every_time():
    """Each way of changing an entry in place, on a kept and a dropped entry, under a
    bounded and an unbounded boundary: refused every time, the memory as it was."""
    ways = [
        lambda e: e.metadata.__setitem__("k", "x"),
        lambda e: e.metadata["tags"].append("b"),
        lambda e: object.__setattr__(e, "metadata", {"n": -1, "tags": ["a"]}),
        lambda e: object.__setattr__(e, "content", e.content + "!"),
        lambda e: object.__setattr__(e, "turn_id", "forged"),
    ]
    refused = 0
    for n in range(IN_PLACE_CHANGES):
        way = ways[n % len(ways)]
        index = (KEPT_FROM + 2) if n % 2 else 2

        def changes(acc, ctx, opts, way=way, index=index):
            way(acc.memory.entries()[index])
            return _cut(acc)

        timeout = 5.0 if (n // len(ways)) % 2 else None
        acc = _acc(changes, compaction_timeout=timeout)
        before = _as_it_was(acc.memory)
        turns = [e.turn_id for e in acc.memory]
        _, meta = run_compaction(acc, mid_round=n % 3 == 0)
        assert not meta.compacted and meta.error, (n, meta)
        assert _as_it_was(acc.memory) == before and [e.turn_id for e in acc.memory] == turns
        refused += 1
    assert refused == IN_PLACE_CHANGES


def test_dropped_entries_with_changed_metadata_are_refused():
    """``dropped`` holding the entries with their metadata changed (in place, as the
    issue's compactor would on ``es[:4]``, or as new objects) is refused."""

    def in_place(acc, ctx, opts):
        for e in acc.memory.entries()[:KEPT_FROM]:
            e.metadata["k"] = "x"
        return _cut(acc)

    def copies(acc, ctx, opts):
        es = acc.memory.entries()
        new = acc.memory.derive(es[KEPT_FROM:])
        changed = [e.model_copy(update={"metadata": {"k": "x"}}) for e in es[:KEPT_FROM]]
        return acc.with_memory(new), {"compacted": True, "dropped": changed}

    for fn in (in_place, copies):
        acc = _acc(fn)
        before = _as_it_was(acc.memory)
        out, meta = run_compaction(acc, mid_round=False)
        assert out is acc and not meta.compacted and "compactor 'probe'" in meta.error
        assert _as_it_was(acc.memory) == before


# -- hooks and abandoned compactors ---------------------------------------------------


def test_a_before_commit_hook_cannot_change_what_later_hooks_and_the_archive_record():
    """The issue: a ``before_commit`` hook changing the dropped entries' metadata; the
    hook after it and the archive (installed for real, SQLite) record the originals."""
    from normandy_archive import Archive
    from normandy_archive.settings import current_settings

    changed: list[str] = []
    recorded: dict[str, dict[str, Any]] = {}

    class Mutator:
        @hookimpl
        def before_commit(self, acc, ctx, meta):
            for e in meta["dropped"]:
                try:
                    e.metadata["k"] = "x"
                    changed.append(e.id)
                except TypeError:
                    pass  # a hook that goes on regardless: the others must see the original

    class Recorder:
        @hookimpl
        def before_commit(self, acc, ctx, meta):
            recorded.update(
                {e.id: json.loads(json.dumps(dict(e.metadata))) for e in meta["dropped"]}
            )

    register_hook(Recorder(), name="recorder")
    register_hook(Mutator(), name="mutator")  # registered last: runs first

    def drop(acc, ctx, opts):
        return _cut(acc, at=MUTATING_HOOK_ENTRIES)

    # content of its own: the archive stores a content once, under the first id it had
    tag = new_id()
    acc = _acc(drop, n=MUTATING_HOOK_ENTRIES + 6, tag=tag, session_id=tag)
    originals = {e.id: json.loads(json.dumps(dict(e.metadata))) for e in acc.memory}
    dropped_ids = [e.id for e in acc.memory.entries()[:MUTATING_HOOK_ENTRIES]]
    _, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted and not meta.get("hook_errors"), meta
    assert changed == []
    assert recorded == {i: originals[i] for i in dropped_ids}
    archive = Archive(current_settings().path)
    try:
        for entry_id in dropped_ids:
            archived = archive.recall(entry_id, tag)
            assert archived is not None and dict(archived.metadata) == originals[entry_id]
    finally:
        archive.close()


def test_an_abandoned_compactor_cannot_change_live_entries():
    """The issue: a compactor abandoned past its timeout went on changing the live
    entries' metadata (1,264 to 3,342 times); now not once."""
    stop = threading.Event()
    changed = [0]
    refused = [0]

    def keeps_changing(acc, ctx, opts):
        while not stop.is_set():
            for e in acc.memory.entries():
                try:
                    e.metadata["k"] = "x"
                    changed[0] += 1
                except TypeError:
                    refused[0] += 1
            time.sleep(0.001)
        return acc, {"compacted": False}

    acc = _acc(keeps_changing, compaction_timeout=0.05)
    before = _as_it_was(acc.memory)
    _, meta = run_compaction(acc, mid_round=True)
    assert meta.error is not None and "compaction_timeout" in meta.error
    time.sleep(ABANDONED_MUTATION_SECONDS)
    stop.set()
    assert changed[0] == 0 and refused[0] > 0
    assert _as_it_was(acc.memory) == before

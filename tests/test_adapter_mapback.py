"""The adapters' shared result type and map-back (``normandy_core.transcripts.adapter``).

A compaction's output is mapped back to the framework's messages: a kept message is
returned as the very object given, in order; a changed one is a new object whose source
is the given message; a created one has no source; every given message not returned is
reported in ``removed`` once, oldest first. Checked with plain objects for both map-back
forms (Chat dicts and memory entries), and the six adapters' public result names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest
from hypothesis import given, strategies as st

from normandy_core.conversation.entries import Entry, TextBlock
from normandy_core.conversation.memory import AgentMemory
from normandy_core.transcripts.adapter import (
    AdapterCompaction,
    Mapped,
    chat_origin,
    map_back,
    map_entries_back,
    removed_from,
)
from normandy_core.transcripts.result import CompactResult

#: What the compactor does with each given message.
FATES = st.sampled_from(["keep", "change", "drop"])
#: A plan: each given message's fate, and whether a created message comes before it.
PLANS = st.lists(st.tuples(FATES, st.booleans()), max_size=12)


@dataclass(eq=False)
class Msg:
    """A framework message: compared by identity, as the adapters compare them."""

    key: str
    text: str


def _result() -> CompactResult:
    return CompactResult([], {"compacted": True}, "openai", AgentMemory.from_entries([]))


def _expect(plan: list[tuple[str, bool]], given_: list[Msg], out: list[Mapped[Msg]]) -> None:
    """``out`` is what ``plan`` says, and its compaction reports each removed message once."""
    shapes = [(fate, m) for (fate, _), m in zip(plan, given_, strict=True)]
    want: list[tuple[str, Msg | None]] = []
    for (fate, note), m in zip(plan, given_, strict=True):
        if note:
            want.append(("created", None))
        if fate != "drop":
            want.append((fate, m))
    assert len(out) == len(want)
    for (message, source), (fate, m) in zip(out, want, strict=True):
        assert source is m
        if fate == "keep":
            assert message is m
        elif fate == "change":
            assert message is not m and message.key == m.key and message.text == "changed"
        else:
            assert message.text == "created"
    messages = [message for message, _ in out]
    kept = [m for m in messages if any(m is g for g in given_)]
    assert kept == [m for (fate, m) in shapes if fate == "keep"]
    done = AdapterCompaction.of(given_, messages, _result())
    assert done.compacted and done.messages is messages
    assert done.removed == [m for (fate, m) in shapes if fate != "keep"]
    assert len({id(m) for m in done.removed}) == len(done.removed)
    assert removed_from(given_, messages) == done.removed


@given(PLANS)
def test_chat_dicts_map_back_kept_as_given_in_order_and_removed_once(plan):
    given_ = [Msg(f"m{i}", "given") for i in range(len(plan))]
    sent = [{"id": m.key, "content": m.text} for m in given_]
    outputs: list[dict[str, str]] = []
    for (fate, note), d in zip(plan, sent, strict=True):
        if note:
            outputs.append({"content": "created"})
        if fate == "keep":
            outputs.append(d)
        elif fate == "change":
            outputs.append({**d, "content": "changed"})
    mapped = map_back(
        outputs,
        chat_origin(given_, sent, {m.key: m for m in given_}),
        lambda source, d: Msg(source.key, d["content"]),
        lambda d: Msg("new", d["content"]),
    )
    _expect(plan, given_, mapped)


@given(PLANS)
def test_entries_map_back_kept_as_given_in_order_and_removed_once(plan):
    given_ = [Msg(f"m{i}", "given") for i in range(len(plan))]
    read = [Entry(id=m.key, role="user", content=(TextBlock(text=m.text),)) for m in given_]
    outputs: list[Entry] = []
    for i, ((fate, note), e) in enumerate(zip(plan, read, strict=True)):
        if note:
            outputs.append(Entry(id=f"n{i}", role="user", content=(TextBlock(text="created"),)))
        if fate == "keep":  # an equal entry, not necessarily the one read
            outputs.append(Entry(id=e.id, role="user", content=e.content))
        elif fate == "change":
            outputs.append(Entry(id=e.id, role="user", content=(TextBlock(text="changed"),)))
    mapped = map_entries_back(
        outputs,
        {e.id: (m, e) for m, e in zip(given_, read, strict=True)},
        lambda source, before, after: Msg(source.key, after.text()),
        lambda e: Msg(e.id, e.text()),
    )
    _expect(plan, given_, mapped)


@pytest.mark.parametrize(
    ("module", "name", "alias"),
    [
        ("normandy_langchain", "LangChainCompaction", None),
        ("normandy_llamaindex", "LlamaIndexCompaction", None),
        ("normandy_pydantic_ai", "PydanticAICompaction", None),
        ("normandy_strands", "StrandsCompaction", None),
        ("normandy_openai_agents", "AgentsCompaction", "items"),
        ("normandy_adk", "ADKCompaction", "contents"),
    ],
)
def test_each_adapter_exports_the_shared_result_under_its_own_name(module, name, alias):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, AdapterCompaction)
    given_ = [Msg("a", "x"), Msg("b", "y")]
    done = cls.of(given_, given_[1:], _result())
    assert type(done) is cls and done.compacted
    assert done.messages == given_[1:] and done.removed == given_[:1]
    if alias is not None:
        assert getattr(done, alias) is done.messages

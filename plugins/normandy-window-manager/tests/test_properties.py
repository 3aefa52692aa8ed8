"""Hypothesis properties of window_manager, selected by name through the core."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from normandy_core import AgentConfig, get_counter, pairing_problems, run_compaction
from normandy_core.testing.strategies import conversations

SPECIAL = ("normandy.summary", "normandy.compaction_marker")


@st.composite
def setups(draw):
    conv = draw(conversations())
    strategy = draw(st.sampled_from(["oldest_first", "sliding_window", "summarize"]))
    trigger = draw(st.sampled_from([1.0, 0.9, 0.8]))
    opts = {
        "strategy": strategy,
        "context_window": draw(st.integers(1_500, 30_000)),
        "reserved_tokens": draw(st.integers(0, 1_000)),
        "trigger": trigger,
        "target": draw(st.sampled_from([0.5, 0.6, trigger])),
        "counter": draw(st.sampled_from(["estimate", "conservative", "cl100k_base"])),
    }
    if strategy == "sliding_window":
        opts["keep_last_turns"] = draw(st.integers(1, 3))
    if strategy == "summarize":
        opts["summary_max_tokens"] = draw(st.sampled_from([64, 200, 400]))
    system = draw(st.sampled_from(["", "You are a careful coding agent." * 5]))
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt=system,
        compactor="window_manager",
        compactor_opts=opts,
    )
    acc = acc.with_memory(conv.memory)
    return acc, conv.ends_mid_round


def _special(e):
    return any(e.metadata.get(k) for k in SPECIAL)


@given(setups())
def test_compaction_invariants(setup):
    acc, mid = setup
    original = acc.memory
    dump_before = original.dump()
    active_before = [e.id for e in original]
    assert pairing_problems(list(original)) == []

    new_acc, meta = run_compaction(acc, mid_round=mid)

    # the input is never mutated
    assert original.dump() == dump_before
    assert acc.memory is original
    assert isinstance(meta["compacted"], bool)
    opts = acc.compactor_opts
    counter = get_counter(opts["counter"])
    usable = opts["context_window"] - opts["reserved_tokens"]

    if not meta["compacted"]:
        assert "dropped" not in meta
        assert new_acc is acc
        if "error" not in meta:
            fits = original.tokens(counter) + acc.prompt_tokens <= opts["trigger"] * usable
            if mid and fits:
                assert new_acc.memory is original
        else:
            assert "irreducible" in meta["error"] or "summarize" in meta["error"]
        return

    kept = list(new_acc.memory)
    dropped = meta["dropped"]
    shortened = set(meta.get("shortened", []))
    # no orphaned tool use or result, no split batch
    assert pairing_problems(kept) == [], pairing_problems(kept)
    # kept plus dropped ids equal the original active branch (summary or marker aside)
    kept_ids = [e.id for e in kept if not _special(e)]
    dropped_ids = [e.id for e in dropped]
    assert set(kept_ids) | set(dropped_ids) == set(active_before)
    assert set(kept_ids) & set(dropped_ids) == shortened
    # order preserved on both sides; dropped oldest first
    pos = {eid: i for i, eid in enumerate(active_before)}
    assert kept_ids == sorted(kept_ids, key=pos.__getitem__)
    assert dropped_ids == sorted(dropped_ids, key=pos.__getitem__)
    # dropped entries carry their original content, thinking included
    for e in dropped:
        assert original[e.id] == e
    # pinned and system entries are kept
    for e in original:
        if e.pinned or e.role == "system":
            assert e.id in kept_ids
    # kept messages carry no thinking after a compaction
    assert not any(e.has_thinking for e in kept)
    # a kept history never starts with a tool result
    first = next((e for e in kept if e.role != "system"), None)
    assert first is None or not first.tool_results
    # fits the target, or at least the usable window when the target cannot be met
    after = new_acc.memory.tokens(counter)
    assert meta["tokens_after"] == after
    if meta["target_met"]:
        assert after + acc.prompt_tokens <= opts["target"] * usable + 1
    else:
        assert after + acc.prompt_tokens <= usable
    # compacting again right after does nothing
    again_acc, again = run_compaction(new_acc, mid_round=mid)
    assert again == {"compacted": False}
    assert again_acc is new_acc

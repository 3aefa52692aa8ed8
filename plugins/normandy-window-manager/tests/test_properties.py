"""Hypothesis properties of window_manager, selected by name through the core."""

from __future__ import annotations

from hypothesis import event, given, strategies as st

from normandy_core import (
    AgentConfig,
    ToolResultBlock,
    get_counter,
    pairing_problems,
    run_compaction,
)
from normandy_core.testing.strategies import conversations
from normandy_window_manager.schedule import MAX_ROUNDS

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


# -- schedule="cost" --------------------------------------------------------------------


@st.composite
def cost_setups(draw):
    conv = draw(conversations())
    strategy = draw(st.sampled_from(["oldest_first", "summarize"]))  # sliding_window: refused
    counter_name = draw(st.sampled_from(["estimate", "conservative", "cl100k_base"]))
    reserved = draw(st.integers(0, 1_000))
    # the window sized against the conversation: the conversation fills from 30 % of the
    # usable window (under the floor or between it and the window) to 130 % (over it)
    size = conv.memory.tokens(get_counter(counter_name)) + 400
    fill = draw(st.sampled_from([0.3, 0.5, 0.7, 0.85, 0.95, 1.1, 1.3]))
    opts = {
        "strategy": strategy,
        "schedule": "cost",
        "context_window": max(int(size / fill), 1_500) + reserved,
        "reserved_tokens": reserved,
        "horizon": draw(st.integers(1, 200)),
        "counter": counter_name,
    }
    if draw(st.booleans()):
        opts["target"] = draw(st.sampled_from([0.2, 0.4, 0.6]))
    if strategy == "summarize":
        opts["summarizer"] = "extractive"
    system = draw(st.sampled_from(["", "You are a careful coding agent." * 5]))
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt=system,
        compactor="window_manager",
        compactor_opts=opts,
    )
    return acc.with_memory(conv.memory), conv.ends_mid_round


def _cleared_only(old, new):
    """Whether ``new`` is ``old`` with some tool results replaced by the cleared text."""
    from normandy_window_manager.schedule import CLEARED_KEY, CLEARED_TEXT

    a, b = old.without_thinking().blocks, new.blocks
    if len(a) != len(b) or not new.metadata.get(CLEARED_KEY):
        return False
    return all(
        x == y or (isinstance(y, ToolResultBlock) and y.content == CLEARED_TEXT)
        for x, y in zip(a, b, strict=True)
    )


@given(cost_setups())
def test_cost_schedule_invariants(setup):
    acc, mid = setup
    original = acc.memory
    dump_before = original.dump()
    active_before = [e.id for e in original]
    opts = acc.compactor_opts
    counter = get_counter(opts["counter"])
    usable = opts["context_window"] - opts["reserved_tokens"]
    # what the boundary sends besides the conversation: the prompt and the request's own
    # tokens (the prepared counter's, as the boundary's context gives them)
    prompt = acc.prompt_tokens + acc.prepared.counter_for(acc.model).request_tokens
    sent_before = original.tokens(counter) + prompt

    new_acc, meta = run_compaction(acc, mid_round=mid)
    event(f"decision: {meta.get('cost_decision', 'not weighed')}, plan {meta.get('cost_plan')}")

    # the input is never mutated
    assert original.dump() == dump_before
    assert acc.memory is original
    if not meta["compacted"]:
        assert new_acc is acc and "dropped" not in meta
        if "error" in meta:
            assert "irreducible" in meta["error"] or "summar" in meta["error"]
        else:
            # never over the window: what is left as it was fits it
            assert sent_before <= usable
            if "cost_decision" in meta:
                assert meta["cost_decision"] == "waits"
        return

    assert meta["cost_decision"] in ("forced", "pays")
    assert meta["cost_decision"] == ("forced" if sent_before > usable else "pays")
    kept = list(new_acc.memory)
    # pairs never split: no orphaned tool use or result, no split batch
    assert pairing_problems(kept) == [], pairing_problems(kept)
    # never over the window
    after = new_acc.memory.tokens(counter)
    assert meta["tokens_after"] == after
    assert after + prompt <= usable
    # nothing dropped unreported: every original entry not kept as it was is in dropped,
    # with its original content; what is kept changed is shortened or cleared only
    dropped = {e.id: e for e in meta["dropped"]}
    by_id = {e.id: e for e in kept}
    for e in original:
        k = by_id.get(e.id)
        if k is None or k.content != e.without_thinking().content:
            assert e.id in dropped, f"{e.id} dropped or rewritten but not reported"
            assert dropped[e.id] == e
        if k is not None and k.content != e.without_thinking().content:
            assert e.id in meta.get("shortened", []) or _cleared_only(e, k)
    assert set(dropped) <= set(active_before)
    # order preserved; system and pinned entries kept
    pos = {eid: i for i, eid in enumerate(active_before)}
    kept_ids = [e.id for e in kept if not _special(e)]
    assert kept_ids == sorted(kept_ids, key=pos.__getitem__)
    for e in original:
        if e.pinned or e.role == "system":
            assert e.id in by_id
    # the meta says what was decided and why
    assert meta["cost_plan"] in meta["cost_plans"]
    assert meta["cost_rate_with"] == min(meta["cost_plans"].values())
    if meta["cost_decision"] == "pays":
        assert meta["cost_rate_with"] < meta["cost_rate_without"]
    # weighed again until it waits: compacting the output again changes nothing
    assert 1 <= meta["cost_rounds"] <= MAX_ROUNDS
    again_acc, again = run_compaction(new_acc, mid_round=mid)
    assert not again["compacted"], {k: v for k, v in again.items() if k != "dropped"}
    assert again_acc is new_acc

"""``schedule="cost"`` weighs the reasoning a mid-round compaction would cost, not only
the cache: waiting at a turn start is charged the calls the coming round would then make
with thinking disabled."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given, settings, strategies as st

from normandy_core import (
    AgentConfig,
    AgentMemory,
    OptionsError,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    build_context,
    get_counter,
    run_compaction,
)
from normandy_core.conversation.cost import growth_per_call
from normandy_core.testing.strategies import conversations
from normandy_window_manager.options import WindowManagerOptions
from normandy_window_manager.reasoning import THINKING_KEY, RoundRisk, thinking_per_call
from normandy_window_manager.rounds import ROUNDS_KEY, estimate_round

NEW = "t-new"  # the turn a turn start opens
REASONING_KEYS = {
    "round_estimate",
    "reasoning_per_call",
    "disabled_calls_without",
    "disabled_calls_with",
    "cost_reasoning_without",
    "cost_reasoning_with",
}
WORDS = ["parser", "token", "stream", "buffer", "offset", "cursor", "grammar", "lexer"]


def _text(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed + i * 3) % len(WORDS)] + str(i % 97) for i in range(n))


def _session(turns: int, calls: int, result_words: int, thinking_words: int) -> AgentMemory:
    """``turns`` complete turns of ``calls`` tool calls each, every call thinking first,
    then the request of a new turn: a turn start."""
    memory = AgentMemory()
    tool = 0
    for t in range(turns):
        turn = f"t{t}"
        memory.add_message("user", f"Task {t}: fix the parser's module {t}.", turn_id=turn)
        for c in range(calls):
            tool += 1
            thinking = ThinkingBlock(thinking=_text(thinking_words, tool), signature=f"s{tool}")
            use = ToolUseBlock(id=f"toolu_{tool}", name="read", input={"path": f"m{c}.py"})
            memory.add_message("assistant", (thinking, use), turn_id=turn)
            result = ToolResultBlock(tool_use_id=f"toolu_{tool}", content=_text(result_words, c))
            memory.add_message("user", (result,), turn_id=turn)
        memory.add_message("assistant", (TextBlock(text=f"Module {t} fixed."),), turn_id=turn)
    memory.add_message("user", "Now the tests.", turn_id=NEW)
    return memory


def _agent(memory: AgentMemory, fill: float, **opts: Any) -> AgentConfig:
    """A ``schedule="cost"`` agent whose conversation fills ``fill`` of the usable window."""
    size = memory.tokens(get_counter("cl100k_base"))
    options = {
        "schedule": "cost",
        "counter": "cl100k_base",
        "reserved_tokens": 500,
        "context_window": int(size / fill) + 500,
        **opts,
    }
    acc = AgentConfig(model="claude-sonnet-4-5", compactor="window_manager", compactor_opts=options)
    return acc.with_memory(memory)


def test_reasoning_makes_a_turn_start_compact_where_the_cache_alone_waits() -> None:
    """The conversation at 0.7 of the usable window, its rounds about 0.35: the coming round
    would overflow mid-round. Weighed on the cache alone the turn start waits (the next
    call mostly reads the cache); charged the reasoning of the calls after the overflow, it
    compacts now, and the plan leaves the round room to run with thinking."""
    memory = _session(turns=2, calls=5, result_words=220, thinking_words=120)

    cache_acc, cache_only = run_compaction(
        _agent(memory, 0.7, thinking_value=0.0), mid_round=False, turn_id=NEW
    )
    acc, meta = run_compaction(_agent(memory, 0.7), mid_round=False, turn_id=NEW)

    assert cache_only["compacted"] is False
    assert cache_only["cost_decision"] == "waits"
    assert REASONING_KEYS.isdisjoint(cache_only)
    assert meta["compacted"] is True
    assert meta["cost_decision"] == "pays"
    assert meta["disabled_calls_without"] >= 1
    assert meta["disabled_calls_with"] == 0
    assert meta["cost_reasoning_with"] == 0
    # the cache side alone would have waited: the reasoning tipped it
    assert meta["cost_rate_without"] <= meta["cost_rate_with"]
    assert (
        meta["cost_rate_without"] + meta["cost_reasoning_without"]
        > meta["cost_rate_with"] + meta["cost_reasoning_with"]
    )
    assert len(acc.memory) < len(memory)
    assert cache_acc.memory is memory
    # the marker the cut leaves carries what the cut took: the rounds and the thinking
    marker = next(e for e in acc.memory.entries() if e.metadata.get(THINKING_KEY))
    assert marker.metadata[THINKING_KEY] == meta["reasoning_per_call"] // 5
    assert [turn for turn, _ in marker.metadata[ROUNDS_KEY]] == ["t0", "t1"]
    ctx = build_context(acc, mid_round=False, turn_id="t-later")
    assert thinking_per_call(acc.memory, ctx) == marker.metadata[THINKING_KEY]


def test_no_thinking_or_no_turn_loop_weighs_the_cache_alone() -> None:
    """A conversation that carries no thinking loses none; ``compact()`` (no turn id) runs
    no round: both weigh as the cache alone does."""
    memory = _session(turns=2, calls=5, result_words=220, thinking_words=120)
    plain = AgentMemory()
    for e in memory.entries():
        plain.add_message(e.role, e.without_thinking().content, turn_id=e.turn_id)

    _, no_thinking = run_compaction(_agent(plain, 0.7), mid_round=False, turn_id=NEW)
    _, outside = run_compaction(_agent(memory, 0.7), mid_round=False)

    for meta in (no_thinking, outside):
        assert meta["cost_decision"] == "waits"
        assert REASONING_KEYS.isdisjoint(meta)


def test_the_round_risk_counts_the_calls_after_the_overflow() -> None:
    risk = RoundRisk(estimate=3_000, growth=500.0, usable=10_000, per_call=1_000.0)
    assert risk.disabled_calls(7_000) == 0  # the round fits exactly
    assert risk.disabled_calls(7_001) == 1
    assert risk.disabled_calls(8_000) == 2
    assert risk.price(8_000) == 2_000.0
    assert RoundRisk(3_000, 0.0, 10_000, 1_000.0).disabled_calls(9_000) == 0


def test_thinking_per_call_is_the_mean_of_the_thinking_calls() -> None:
    memory = _session(turns=1, calls=3, result_words=10, thinking_words=40)
    acc = _agent(memory, 0.5)
    ctx = build_context(acc, mid_round=False, turn_id=NEW)
    texts = [
        b.thinking
        for e in memory.entries()
        if e.role == "assistant"
        for b in e.blocks
        if isinstance(b, ThinkingBlock)
    ]
    expected = sum(ctx.counter.count_text(t) for t in texts) / len(texts)
    assert thinking_per_call(memory, ctx) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"thinking_value": 2.0}, "thinking_value applies only to schedule 'cost'"),
        ({"schedule": "cost", "thinking_value": -1.0}, "greater than or equal"),
    ],
)
def test_thinking_value_is_validated(opts: dict[str, Any], match: str) -> None:
    with pytest.raises(OptionsError, match=match):
        AgentConfig(model="claude-sonnet-4-5", compactor="window_manager", compactor_opts=opts)


@st.composite
def turn_starts(draw: st.DrawFn) -> AgentConfig:
    """A conversation at a turn start of a turn loop, sized around a cost-schedule window."""
    conv = draw(conversations(mid_round=False, max_turns=6))
    memory = conv.memory.copy()
    memory.add_message("user", "Go on.", turn_id=NEW)
    fill = draw(st.sampled_from([0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97, 1.1]))
    opts: dict[str, Any] = {"horizon": draw(st.integers(1, 200))}
    if draw(st.booleans()):
        opts["target"] = draw(st.sampled_from([0.2, 0.4, 0.6]))
    if draw(st.booleans()):
        opts["thinking_value"] = draw(st.sampled_from([0.5, 5.0, 50.0]))
    return _agent(memory, fill, **opts)


@settings(max_examples=150, deadline=None)
@given(turn_starts())
def test_the_reasoning_only_ever_adds_reasons_to_compact(acc: AgentConfig) -> None:
    """Charging the reasoning never makes a turn start wait where the cache alone would
    compact; it changes the decision only when waiting would disable thinking, and then
    to a plan that disables less of it. With ``thinking_value`` 0 the reasoning is not
    weighed (no reasoning keys), and where waiting disables nothing the decision and the
    first weighing are the cache's exactly."""
    cache = acc.with_compactor("window_manager", {**acc.compactor_opts, "thinking_value": 0.0})
    c_acc, c_meta = run_compaction(cache, mid_round=False, turn_id=NEW)
    r_acc, r_meta = run_compaction(acc, mid_round=False, turn_id=NEW)
    event(f"cache {c_meta.get('cost_decision')}, reasoning {r_meta.get('cost_decision')}")

    assert REASONING_KEYS.isdisjoint(c_meta)
    if c_meta["compacted"]:
        assert r_meta["compacted"]
    if not r_meta.get("disabled_calls_without"):
        # nothing at stake: the reasoning weighs nothing, the first weighing is the cache's
        first = [k for k in c_meta if k.startswith("cost_") and k != "cost_rounds"]
        assert {k: r_meta.get(k) for k in first} == {k: c_meta[k] for k in first}
        if not c_meta["compacted"]:
            assert r_acc is acc and c_acc is cache
    elif r_meta["compacted"] and not c_meta["compacted"]:
        assert r_meta["disabled_calls_with"] < r_meta["disabled_calls_without"]


@settings(max_examples=60, deadline=None)
@given(turn_starts())
def test_the_reported_risk_is_the_rounds_estimate(acc: AgentConfig) -> None:
    """The meta's round estimate is ``round_aware``'s, and the calls it counts are those
    after the conversation plus that estimate passes the usable window."""
    opts = WindowManagerOptions(**acc.compactor_opts)
    ctx = build_context(acc, mid_round=False, turn_id=NEW)
    usable = ctx.window - opts.reserved_tokens
    sent = ctx.counter.memory_tokens(acc.memory) + ctx.prompt_tokens
    _, meta = run_compaction(acc, mid_round=False, turn_id=NEW)
    if "round_estimate" not in meta:
        return
    estimate = estimate_round(acc.memory, ctx, opts, usable).tokens
    entries = acc.memory.entries()
    growth = growth_per_call(entries, [ctx.counter.entry_tokens(acc.memory, e) for e in entries])
    assert meta["round_estimate"] == estimate
    assert (meta["disabled_calls_without"] > 0) == (sent + estimate > usable and growth > 0)

"""Cost-aware scheduling (issue 17): prices, the billing model, schedule='cost' decisions,
the billed-input meta keys, the window never exceeded."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import event, given, settings, strategies as st

from normandy_core import (
    AgentConfig,
    AgentMemory,
    Entry,
    OptionsError,
    Prices,
    StaticCatalog,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    default_catalog,
    pairing_problems,
    run_compaction,
)
from normandy_core.conversation.cost import (
    DEFAULT_RATES,
    CacheRates,
    billed,
    cached_until,
    first_change,
    horizon_cost,
    rates_for,
)

WINDOW = 12_000
RESERVED = 500


def _session(rounds: int, result_chars: int = 1_600, turn: str = "t1") -> list[Entry]:
    entries = [Entry(id="task", role="user", content="Fix the failing build.", turn_id=turn)]
    for i in range(rounds):
        entries.append(
            Entry(
                id=f"a{i}",
                role="assistant",
                content=(ToolUseBlock(id=f"u{i}", name="read", input={"path": f"src/m{i}.py"}),),
                turn_id=turn,
            )
        )
        text = f"# module {i}\n" + " ".join(
            f"value_{i}_{k} = {k * 7}" for k in range(result_chars // 14)
        )
        entries.append(
            Entry(
                id=f"r{i}",
                role="user",
                content=(ToolResultBlock(tool_use_id=f"u{i}", content=text),),
                turn_id=turn,
            )
        )
    return entries


def _slowing() -> list[Entry]:
    """Eight large tool results, then eight small ones (the session grows slowly now),
    then a new user turn: above the target, under the window."""
    big = _session(8)
    small = [
        e.model_copy(update={"id": f"s{e.id}", "turn_id": "t2"})
        if not e.tool_results
        else e.model_copy(
            update={
                "id": f"s{e.id}",
                "turn_id": "t2",
                "content": (
                    ToolResultBlock(tool_use_id=f"s{e.tool_results[0].tool_use_id}", content="ok"),
                ),
            }
        )
        for e in _session(8)[1:]
    ]
    small = [
        e.model_copy(
            update={"content": tuple(b.model_copy(update={"id": f"s{b.id}"}) for b in e.tool_uses)}
        )
        if e.role == "assistant"
        else e
        for e in small
    ]
    return big + small + [Entry(id="q3", role="user", content="And now?", turn_id="t3")]


def _acc(entries: list[Entry], **opts: object) -> AgentConfig:
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="window_manager",
        compactor_opts={
            "context_window": WINDOW,
            "reserved_tokens": RESERVED,
            "counter": "cl100k_base",
            "schedule": "cost",
            **opts,
        },
    )
    return acc.with_memory(AgentMemory.from_entries(entries))


def _sent(acc: AgentConfig) -> int:
    counter = acc.prepared.counter_for(acc.model)
    return counter.memory_tokens(acc.memory) + acc.prompt_tokens + counter.request_tokens


# -- prices ---------------------------------------------------------------------------


def test_catalog_prices_are_dated_and_match_prefixes():
    p = default_catalog().prices("claude-sonnet-4-5-20250929")
    assert p is not None and p.input == 3.0
    assert p.read_ratio == pytest.approx(0.1) and p.write_ratio == pytest.approx(1.25)
    assert default_catalog().prices("gpt-5-mini-2025-08-07").write_ratio == pytest.approx(1.0)
    assert default_catalog().prices("totally-unknown") is None
    import datetime

    from normandy_core.conversation.catalog import DEFAULT_PRICES

    for price in DEFAULT_PRICES.values():
        datetime.date.fromisoformat(price.as_of)


def test_catalog_prices_are_overridable():
    mine = Prices(input=2.0, cache_write=2.0, cache_read=0.2, as_of="2026-12-01")
    cat = StaticCatalog(
        prices={
            "claude-sonnet-4-5": mine,
            "my-model": {"input": 1, "cache_write": 2, "cache_read": 0.5, "as_of": "2026-01-02"},
        }
    )
    assert cat.prices("claude-sonnet-4-5-20250929") is mine
    assert cat.prices("my-model-v2").cache_write == 2
    assert cat.prices("claude-haiku-4-5").input == 1.0  # defaults stay
    assert default_catalog().prices("my-model") is None  # never leaks
    assert rates_for(cat, "my-model") == CacheRates(read=0.5, write=2.0)
    assert rates_for(cat, "unknown") == DEFAULT_RATES
    assert StaticCatalog(include_defaults=False).prices("claude-sonnet-4-5") is None


@pytest.mark.parametrize(
    ("given_", "match"),
    [
        ({"input": -1, "cache_write": 1, "cache_read": 1, "as_of": "2026-01-01"}, "non-negative"),
        ({"input": 0, "cache_write": 1, "cache_read": 1, "as_of": "2026-01-01"}, "positive"),
        ({"input": 1, "cache_write": 1, "cache_read": 1, "as_of": "last week"}, "ISO date"),
        ({"input": 1, "cache_write": 1}, "give input"),
        (3.0, "Prices or a mapping"),
    ],
)
def test_bad_prices_are_refused(given_, match):
    with pytest.raises(ValueError, match=match):
        StaticCatalog(prices={"m": given_})


# -- the billing model ----------------------------------------------------------------


def test_billing_model_reads_the_unchanged_prefix_and_writes_the_rest():
    assert billed(1000, 1500, DEFAULT_RATES) == pytest.approx(0.1 * 1000 + 1.25 * 500)
    assert billed(0, 800, DEFAULT_RATES) == pytest.approx(1000)
    entries = _session(3)
    assert cached_until(entries) == 5  # the newest assistant entry
    assert cached_until(entries[:1]) is None
    changed = [*entries[:3], entries[3].model_copy(update={"content": "x"}), *entries[4:]]
    assert first_change(entries, changed) == 3
    assert first_change(entries, entries[:4]) == 4
    # no growth, no limit: each later call reads everything
    assert horizon_cost(
        sent=100,
        cached=0,
        after_size=0,
        rewrite=0,
        growth=0,
        limit=None,
        calls=3,
        rates=DEFAULT_RATES,
    ) == pytest.approx(125 + 10 + 10)


# -- options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("compactor", "opts", "match"),
    [
        ("window_manager", {"schedule": "cheapest"}, "schedule"),
        ("window_manager", {"schedule": "cost", "trigger": 0.8}, "trigger applies only"),
        ("window_manager", {"horizon": 20}, "horizon applies only"),
        ("window_manager", {"schedule": "cost", "horizon": 0}, "horizon"),
        ("window_manager", {"schedule": "cost", "strategy": "sliding_window"}, "sliding_window"),
        ("clear_tool_results", {"horizon": 20}, "horizon applies only"),
        ("clear_tool_results", {"schedule": "often"}, "schedule"),
        ("pipeline", {"schedule": "soon", "steps": [{"compactor": "window_manager"}]}, "schedule"),
    ],
)
def test_schedule_options_are_checked_at_config_time(compactor, opts, match):
    with pytest.raises(OptionsError, match=match):
        AgentConfig(
            model="claude-sonnet-4-5",
            compactor=compactor,
            compactor_opts={"context_window": 50_000, **opts}
            if compactor == "window_manager"
            else opts,
        )


def test_pipeline_gives_its_cost_schedule_to_the_steps_that_have_one():
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="pipeline",
        compactor_opts={
            "schedule": "cost",
            "steps": [
                {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 5_000}},
                {"compactor": "window_manager", "opts": {"schedule": "threshold"}},
                {"compactor": "noop"},
            ],
        },
    )
    steps = acc.prepared.options.prepared_steps
    assert steps[0].options.schedule == "cost"
    assert steps[1].options.schedule == "threshold"  # a step's own choice wins
    assert steps[2].raw == {}


# -- decisions ---------------------------------------------------------------------------


def test_over_the_window_it_compacts_whatever_it_costs():
    acc = _acc(_session(40), horizon=1)
    assert _sent(acc) > WINDOW - RESERVED
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] and meta["cost_decision"] == "forced"
    assert _sent(new_acc) <= WINDOW - RESERVED


def test_mid_round_under_the_window_it_never_compacts():
    acc = _acc(_session(10), horizon=500)
    assert int(0.6 * (WINDOW - RESERVED)) < _sent(acc) <= WINDOW - RESERVED
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert not meta["compacted"] and new_acc.memory.entries() == acc.memory.entries()


def test_it_waits_when_compacting_does_not_pay_and_compacts_when_it_does():
    entries = _slowing()
    short = _acc(entries, horizon=1, target=0.3)
    _, meta = run_compaction(short, mid_round=False)
    # one call: the rewrite at 1.25x costs more than the reads it saves
    assert not meta["compacted"] and meta["cost_decision"] == "waits"
    assert meta["cost_horizon_without"] <= meta["cost_horizon_with"]
    assert meta["billed_next_without"] < meta["billed_next_with"]
    long = _acc(entries, horizon=100, target=0.3)
    new_acc, meta = run_compaction(long, mid_round=False)
    assert meta["compacted"] and meta["cost_decision"] == "pays"
    assert meta["cost_horizon_with"] < meta["cost_horizon_without"]
    assert _sent(new_acc) <= WINDOW - RESERVED


def test_old_tool_results_are_cleared_before_anything_is_dropped():
    entries = _slowing()
    new_acc, meta = run_compaction(_acc(entries, horizon=100, target=0.3), mid_round=False)
    assert meta["compacted"] and meta["cleared"]
    kept = new_acc.memory.entries()
    assert [e.id for e in kept] == [e.id for e in entries]  # nothing dropped
    cleared = {e.id for e in meta["dropped"]}
    assert cleared == {f"r{i}" for i, _ in enumerate(meta["cleared"])}  # the oldest ones
    assert "r7" not in cleared  # the newest large result is in the floor


def test_every_compaction_reports_the_next_calls_billed_input():
    default = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="window_manager",
        compactor_opts={"context_window": WINDOW, "reserved_tokens": RESERVED},
    )
    for acc in (_acc(_session(40)), default.with_memory(AgentMemory.from_entries(_session(40)))):
        _, meta = run_compaction(acc, mid_round=True)
        assert meta["compacted"]
        without, with_, kept = (
            meta["billed_next_without"],
            meta["billed_next_with"],
            meta["cache_kept_tokens"],
        )
        # with: the kept prefix read, the rest of what is sent written
        after = meta["tokens_after"]
        assert with_ >= 0.1 * kept + 1.25 * (after - kept) - 1
        # without: everything before the newest assistant entry read, the rest written
        assert without > 0 and with_ > 0
        assert kept <= acc.prompt_tokens + meta["tokens_before"]


@settings(max_examples=25, deadline=None)
@given(
    rounds=st.lists(st.integers(min_value=100, max_value=3_000), min_size=30, max_size=80),
    horizon=st.integers(min_value=1, max_value=300),
    target=st.sampled_from([None, 0.3, 0.5, 0.6, 0.8]),
)
def test_the_window_is_never_exceeded(rounds, horizon, target):
    """A session grown round by round: never over the window, pairs never split, nothing
    dropped or cleared unreported, the input never mutated, the meta consistent."""
    opts: dict[str, object] = {"horizon": horizon}
    if target is not None:
        opts["target"] = target
    acc = _acc([Entry(id="task", role="user", content="Go.", turn_id="t0")], **opts)
    usable = WINDOW - RESERVED
    for i, chars in enumerate(rounds):
        acc.memory.add_message(
            "assistant",
            (ToolUseBlock(id=f"u{i}", name="read", input={"n": i}),),
            id=f"a{i}",
            turn_id=f"t{i // 4}",
        )
        acc.memory.add_message(
            "user",
            (ToolResultBlock(tool_use_id=f"u{i}", content=f"line {i} " * (chars // 7)),),
            id=f"r{i}",
            turn_id=f"t{i // 4}",
        )
        if i % 4 == 3:
            acc.memory.add_message("user", f"next step {i}", id=f"q{i}", turn_id=f"t{i // 4 + 1}")
        before = _sent(acc)
        original = acc.memory
        dump = original.dump()
        new_acc, meta = run_compaction(acc, mid_round=i % 4 != 3)
        event(f"{meta.get('cost_decision')} {meta.get('cost_plan')} {meta['compacted']}")
        assert "error" not in meta, meta.get("error")
        assert original.dump() == dump  # the input is never mutated
        assert _sent(new_acc) <= usable
        if meta["compacted"]:
            kept = list(new_acc.memory)
            assert pairing_problems(kept) == []
            reported = {e.id: e for e in meta["dropped"]}
            now = {e.id: e for e in kept}
            for e in original:
                if e.id not in now or now[e.id].content != e.content:
                    assert reported.get(e.id) == e  # reported, with its original content
            for tool_id in meta.get("cleared", ()):
                assert any(
                    tool_id in (e.metadata.get("normandy.cleared_tool_uses") or ()) for e in kept
                )
            # the meta's figures agree with the billing model and with each other
            prompt = _sent(new_acc) - meta["tokens_after"]
            kept_tokens = meta["cache_kept_tokens"]
            assert 0 <= kept_tokens <= prompt + meta["tokens_after"]
            expected = billed(kept_tokens, prompt + meta["tokens_after"], DEFAULT_RATES)
            assert abs(meta["billed_next_with"] - expected) <= 1
            assert meta["billed_next_without"] <= 1.25 * before + 1
            assert meta["cost_decision"] in ("forced", "pays")
        acc = new_acc


def _rounds(prefix: str, n: int, chars: int, turn: str) -> list[Entry]:
    """``n`` tool rounds whose ids start with ``prefix``."""
    return [
        e.model_copy(
            update={
                "id": f"{prefix}{e.id}",
                "content": tuple(
                    b.model_copy(update={"id": f"{prefix}{b.id}"})
                    if isinstance(b, ToolUseBlock)
                    else b.model_copy(update={"tool_use_id": f"{prefix}{b.tool_use_id}"})
                    for b in e.content
                ),
            }
        )
        for e in _session(n, result_chars=chars, turn=turn)[1:]
    ]


def test_clear_tool_results_clears_only_when_it_pays():
    # small old results, then large new ones it keeps: clearing saves a little per call
    # and rewrites the large tail once
    entries = [
        Entry(id="task", role="user", content="Fix the failing build.", turn_id="t1"),
        *_rounds("old", 6, 700, "t1"),
        *_rounds("new", 6, 1_600, "t2"),
        Entry(id="q3", role="user", content="And now?", turn_id="t3"),
    ]

    def config(horizon: int) -> AgentConfig:
        acc = AgentConfig(
            model="claude-sonnet-4-5",
            compactor="clear_tool_results",
            compactor_opts={
                "trigger_tokens": 2_000,
                "keep": 6,
                "counter": "cl100k_base",
                "schedule": "cost",
                "horizon": horizon,
            },
        )
        return acc.with_memory(AgentMemory.from_entries(entries))

    _, meta = run_compaction(config(1), mid_round=False)
    assert not meta["compacted"] and meta["cost_decision"] == "waits"
    assert meta["cost_horizon_without"] <= meta["cost_horizon_with"]
    new_acc, meta = run_compaction(config(200), mid_round=False)
    assert meta["compacted"] and meta["cost_decision"] == "pays"
    assert meta["cost_horizon_with"] < meta["cost_horizon_without"]
    # the boundary's figures: the next call costs more with the clearing (the rewrite),
    # which the horizon pays back
    assert meta["billed_next_with"] > meta["billed_next_without"]
    assert meta["cleared"] == [f"oldu{i}" for i in range(6)]
    assert [e.id for e in new_acc.memory.entries()] == [e.id for e in entries]


# -- the cost schedule's arithmetic ----------------------------------------------------------


def test_a_cycles_rate_is_the_hand_computed_one():
    from normandy_window_manager.schedule import cycle_rate

    # 1000 tokens, 100 cached, +100 per call: rate(n) = (1.15 * 900 + 0.1 * (1000 n +
    # 50 n (n - 1)) + 1.15 * 100 (n - 1)) / n = 920 / n + 210 + 5 n, lowest at n = 14
    rate, n = cycle_rate(1000, 100, 100.0, 50, DEFAULT_RATES)
    assert n == 14
    assert rate == pytest.approx(920 / 14 + 210 + 5 * 14)
    # one call only: the rewrite and the read of that call
    assert cycle_rate(1000, 100, 100.0, 1, DEFAULT_RATES) == (pytest.approx(1.25 * 900 + 10), 1)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 200_000),
    kept_share=st.floats(0, 1),
    growth=st.floats(0, 20_000),
    max_calls=st.integers(1, 120),
    write=st.sampled_from([1.0, 1.25, 2.0]),
)
def test_a_cycles_rate_is_the_lowest_over_every_length(size, kept_share, growth, max_calls, write):
    from normandy_window_manager.schedule import cycle_rate

    rates = CacheRates(read=0.1, write=write)
    kept = int(size * kept_share)
    rate, n = cycle_rate(size, kept, growth, max_calls, rates)
    assert 1 <= n <= max_calls
    extra = rates.write - rates.read
    brute = min(
        (
            extra * (size - kept)
            + 0.1 * (k * size + growth * k * (k - 1) / 2)
            + extra * growth * (k - 1)
        )
        / k
        for k in range(1, max_calls + 1)
    )
    assert rate == pytest.approx(brute, rel=1e-9, abs=1e-6)


def test_the_decision_picks_the_cheaper_of_two_plans():
    from normandy_window_manager.schedule import Plan, price_plans

    drop = Plan("drop", level=1000, size=1000, kept=100, clears=0, drops=True)
    clear = Plan("clear", level=1000, size=1500, kept=1200, clears=3, drops=False)
    priced = price_plans(
        [drop, clear], cached=5000, growth=100.0, usable=10_000, horizon=50, rates=DEFAULT_RATES
    )
    by = {p.plan.name: p for p in priced}
    # drop: 920 / n + 210 + 5 n, lowest at n = 14; clear rewrites 300 tokens:
    # (1.15 * 300 + 0.1 * (1500 n + 50 n (n - 1)) + 115 (n - 1)) / n = 230 / n + 260 + 5 n,
    # lowest at n = 7: clear is cheaper though it keeps 500 tokens more
    assert (by["drop"].calls, by["clear"].calls) == (14, 7)
    assert by["drop"].rate == pytest.approx(920 / 14 + 280)
    assert by["clear"].rate == pytest.approx(230 / 7 + 295)
    assert min(priced, key=lambda p: p.rate).plan is clear
    # clearing that leaves 3000 tokens (100 rewritten): 415 + 5 (n - 1), lowest at n = 1
    big = Plan("clear", level=1000, size=3000, kept=2900, clears=1, drops=False)
    priced = price_plans(
        [drop, big], cached=5000, growth=100.0, usable=10_000, horizon=50, rates=DEFAULT_RATES
    )
    assert [round(p.rate, 3) for p in priced] == [round(920 / 14 + 280, 3), 415.0]
    assert min(priced, key=lambda p: p.rate).plan is drop
    # a plan cannot be weighed over more calls than the window leaves room for
    (tight,) = price_plans(
        [drop], cached=5000, growth=100.0, usable=1_500, horizon=50, rates=DEFAULT_RATES
    )
    assert tight.calls == 6  # 1000 + 5 * 100 = 1500
    # the cached prefix a plan keeps is at most what is cached now
    (cold,) = price_plans(
        [clear], cached=0, growth=100.0, usable=10_000, horizon=50, rates=DEFAULT_RATES
    )
    assert cold.kept == 0


def test_with_its_defaults_the_cost_schedule_cuts_to_its_floor():
    from normandy_window_manager.schedule import COST_FLOOR

    acc = _acc(_session(40))  # no target: the documented floor
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] and meta["cost_decision"] == "forced"
    assert meta["cost_floor"] == int(COST_FLOOR * (WINDOW - RESERVED))
    assert _sent(new_acc) <= meta["cost_floor"] + 50
    # given, target is the floor
    _, meta = run_compaction(_acc(_session(40), target=0.5), mid_round=True)
    assert meta["cost_floor"] == int(0.5 * (WINDOW - RESERVED))


def test_the_benchmarks_verdict_checks_all_three_conditions():
    from benchmarks.cost import Row, verdict

    base = Row("default", cost=10.0, compactions=5, peak=40_000, over=0, facts=50, facts_total=60)
    good = Row("cost", cost=8.0, compactions=5, peak=40_000, over=0, facts=50, facts_total=60)
    assert verdict(good, base, 43_904).startswith("**met**")
    for bad in (
        dataclasses.replace(good, cost=8.01),  # 0.801x: not 20 % cheaper
        dataclasses.replace(good, over=1),
        dataclasses.replace(good, peak=43_905),
        dataclasses.replace(good, facts=49),
    ):
        assert verdict(bad, base, 43_904).startswith("**not met**")


def test_over_the_window_only_by_old_thinking_it_strips_it():
    """Campaign: seed 21, index 648 (window_manager, schedule='cost', target 1.0). Over the
    usable window only by the thinking of earlier turns, the drop plan had nothing to drop
    once that thinking was stripped, and the boundary left the conversation over the
    window (compacted False). It now keeps the stripped entries, as the threshold
    schedule does."""
    thinking = ThinkingBlock(thinking="step " * 4_000, signature="sig")
    entries = [Entry(id="task", role="user", content="Fix the failing build.", turn_id="t1")]
    for i in range(3):
        entries.append(
            Entry(
                id=f"a{i}",
                role="assistant",
                content=(thinking, TextBlock(text=f"Done {i}.")),
                turn_id=f"t{i + 1}",
            )
        )
        entries.append(Entry(id=f"q{i}", role="user", content=f"Next {i}.", turn_id=f"t{i + 2}"))
    acc = _acc(entries, target=1.0)
    assert _sent(acc) > WINDOW - RESERVED
    stripped = [e.without_thinking() for e in entries]
    assert _sent(acc.with_memory(AgentMemory.from_entries(stripped))) <= WINDOW - RESERVED
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] and meta["cost_decision"] == "forced", meta
    assert _sent(new_acc) <= WINDOW - RESERVED
    assert [e.id for e in new_acc.memory.entries()] == [e.id for e in entries]


def test_cleared_results_are_listed_as_shortened():
    """Campaign: seed 21, indices 164 and 425 (schedule='cost'; check ``accounting``):
    results the cost schedule cleared are kept changed and reported dropped, and now
    listed in ``meta["shortened"]`` as window_manager's shortened results are."""
    entries = _slowing()
    new_acc, meta = run_compaction(_acc(entries, horizon=100, target=0.3), mid_round=False)
    assert meta["compacted"] and meta["cleared"]
    kept = {e.id for e in new_acc.memory.entries()}
    both = sorted(e.id for e in meta["dropped"] if e.id in kept)
    assert both and sorted(meta["shortened"]) == both


def test_growth_is_measured_on_the_intact_newest_part():
    """Campaign: seed 22, index 1211 (pipeline clear_tool_results -> window_manager with
    schedule='cost'; check ``idempotence``). The growth per call was measured over entries
    the compaction had just cleared, so compacting its own output again priced a longer
    cycle and cut again. Growth now stops at the newest entry a compaction made or
    changed."""
    from normandy_core.conversation.cost import growth_per_call

    entries = _session(6)
    sizes = [10 if e.role == "assistant" else 500 for e in entries]
    assert growth_per_call(entries, sizes, calls=8) == pytest.approx((510 * 6 + 500) / 6)
    cleared = [
        e.model_copy(update={"metadata": {"normandy.cleared_tool_uses": ["x"]}})
        if e.id in ("r0", "r1", "r2")
        else e
        for e in entries
    ]
    small = [40 if e.id in ("r0", "r1", "r2") else s for e, s in zip(cleared, sizes, strict=True)]
    # the three intact newest calls (a3..r5) are what the session grows by
    assert growth_per_call(cleared, small, calls=8) == pytest.approx(510)


# -- a compaction's result weighed again (the campaign's idempotence defect) ---------------


def test_a_cleared_result_is_recognised_without_its_metadata():
    """Wire formats carry no metadata: a result cleared by either bundled compactor is
    recognised by its placeholder's tag, so the growth estimate read back from the
    provider's format is the one computed in memory."""
    from normandy_clear_tool_results import DEFAULT_PLACEHOLDER
    from normandy_core.conversation.cost import growth_per_call
    from normandy_core.conversation.keys import CLEARED_KEY, CLEARED_TAG, is_compacted
    from normandy_core.transcripts.chat import from_openai, to_openai
    from normandy_window_manager.schedule import CLEARED_TEXT

    assert CLEARED_TEXT.startswith(CLEARED_TAG) and DEFAULT_PLACEHOLDER.startswith(CLEARED_TAG)
    entries = _session(6)
    new_acc, meta = run_compaction(_acc(_slowing(), horizon=100, target=0.3), mid_round=False)
    assert meta["compacted"] and meta["cleared"]
    cleared = [e for e in new_acc.memory.entries() if e.metadata.get(CLEARED_KEY)]
    assert cleared and all(is_compacted(e) for e in cleared)
    back = from_openai(to_openai(new_acc.memory)).entries()
    ids = {e.tool_results[0].tool_use_id for e in cleared}
    read = [e for e in back if e.tool_results and e.tool_results[0].tool_use_id in ids]
    assert len(read) == len(cleared)
    assert all(not e.metadata.get(CLEARED_KEY) and is_compacted(e) for e in read)
    assert not any(is_compacted(e) for e in entries)  # results of their own: untouched
    memory = new_acc.memory.entries()
    assert growth_per_call(back, [len(e.text()) for e in back]) == growth_per_call(
        memory, [len(e.text()) for e in memory]
    )


def test_clear_tool_results_leaves_a_result_window_manager_cleared():
    """A pipeline's ``clear_tool_results`` reading back ``window_manager``'s output in a
    wire format does not clear its placeholder again (it used to, so a second pass
    rewrote the output)."""
    from normandy_core.transcripts.chat import from_openai, to_openai
    from normandy_window_manager.schedule import CLEARED_TEXT

    new_acc, meta = run_compaction(_acc(_slowing(), horizon=100, target=0.3), mid_round=False)
    assert meta["cleared"]
    back = AgentConfig(
        compactor="clear_tool_results",
        compactor_opts={"keep": 0, "trigger_tokens": 1, "counter": "cl100k_base"},
    ).with_memory(from_openai(to_openai(new_acc.memory)))
    again, meta2 = run_compaction(back, mid_round=False)
    assert meta2["compacted"]  # it cleared the results nobody had cleared
    assert set(meta2["cleared"]).isdisjoint(meta["cleared"])
    results = {b.tool_use_id: b for e in again.memory.entries() for b in e.tool_results}
    assert all(results[i].content == CLEARED_TEXT for i in meta["cleared"])


def test_the_cost_schedule_weighs_its_result_again_until_it_waits():
    """Cut once, the history's growth estimate changes (the cleared results end its intact
    part): the schedule weighs the result again, compacts while that pays, reports the
    rounds, and its output weighed once more waits."""
    from normandy_window_manager.schedule import MAX_ROUNDS

    acc = _acc(_slowing(), horizon=100, target=0.3)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] and 1 <= meta["cost_rounds"] <= MAX_ROUNDS
    again_acc, again = run_compaction(new_acc, mid_round=False)
    assert not again["compacted"]
    assert again.get("cost_decision", "waits") == "waits"  # or under the floor: not weighed
    assert again_acc is new_acc


def test_the_cost_tables_count_the_calls_sent_without_thinking(tmp_path, monkeypatch):
    """The cost benchmark's rows carry the calls the turn loop sent with thinking disabled,
    shown beside facts available and the billed cost (``-`` for a peer)."""
    from benchmarks.cost import DEFAULT, plant, run_config, table
    from normandy_core.app.demo import load_session, replay

    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "a.sqlite3"))
    full = load_session()
    session, facts = plant(dataclasses.replace(full, turns=full.turns[:8]), seed=1)
    row = run_config(DEFAULT, session, facts, 12_000)
    off = replay(session, window=12_000, opts={"round_aware": False})
    mid_round = dataclasses.replace(
        row, name="round_aware off", thinking_disabled=off.thinking_disabled
    )
    assert row.thinking_disabled == replay(session, window=12_000).thinking_disabled
    assert row.calls == len(off.billed) and mid_round.thinking_disabled > 0
    peer = dataclasses.replace(row, name="a peer", thinking_disabled=None)
    lines = table([row, mid_round, peer], DEFAULT).splitlines()
    assert lines[0].endswith("| facts available | calls with thinking disabled |")
    share = 100 * off.thinking_disabled / row.calls
    assert lines[3].endswith(f"| {off.thinking_disabled} of {row.calls} ({share:.1f} %) |")
    assert lines[4].endswith("| - |")

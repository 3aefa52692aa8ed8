"""Round-aware compaction: a turn start makes room for the round the turn will run."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import event, given, settings, strategies as st

from normandy_core import AgentConfig, OptionsError, build_context, get_counter, run_compaction
from normandy_core.app.demo import load_session, replay
from normandy_core.testing.strategies import conversations
from normandy_window_manager import compactor
from normandy_window_manager.cut import cut_to_target
from normandy_window_manager.options import WindowManagerOptions
from normandy_window_manager.rounds import (
    ROUNDS_KEY,
    estimate_round,
    round_growths,
    round_target,
)

SPECIAL = ("normandy.summary", "normandy.compaction_marker")
NEW = "t-new"  # the turn a generated turn start opens


@st.composite
def setups(draw: st.DrawFn) -> tuple[AgentConfig, WindowManagerOptions]:
    """A conversation at a turn start, window_manager options sized around it."""
    conv = draw(conversations(mid_round=False, max_turns=6))
    counter = draw(st.sampled_from(["estimate", "cl100k_base"]))
    size = conv.memory.tokens(get_counter(counter))
    fill = draw(st.sampled_from([0.3, 0.45, 0.6, 0.75, 0.9, 1.05]))
    trigger = draw(st.sampled_from([1.0, 0.9]))
    opts: dict[str, Any] = {
        "strategy": draw(st.sampled_from(["oldest_first", "sliding_window"])),
        "context_window": max(int(size / fill), 1_500) + 200,
        "reserved_tokens": 200,
        "trigger": trigger,
        "target": draw(st.sampled_from([0.5, 0.6])),
        "counter": counter,
    }
    if draw(st.booleans()):
        opts["round_percentile"] = draw(st.sampled_from([0.5, 0.9, 1.0]))
        opts["round_max"] = draw(st.sampled_from([0.3, 0.5, 0.7]))
        opts["round_prior"] = min(draw(st.sampled_from([0.0, 0.2, 0.3])), opts["round_max"])
        opts["round_headroom"] = draw(st.sampled_from([0.0, 0.35, 1.0]))
    # a turn start: the new request is in, its round to come
    memory = conv.memory.copy()
    memory.add_message(
        "user", draw(st.sampled_from(["Go on.", "Now the tests." * 20])), turn_id=NEW
    )
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="window_manager",
        compactor_opts=opts,
    ).with_memory(memory)
    return acc, WindowManagerOptions(**opts)


def _ids(acc: AgentConfig) -> list[str]:
    return [e.id for e in acc.memory if not any(e.metadata.get(k) for k in SPECIAL)]


@settings(max_examples=150, deadline=None)
@given(setups())
def test_a_turn_start_leaves_room_for_its_estimate(setup: Any) -> None:
    """Where the strategy can make the room (its target met), a turn start never leaves
    less room than the coming round's estimate; it skips only when the round fits."""
    acc, opts = setup
    ctx = build_context(acc, mid_round=False, turn_id=NEW)
    usable = ctx.window - opts.reserved_tokens
    sent = ctx.counter.memory_tokens(acc.memory) + ctx.prompt_tokens
    estimate = estimate_round(acc.memory, ctx, opts, usable)

    new_acc, meta = run_compaction(acc, mid_round=False, turn_id=NEW)

    event("compacted" if meta["compacted"] else "error" if "error" in meta else "skipped")
    if not meta["compacted"]:
        if "error" not in meta:
            assert sent <= opts.trigger * usable
            assert sent + estimate.tokens <= usable
        return
    after = ctx.counter.memory_tokens(new_acc.memory) + ctx.prompt_tokens
    assert meta["round_estimate"] == estimate.tokens
    assert meta["round_rounds"] == estimate.rounds
    assert "round estimate" in meta["round_reason"]
    if meta["target_met"]:
        assert after <= round_target(opts, estimate, usable) * usable + 1
        assert after + estimate.tokens <= usable + 1
        return
    assert after <= usable
    if after + estimate.tokens > usable + 1:
        # the room was not made: the strategy cannot make it (its deepest cut cannot)
        deepest = opts.model_copy(update={"target": 0.001})
        before = ctx.counter.memory_tokens(acc.memory)
        floor_acc, floor = cut_to_target(acc, ctx, deepest, ctx.counter, before, usable)
        least = ctx.counter.memory_tokens(floor_acc.memory) + ctx.prompt_tokens
        assert "error" in floor or least + estimate.tokens > usable + 1


@settings(max_examples=150, deadline=None)
@given(setups(), st.booleans())
def test_round_aware_off_restores_todays_decisions(setup: Any, mid_round: bool) -> None:
    """With ``round_aware`` off a boundary decides as before the option: skip at or under
    ``trigger`` (turn start) or the usable window (mid-round), else the plain cut to
    ``target``."""
    acc, _ = setup
    plain = {k: v for k, v in acc.compactor_opts.items() if not k.startswith("round_")}
    acc = acc.with_compactor("window_manager", {**plain, "round_aware": False})
    off = WindowManagerOptions(**acc.compactor_opts)
    ctx = build_context(acc, mid_round=mid_round, turn_id=NEW)
    usable = ctx.window - off.reserved_tokens
    before = ctx.counter.memory_tokens(acc.memory)
    level = usable if mid_round else off.trigger * usable

    got_acc, got = compactor.maybe_compact(acc, ctx, off)

    if before + ctx.prompt_tokens <= level:
        assert got == {"compacted": False} and got_acc is acc
        return
    want_acc, want = cut_to_target(acc, ctx, off, ctx.counter, before, usable)
    # exactly: every meta value (the dropped entries themselves) and every kept or
    # inserted entry's content and metadata (no round record on a marker), new ids aside
    fresh = {"dropped", "marker_id", "summary_id"}  # new ids per call
    assert {k: v for k, v in got.items() if k not in fresh} == {
        k: v for k, v in want.items() if k not in fresh
    }
    assert ("marker_id" in got) == ("marker_id" in want)
    assert got.get("dropped") == want.get("dropped")
    assert _ids(got_acc) == _ids(want_acc)
    assert [(e.role, e.content, e.metadata) for e in got_acc.memory] == [
        (e.role, e.content, e.metadata) for e in want_acc.memory
    ]
    assert not any(ROUNDS_KEY in e.metadata for e in got_acc.memory)
    # the skip level the boundary's fast path uses is trigger's, as before the option
    level = compactor.compaction_threshold(off, ctx.window, mid_round)
    assert level == (usable if mid_round else math.floor(off.trigger * usable))


def test_the_estimate_is_a_percentile_of_the_sessions_complete_rounds() -> None:
    """Each complete earlier turn's growth after its request counts; the current turn and a
    turn cut into by a compaction do not; before any round the prior decides."""
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="window_manager",
        compactor_opts={"context_window": 200_000},
    )
    ctx = build_context(acc, mid_round=False)
    opts = WindowManagerOptions(context_window=200_000)
    usable = 200_000 - opts.reserved_tokens
    # no rounds yet: the prior share of the usable window
    prior = estimate_round(acc.memory, ctx, opts, usable)
    assert (prior.tokens, prior.rounds) == (int(0.25 * usable), 0)
    memory = acc.memory.copy()
    for turn in ("t1", "t2", "t3"):
        memory.add_message("user", f"request {turn}", turn_id=turn)
        for n in range(3 if turn != "t2" else 6):
            memory.add_message("assistant", "x " * (200 * (n + 1)), turn_id=turn)
    memory.add_message("user", "the current request", turn_id="t4")
    growths = round_growths(memory, ctx.counter, "t4")
    assert len(growths) == 3 and growths[1] == max(growths)
    at_t4 = build_context(acc.with_memory(memory), mid_round=False, turn_id="t4")
    got = estimate_round(memory, at_t4, opts, usable)
    assert (got.tokens, got.rounds) == (max(growths), 3)  # the 90th percentile of three
    # a turn whose request was compacted away is not a complete round
    cut = memory.derive([e for e in memory.entries() if e.text() != "request t2"])
    assert len(round_growths(cut, ctx.counter, "t4")) == 2


@pytest.mark.parametrize(
    ("opts", "words"),
    [
        ({"round_aware": False, "round_percentile": 0.5}, "round_aware is false"),
        ({"schedule": "cost", "round_max": 0.4}, "schedule is 'cost'"),
        ({"schedule": "cost", "round_aware": True}, "round_aware applies only"),
        ({"round_prior": 0.6, "round_max": 0.5}, "must not exceed round_max"),
        ({"round_percentile": 0.0}, "round_percentile"),
        ({"round_max": 1.0}, "round_max"),
        ({"round_headroom": -0.1}, "round_headroom"),
    ],
)
def test_round_options_are_validated_where_the_config_is_made(
    opts: dict[str, Any], words: str
) -> None:
    with pytest.raises(OptionsError, match=words):
        AgentConfig(
            model="claude-sonnet-4-5",
            compactor="window_manager",
            compactor_opts={"context_window": 48_000, **opts},
        )


def test_the_demo_keeps_its_reasoning_at_turn_starts() -> None:
    """On the demo session at 48k the default compacts at turn starts, says why in meta,
    and far fewer calls run with thinking disabled than with round_aware off."""
    session = load_session()
    on = replay(session, window=48_000, turns=30)
    off = replay(session, opts={"round_aware": False}, window=48_000, turns=30)
    starts = [b for b in on.compactions if not b.mid_round]
    assert starts and all("round_reason" in b.meta for b in starts)
    assert all(b.meta["round_estimate"] > 0 for b in starts)
    calls = len(on.billed)
    assert on.thinking_disabled <= 0.05 * calls < off.thinking_disabled
    assert on.peak <= on.window - 4096
    # every compaction says whether it stripped the thinking of a kept message
    assert all(isinstance(b.meta["thinking_stripped"], bool) for b in on.compactions)
    assert any(b.meta["thinking_stripped"] for b in off.compactions if b.mid_round)


@settings(max_examples=60, deadline=None)
@given(setups())
def test_outside_a_turn_loop_a_turn_start_decides_as_before(setup: Any) -> None:
    """A boundary without a turn id (``compact()``, whose calls continue one another) is
    not round-aware: it decides as with ``round_aware`` off."""
    acc, _ = setup
    plain = {k: v for k, v in acc.compactor_opts.items() if not k.startswith("round_")}
    off = acc.with_compactor("window_manager", {**plain, "round_aware": False})
    got_acc, got = run_compaction(acc, mid_round=False)
    want_acc, want = run_compaction(off, mid_round=False)
    assert got["compacted"] == want["compacted"]
    assert got.get("error") == want.get("error")
    assert _ids(got_acc) == _ids(want_acc)
    assert "round_estimate" not in got


def _turns(memory: Any, sizes: list[int], *, thinking: int = 0, start: int = 0) -> None:
    """Append complete turns to ``memory``: a request, then a reply of each size in words
    (with ``thinking`` words of thinking first, when given)."""
    for n, size in enumerate(sizes, start):
        memory.add_message("user", f"request {n}", turn_id=f"t{n:02}")
        content: list[Any] = [{"type": "text", "text": "w " * size}]
        if thinking:
            content.insert(0, {"type": "thinking", "thinking": "t " * thinking, "signature": "s"})
        memory.add_message("assistant", content, turn_id=f"t{n:02}")


def test_the_estimate_keeps_the_rounds_a_compaction_cut() -> None:
    """A turn start that compacts records the session's rounds, as they were before the
    cut (thinking included), on its marker: the next turn start's estimate rests on every
    round the session ran, not only the one or two the cut kept."""
    opts = {"context_window": 12_000, "reserved_tokens": 200, "round_percentile": 1.0}
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="window_manager",
        compactor_opts={**opts, "counter": "cl100k_base"},
    )
    memory = acc.memory.copy()
    # one large round early, then small ones; the large one has thinking
    _turns(memory, [100, 3_000])
    _turns(memory, [1_000] * 5, start=2)
    _turns(memory, [800], thinking=400, start=7)
    memory.add_message("user", "the current request", turn_id="t-now")
    acc = acc.with_memory(memory)
    ctx = build_context(acc, mid_round=False, turn_id="t-now")
    wm = WindowManagerOptions(**acc.compactor_opts)
    usable = 12_000 - 200
    whole = round_growths(memory, ctx.counter, "t-now")
    assert len(whole) == 8

    new_acc, meta = run_compaction(acc, mid_round=False, turn_id="t-now")

    assert meta["compacted"] and meta["round_rounds"] == 8
    kept = round_growths(new_acc.memory, ctx.counter, "t-now")
    assert len(kept) < 8 and max(kept) < max(whole)  # the large round was cut
    marker = next(e for e in new_acc.memory if e.metadata.get(ROUNDS_KEY))
    assert dict(marker.metadata[ROUNDS_KEY]) == dict(
        zip([f"t{n:02}" for n in range(8)], whole, strict=True)
    )
    # the next turn start: the estimate is still the largest round, thinking included
    after = new_acc.memory.copy()
    after.add_message("assistant", "done", turn_id="t-now")
    after.add_message("user", "the next request", turn_id="t-next")
    at_next = build_context(new_acc.with_memory(after), mid_round=False, turn_id="t-next")
    got = estimate_round(after, at_next, wm, usable)
    assert got.rounds == 9
    assert got.tokens == min(max(whole), int(wm.round_max * usable))


def test_a_mid_round_compaction_records_the_round_so_far() -> None:
    """A round that overflows mid-round is recorded at its size so far (a lower bound):
    the next turn start counts the large round that overflowed, not what the cut left."""
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="window_manager",
        compactor_opts={"context_window": 8_000, "reserved_tokens": 200, "counter": "cl100k_base"},
    )
    memory = acc.memory.copy()
    _turns(memory, [300] * 4)
    memory.add_message("user", "a large request", turn_id="t-big")
    for n in range(6):
        memory.add_message("assistant", "w " * 1_200, turn_id="t-big")
        memory.add_message("user", f"more {n}", turn_id="t-big")
    acc = acc.with_memory(memory)
    ctx = build_context(acc, mid_round=True, turn_id="t-big")
    so_far = sum(ctx.counter.entry_tokens(memory, e) for e in memory if e.turn_id == "t-big")

    new_acc, meta = run_compaction(acc, mid_round=True, turn_id="t-big")

    assert meta["compacted"]
    record = dict(
        next(e for e in new_acc.memory if e.metadata.get(ROUNDS_KEY)).metadata[ROUNDS_KEY]
    )
    request = ctx.counter.entry_tokens(
        memory, next(e for e in memory if e.text() == "a large request")
    )
    assert record["t-big"] == so_far - request

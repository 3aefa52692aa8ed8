"""window_manager's cheap check: the UTF-8 bound never skips a compaction the exact count
requires.

Before its tokenizer is loaded, ``window_manager`` compares an upper bound of the
conversation (:meth:`~normandy_core.CalibratedCounter.memory_bound`) with its threshold
and skips when even the bound fits; otherwise the exact count decides. In a test process
the encoding is loaded long before these run, so the real ``upper_bound`` would offer no
bound: each example runs the boundary twice over the same memory, once with cl100k
offering its bound and once without, and both must decide alike, with the threshold
drawn anywhere from below the exact count to above the bound (so compactions, exact
skips and bound skips all occur).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from normandy_core import (
    AgentConfig,
    CalibratedCounter,
    Calibration,
    TiktokenCounter,
    run_compaction,
)
from normandy_core.conversation import tokens as tokens_module
from normandy_core.conversation.tokens import REPLY_PRIMING
from normandy_core.testing.strategies import conversations

MODEL = "gpt-4"  # cl100k, the encoding this machine has


@st.composite
def setups(draw):
    conv = draw(conversations())
    return {
        "memory": conv.memory,
        "mid_round": conv.ends_mid_round,
        "trigger": draw(st.sampled_from([1.0, 0.8])),
        "strategy": draw(st.sampled_from(["oldest_first", "sliding_window"])),
        "counter": draw(st.sampled_from([None, "cl100k_base"])),  # None: the model's default
        "factor": draw(st.none() | st.floats(0.5, 2.0)),
        "system": draw(st.sampled_from(["", "You are a careful coding agent. " * 5])),
        # where the threshold falls: 0 at the exact count, 1 at the bound
        "where": draw(st.floats(-0.3, 1.3)),
    }


def _bounded(on: bool) -> pytest.MonkeyPatch:
    mp = pytest.MonkeyPatch()
    bound = tokens_module._UTF8_BOUND if on else None
    mp.setattr(TiktokenCounter, "upper_bound", lambda self: bound)
    return mp


@given(setups())
def test_the_bound_never_skips_a_compaction_the_exact_count_requires(s):
    memory = s["memory"]
    calibration = Calibration(min_tokens=1)
    if s["factor"] is not None:
        calibration.observe(MODEL, "tiktoken:cl100k_base", 1000, round(1000 * s["factor"]))
    counter = CalibratedCounter(s["counter"], MODEL, calibration)
    probe = AgentConfig(model=MODEL, system_prompt=s["system"])
    prompt = probe.prompt_tokens + REPLY_PRIMING  # what build_context puts in ctx
    exact = counter.memory_tokens(memory) + prompt
    mp = _bounded(True)
    try:
        bound = counter.memory_bound(memory)
    finally:
        mp.undo()
    assert bound is not None
    bound += prompt
    assert bound >= exact
    threshold = max(exact + s["where"] * (bound - exact), 1)
    usable = threshold if s["mid_round"] else threshold / s["trigger"]
    opts = {
        "context_window": max(math.floor(usable), 1),
        "reserved_tokens": 0,
        "strategy": s["strategy"],
        "trigger": s["trigger"],
        "target": min(0.6, s["trigger"]),
    }
    if s["counter"] is not None:
        opts["counter"] = s["counter"]
    acc = AgentConfig(
        model=MODEL, system_prompt=s["system"], compactor="window_manager", compactor_opts=opts
    ).with_memory(memory)
    window_threshold = opts["context_window"] * (1.0 if s["mid_round"] else s["trigger"])

    results = {}
    for on in (True, False):
        mp = _bounded(on)
        try:
            results[on] = run_compaction(acc, mid_round=s["mid_round"], calibration=calibration)
        finally:
            mp.undo()
    fast, exact_only = results[True], results[False]

    # compacts (or tries: the error path) exactly when the exact count is over
    must = exact > window_threshold
    for _, meta in (fast, exact_only):
        assert meta.compacted or "error" in meta or not must
        assert not (meta.compacted or "error" in meta) or must
    assert fast.meta.compacted == exact_only.meta.compacted
    assert fast.meta.get("error") == exact_only.meta.get("error")
    if fast.meta.compacted:
        ids = {e.id for e in memory}
        assert [e.id for e in fast.acc.memory if e.id in ids] == [
            e.id for e in exact_only.acc.memory if e.id in ids
        ]
        assert [e.id for e in fast.meta.dropped] == [e.id for e in exact_only.meta.dropped]
        for key in ("tokens_before", "tokens_after", "tokens_removed", "counter"):
            assert fast.meta[key] == exact_only.meta[key]
        assert fast.meta["tokens_before"] == counter.memory_tokens(memory)  # exact, not bound

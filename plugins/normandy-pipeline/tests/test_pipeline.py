"""pipeline selected by name through the core, running installed compactors by name."""

from __future__ import annotations

import pytest

from normandy_core import (
    AgentConfig,
    OptionsError,
    get_counter,
    hookimpl,
    pairing_problems,
    register_compactor,
    resolve_compactor,
    run_compaction,
    unregister_compactor,
)
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session

CLEAR = {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 30_000, "keep": 2}}


def wm(**opts):
    return {"compactor": "window_manager", "opts": {"counter": "cl100k_base", **opts}}


def make_acc(steps, memory=None, model="claude-sonnet-4-5", **opts) -> AgentConfig:
    acc = AgentConfig(
        model=model,
        system_prompt=SYSTEM_PROMPT,
        tools=TOOLS,
        compactor="pipeline",
        compactor_opts={"steps": steps, "counter": "cl100k_base", **opts},
    )
    return acc.with_memory(
        memory if memory is not None else generate_session(11, 120, end_mid_round=True)
    )


def test_resolved_and_needs_a_window_only_when_a_step_does():
    comp = resolve_compactor("pipeline")
    assert comp.distribution == "normandy-pipeline"
    assert comp.needs_window({"steps": [CLEAR, {"compactor": "noop"}]}) is False
    assert comp.needs_window({"steps": [CLEAR, wm()]}) is True
    assert comp.needs_window({"steps": [CLEAR, wm(context_window=50_000)]}) is False
    assert comp.needs_window({"steps": "garbage"}) is True  # never raises


def test_reports_each_step_and_merges_dropped_once_with_original_content():
    acc = make_acc([CLEAR, wm(context_window=6_000, reserved_tokens=0)], model=None)
    mem = acc.memory
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True and meta["strategy"] == "pipeline"
    first, second = meta["steps"]
    assert (first["index"], first["compactor"], first["compacted"]) == (
        0,
        "clear_tool_results",
        True,
    )
    assert (second["index"], second["compactor"], second["compacted"]) == (
        1,
        "window_manager",
        True,
    )
    assert "dropped" not in first and "dropped" not in second
    # window_manager dropped entries that clear_tool_results had cleared first
    overlap = set(first["dropped_ids"]) & set(second["dropped_ids"])
    assert overlap
    ids = [e.id for e in mem]
    dropped = meta["dropped"]
    dropped_ids = [e.id for e in dropped]
    assert len(dropped_ids) == len(set(dropped_ids))
    assert set(dropped_ids) == set(first["dropped_ids"]) | set(second["dropped_ids"])
    assert dropped_ids == sorted(dropped_ids, key=ids.index)
    for e in dropped:
        assert mem[e.id] == e  # the original, thinking and tool output included
    kept = list(new_acc.memory)
    assert pairing_problems(kept) == []
    assert not any(e.has_thinking for e in kept)
    counter = get_counter("cl100k_base")
    assert meta["tokens_before"] == mem.tokens(counter)
    assert meta["tokens_after"] == new_acc.memory.tokens(counter)
    assert meta["target_met"] is True


def test_stops_after_a_step_that_meets_its_target():
    acc = make_acc([wm(context_window=30_000), CLEAR])
    _, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] is True
    assert [s["compactor"] for s in meta["steps"]] == ["window_manager"]


def test_a_skipping_step_hands_on_to_the_next():
    acc = make_acc([{"compactor": "noop"}, CLEAR])
    _, meta = run_compaction(acc, mid_round=False)
    assert [(s["compactor"], s["compacted"]) for s in meta["steps"]] == [
        ("noop", False),
        ("clear_tool_results", True),
    ]


def test_mid_round_under_the_window_runs_no_step():
    acc = make_acc([CLEAR, wm()])  # catalog window: 200,000 tokens, the session is smaller
    assert acc.memory.tokens(get_counter("cl100k_base")) < 200_000
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta == {"compacted": False}
    assert new_acc is acc and new_acc.memory is acc.memory


class Failing:
    @hookimpl
    def needs_window(self, opts):
        return False

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        return acc, {"compacted": False, "error": "cannot fit"}


def test_a_step_error_returns_the_input_untouched_naming_the_step():
    register_compactor("test_failing", Failing())
    try:
        acc = make_acc([CLEAR, {"compactor": "test_failing"}])
        dump = acc.memory.dump()
        new_acc, meta = run_compaction(acc, mid_round=False)
    finally:
        unregister_compactor("test_failing")
    # clear_tool_results had compacted: its work is discarded with the failure
    assert new_acc is acc and acc.memory.dump() == dump
    assert meta["compacted"] is False and "dropped" not in meta
    assert meta["error"] == "pipeline steps[1] ('test_failing') failed: cannot fit"
    assert meta["failed_step"] == 1


class Exploding:
    @hookimpl
    def needs_window(self, opts):
        return False

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        raise RuntimeError("boom")


def test_a_step_that_raises_is_named():
    register_compactor("test_exploding", Exploding())
    try:
        acc = make_acc([{"compactor": "noop"}, {"compactor": "test_exploding"}])
        new_acc, meta = run_compaction(acc, mid_round=False)
    finally:
        unregister_compactor("test_exploding")
    assert new_acc is acc
    assert meta["error"] == "pipeline steps[1] ('test_exploding') raised RuntimeError: boom"


def test_the_pinned_window_of_a_step_is_used_without_a_catalog_window():
    acc = make_acc([wm(context_window=30_000)], model="model-nobody-knows")
    assert acc.resolve_window() is None
    _, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True and meta["steps"][0]["window"] == 30_000


def test_the_pipeline_window_is_passed_down():
    acc = make_acc([wm()], model="model-nobody-knows", context_window=25_000)
    _, meta = run_compaction(acc, mid_round=True)
    assert meta["steps"][0]["window"] == 25_000


@pytest.mark.parametrize(
    ("steps", "fragment"),
    [
        (
            [CLEAR, wm(trigger=3)],
            "pipeline steps[1] ('window_manager'): compactor 'window_manager' refused its "
            "options:\n  option 'trigger'",
        ),
        (
            [{"compactor": "clear_tool_results", "opts": {"keep": -1}}],
            "pipeline steps[0] ('clear_tool_results'): compactor 'clear_tool_results' refused",
        ),
        ([{"compactor": "noop", "opts": {"x": 1}}], "pipeline steps[0] ('noop'): compactor 'noop'"),
        ([{"compactor": "window_manger"}], "steps[0] ('window_manger'): cannot use this compactor"),
        ([], "option 'steps'"),
        ([{"name": "noop"}], "option 'steps': steps[0] {'name': 'noop'}: no key 'compactor'"),
    ],
)
def test_bad_step_options_are_refused_at_config_time_naming_the_step(steps, fragment):
    with pytest.raises(OptionsError) as err:
        AgentConfig(
            model="claude-sonnet-4-5", compactor="pipeline", compactor_opts={"steps": steps}
        )
    message = str(err.value)
    assert message.startswith("normandy_core.AgentConfig()")
    assert fragment in message


def test_pipelines_nest():
    inner = {"compactor": "pipeline", "opts": {"steps": [CLEAR]}}
    acc = make_acc([{"compactor": "noop"}, inner, wm(context_window=6_000)], model=None)
    _, meta = run_compaction(acc, mid_round=False)
    assert [s["compactor"] for s in meta["steps"]] == ["noop", "pipeline", "window_manager"]
    assert meta["steps"][1]["steps"][0]["compactor"] == "clear_tool_results"
    ids = [e.id for e in meta["dropped"]]
    assert len(ids) == len(set(ids))
    for e in meta["dropped"]:
        assert acc.memory[e.id] == e
    with pytest.raises(
        OptionsError, match=r"pipeline steps\[1\] \('pipeline'\) pipeline steps\[0\]"
    ):
        make_acc(
            [{"compactor": "noop"}, {"compactor": "pipeline", "opts": {"steps": [wm(trigger=5)]}}]
        )


def _band(steps_before):
    """A pipeline whose window_manager step is over its usable window but under its window."""
    probe = make_acc([wm(context_window=10**9)], model=None)
    size = probe.memory.tokens(get_counter("cl100k_base")) + probe.prompt_tokens
    step = wm(context_window=size + 1_000, reserved_tokens=2_000)
    alone = probe.with_compactor("window_manager", step["opts"])
    return alone, make_acc([*steps_before, step], memory=probe.memory, model=None), size


class Counting:
    """window_manager, counting its calls."""

    calls = 0

    @hookimpl
    def options_model(self):
        return resolve_compactor("window_manager").options_model

    @hookimpl
    def needs_window(self, opts):
        return True

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        Counting.calls += 1
        return resolve_compactor("window_manager").maybe_compact(acc, ctx, opts)


def test_mid_round_over_the_usable_window_compacts_like_the_step_alone():
    """Issue 12: mid-round, the pipeline's "still fits" check compared the conversation with
    the raw window, ignoring the step's reserved_tokens: over the usable window but under
    the raw one it returned {"compacted": False} while window_manager alone compacted."""
    alone, acc, _ = _band([])
    _, alone_meta = run_compaction(alone, mid_round=True)
    assert alone_meta["compacted"] is True
    _, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True and meta["target_met"] is True
    assert meta["tokens_after"] == alone_meta["tokens_after"]
    assert [e.id for e in meta["dropped"]] == [e.id for e in alone_meta["dropped"]]
    # the step that found it over its usable window is not run a second time
    register_compactor("test_counting", Counting())
    try:
        step = {**acc.compactor_opts["steps"][0], "compactor": "test_counting"}
        Counting.calls = 0
        _, meta = run_compaction(acc.with_compactor("pipeline", {"steps": [step]}), mid_round=True)
    finally:
        unregister_compactor("test_counting")
    assert meta["compacted"] is True and Counting.calls == 1


def test_mid_round_over_the_usable_window_runs_every_step_in_order():
    """Once a window-sized step finds the conversation over its usable window, the steps
    without a window run too, first as configured (clear_tool_results before dropping)."""
    _, acc, size = _band([CLEAR])
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True
    first = meta["steps"][0]
    assert (first["compactor"], first["compacted"]) == ("clear_tool_results", True)
    assert meta["tokens_after"] + acc.prompt_tokens <= size + 1_000 - 2_000
    assert pairing_problems(list(new_acc.memory)) == []

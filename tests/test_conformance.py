"""The conformance kit, run against every in-tree compactor, and shown to catch violations."""

from __future__ import annotations

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    CompactionContext,
    Entry,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    group_units,
    hookimpl,
    new_id,
    register_compactor,
    unregister_compactor,
)
from normandy_core.testing import CompactorContract, check_call, check_options, check_survival

# The kit is enabled for this repository in the root conftest.py:
# pytest_plugins = ["normandy_core.testing"]

EXAMPLES = 10


class TestNoop(CompactorContract):
    compactor = "noop"
    bad_opts = [{"anything": 1}]
    max_examples = 5


class TestWindowManager(CompactorContract):
    compactor = "window_manager"
    opts = {"counter": "estimate", "reserved_tokens": 500}
    bad_opts = [{"trigger": 2}, {"strategy": "newest"}, {"nope": 1}]
    max_examples = EXAMPLES


class TestWindowManagerSummarize(TestWindowManager):
    opts = {"counter": "estimate", "strategy": "summarize", "summary_max_tokens": 200}


class TestWindowManagerCost(TestWindowManager):
    opts = {"counter": "estimate", "reserved_tokens": 500, "schedule": "cost", "horizon": 20}
    bad_opts = [{"schedule": "cost", "trigger": 0.9}, {"horizon": 5}, {"schedule": "cheap"}]


class TestClearToolResults(CompactorContract):
    compactor = "clear_tool_results"
    opts = {"trigger_tokens": 1_500, "keep": 1, "counter": "estimate"}
    roomy_opts = {"trigger_tokens": 10**9}
    bad_opts = [{"keep": -1}, {"trigger_tool_uses": 2, "keep": 2}, {"placeholder": ""}]
    max_examples = EXAMPLES


class TestClearToolResultsCost(TestClearToolResults):
    opts = {"trigger_tokens": 1_500, "keep": 1, "counter": "estimate", "schedule": "cost"}
    bad_opts = [{"horizon": 5}, {"schedule": "cost", "horizon": 0}]


class TestClearToolInputs(TestClearToolResults):
    opts = {
        "trigger_tool_uses": 2,
        "keep": 1,
        "clear_tool_inputs": True,
        "exclude_tools": ["search"],
    }


class TestPipeline(CompactorContract):
    compactor = "pipeline"
    opts = {
        "counter": "estimate",
        "steps": [
            {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 3_000, "keep": 2}},
            {"compactor": "window_manager", "opts": {"counter": "estimate", "reserved_tokens": 0}},
        ],
    }
    bad_opts = [
        {"steps": []},
        {"steps": [{"compactor": "window_manager", "opts": {"trigger": 2}}]},
        {"steps": [{"compactor": "no_such_compactor"}]},
    ]
    max_examples = EXAMPLES


class TestPipelineCost(TestPipeline):
    opts = {**TestPipeline.opts, "schedule": "cost"}
    bad_opts = [{**TestPipeline.opts, "schedule": "cheap"}]


def test_the_fixture_checks_by_name(compactor_contract):
    compactor_contract("noop", bad_opts=[{"x": 1}], max_examples=5)


# -- the kit catches broken compactors -----------------------------------------------


def session() -> AgentMemory:
    mem = AgentMemory()
    mem.add_message("user", "go", turn_id="t1")
    for i in range(3):
        use = ToolUseBlock(id=f"u{i}", name="read_file", input={})
        mem.add_message(
            "assistant", (ThinkingBlock(thinking="hm", signature="s"), use), turn_id="t1"
        )
        mem.add_message(
            "user", (ToolResultBlock(tool_use_id=f"u{i}", content="x" * 50),), turn_id="t1"
        )
    return mem


class Mutating:
    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        acc.memory.add_message("user", "oops")
        return acc, {"compacted": False}


class DropsNewestFirst:
    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[:1])), {
            "compacted": True,
            "dropped": list(reversed(entries[1:])),
        }


class KeepsThinking:
    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[:1] + entries[3:])), {
            "compacted": True,
            "dropped": entries[1:3],
        }


class DropsTheTask:
    """Drops the oldest unit, the first user message, which the default rules keep."""

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        entries = [e.without_thinking() for e in acc.memory.entries()]
        return acc.with_memory(acc.memory.derive(entries[1:])), {
            "compacted": True,
            "dropped": acc.memory.entries()[:1],
        }


class Orphans:
    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        entries = [e.without_thinking() for e in acc.memory]
        kept = entries[:1] + entries[2:]
        return acc.with_memory(acc.memory.derive(kept)), {
            "compacted": True,
            "dropped": [acc.memory.entries()[1]],
        }


class LosesSilently:
    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        kept = [e.without_thinking() for e in acc.memory.entries()[3:]]
        return acc.with_memory(acc.memory.derive(kept)), {"compacted": True, "dropped": []}


class SkipsWithDropped:
    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        return acc, {"compacted": False, "dropped": acc.memory.entries()[:1]}


class AcceptsAnything:
    @hookimpl
    def validate_opts(self, opts, entry):
        return None

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        return acc, {"compacted": False}


@pytest.mark.parametrize(
    ("plugin", "rule"),
    [
        (Mutating(), "mutated the memory it was given"),
        (DropsNewestFirst(), "not oldest first"),
        (KeepsThinking(), "kept thinking blocks"),
        (DropsTheTask(), "survival rule keep_first_user (the first user message) keeps"),
        (Orphans(), "separated a tool use from its result"),
        (LosesSilently(), "lost silently"),
        (SkipsWithDropped(), "reported dropped entries with compacted=False"),
    ],
)
def test_the_kit_catches_a_broken_compactor(plugin, rule):
    register_compactor("kit_victim", plugin, replace=True)
    try:
        acc = AgentConfig(compactor="kit_victim", compactor_opts={"context_window": 10_000})
        acc = acc.with_memory(session())
        ctx = CompactionContext(model=None, window=10_000, prompt_tokens=0, mid_round=True)
        with pytest.raises(AssertionError, match="kit_victim") as err:
            check_call("kit_victim", acc, ctx)
        assert rule in str(err.value)
    finally:
        unregister_compactor("kit_victim")


class IgnoresTheRules:
    """Keeps system entries and the newest unit, whatever the survival rules keep."""

    @hookimpl
    def needs_window(self, opts):
        return False

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        entries = acc.memory.entries()
        start = group_units(entries)[-1][0]
        system = [e for e in entries[:start] if e.role == "system"]
        dropped = [e for e in entries[:start] if e.role != "system"]
        if not dropped:
            return acc, {"compacted": False}
        kept = [e.without_thinking() for e in system + entries[start:]]
        if kept[len(system)].role == "assistant":
            kept.insert(len(system), Entry(id=new_id(), role="user", content="[cut]"))
        return acc.with_memory(acc.memory.derive(kept)), {"compacted": True, "dropped": dropped}


@pytest.fixture
def no_shrinking():
    """The active hypothesis profile without its shrink phase (a failure is expected: only
    that it is found matters here), restored afterwards."""
    from hypothesis import Phase, settings

    active = settings.default
    settings.register_profile("conformance-restore", active)
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    settings.register_profile("conformance-no-shrink", settings(active, phases=phases))
    settings.load_profile("conformance-no-shrink")
    try:
        yield
    finally:
        settings.load_profile("conformance-restore")


def test_the_kit_catches_a_compactor_that_ignores_the_survival_rules(no_shrinking):
    register_compactor("kit_rule_breaker", IgnoresTheRules(), replace=True)
    try:
        # with every rule off (pinned entries aside) it passes ...
        acc = AgentConfig(
            compactor="kit_rule_breaker",
            survival={"keep_first_user": False, "keep_current_request": False},
        )
        _, meta = check_call("kit_rule_breaker", acc.with_memory(session()))
        assert meta["compacted"] and meta["dropped"][0].text() == "go"
        # ... but drawn rules (and the default one) catch it
        with pytest.raises(AssertionError, match=r"kit_rule_breaker.*survival rule") as err:
            check_survival("kit_rule_breaker", max_examples=50)
        assert "breaks the contract" in str(err.value)
    finally:
        unregister_compactor("kit_rule_breaker")


def test_the_kit_catches_options_accepted_at_config_time():
    register_compactor("kit_lenient", AcceptsAnything(), replace=True)
    try:
        with pytest.raises(AssertionError, match="were accepted at config time"):
            check_options("kit_lenient", {}, [{"nonsense": True}])
    finally:
        unregister_compactor("kit_lenient")

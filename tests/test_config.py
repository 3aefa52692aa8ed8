"""AgentConfig and ctx: window resolution, prompt tokens, options validated where made."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pydantic import Field

from normandy_core import (
    AgentConfig,
    CompactorOptions,
    OptionsError,
    StaticCatalog,
    WindowUnknownError,
    build_context,
    hookimpl,
    register_compactor,
    run_compaction,
    validate_options,
)

SYSTEM = "You are a careful engineer. " * 40
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {"name": "run", "description": "Run a shell command.", "input_schema": {"type": "object"}},
]


class SizedOptions(CompactorOptions):
    context_window: int | None = Field(default=None, gt=0)
    trigger: float = Field(default=0.8, gt=0, le=1)
    strategy: str = "cut"


class Sized:
    """Needs a window (it does not implement needs_window); records the ctx it gets."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @hookimpl
    def validate_opts(self, opts: dict[str, Any], entry: str) -> None:
        validate_options(SizedOptions, opts, entry=entry, compactor="sized")

    @hookimpl
    def maybe_compact(self, acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
        self.seen.append(ctx)
        return acc, {"compacted": False}


class CountingCatalog:
    def __init__(self, windows: dict[str, int]) -> None:
        self.windows = windows
        self.calls: list[str] = []

    def window(self, model: str) -> int | None:
        self.calls.append(model)
        return self.windows.get(model)


@pytest.fixture
def sized() -> Sized:
    plugin = Sized()
    register_compactor("sized", plugin)
    return plugin


def test_interleaved_boundaries_reuse_the_ctx_of_their_own_kind():
    acc = AgentConfig(
        model="gpt-4o", compactor="window_manager", compactor_opts={"context_window": 8_000}
    )
    start = build_context(acc, mid_round=False, turn_id="t")
    mid = build_context(acc, mid_round=True, turn_id="t")
    assert (start.mid_round, mid.mid_round) == (False, True)
    # a turn start between tool batches evicts neither (both immutable, built once)
    assert build_context(acc, mid_round=False, turn_id="t") is start
    assert build_context(acc, mid_round=True, turn_id="t") is mid
    other = build_context(acc, mid_round=True, turn_id="u")
    assert other is not mid and other.turn_id == "u" and other.mid_round is True
    assert build_context(acc, mid_round=False, turn_id="t") is start


def test_ctx_without_window_for_a_compactor_that_needs_none():
    acc = AgentConfig(model="no-such-model", system_prompt=SYSTEM, tools=TOOLS)
    ctx = build_context(acc, mid_round=True)
    assert (ctx.model, ctx.window, ctx.prompt_tokens, ctx.mid_round) == (
        "no-such-model",
        None,
        0,
        True,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.window = 5  # type: ignore[misc]


def test_ctx_with_catalog_window_and_prompt_tokens(sized):
    acc = AgentConfig(
        model="claude-sonnet-4-5-20250929", system_prompt=SYSTEM, tools=TOOLS, compactor="sized"
    )
    run_compaction(acc, mid_round=False)
    run_compaction(acc, mid_round=True)
    first, second = sized.seen
    assert first.window == 200_000
    assert first.model == "claude-sonnet-4-5-20250929"
    assert (first.mid_round, second.mid_round) == (False, True)
    chars = len(SYSTEM) + len(json.dumps(TOOLS))
    assert first.prompt_tokens == pytest.approx(chars / 4, rel=0.05)
    assert first.prompt_tokens > len(SYSTEM) / 4  # the tool definitions count too


def test_prompt_tokens_follow_the_prompt():
    assert AgentConfig(system_prompt="").prompt_tokens == 0
    assert AgentConfig(system_prompt="x" * 400).prompt_tokens == pytest.approx(100, abs=1)
    acc = AgentConfig(system_prompt="x" * 400)
    assert acc.replace(system_prompt="x" * 800).prompt_tokens == pytest.approx(200, abs=1)
    assert acc.replace(tools=TOOLS).prompt_tokens > 100
    assert acc.prompt_tokens == pytest.approx(100, abs=1)


def test_pinned_window_wins_over_the_catalog(sized):
    catalog = CountingCatalog({"m": 50_000})
    acc = AgentConfig(
        model="m", compactor="sized", compactor_opts={"context_window": 8_000}, catalog=catalog
    )
    assert build_context(acc, mid_round=False).window == 8_000
    assert catalog.calls == []


def test_window_is_memoised_per_agent_and_model_and_shared_by_copies(sized):
    catalog = CountingCatalog({"m1": 10_000, "m2": 20_000})
    acc = AgentConfig(model="m1", compactor="sized", catalog=catalog)
    for _ in range(3):
        run_compaction(acc, mid_round=False)
    copy = acc.with_memory(acc.memory.copy())
    run_compaction(copy, mid_round=True)
    rebuilt = acc.replace(system_prompt="other")
    assert build_context(rebuilt, mid_round=False).window == 10_000
    assert catalog.calls == ["m1"]
    other = acc.replace(model="m2")
    assert build_context(other, mid_round=False).window == 20_000
    assert catalog.calls == ["m1", "m2"]
    # Another agent resolves its own window.
    AgentConfig(model="m1", compactor="sized", catalog=catalog)
    assert catalog.calls == ["m1", "m2", "m1"]


def test_a_new_catalog_forgets_the_memo(sized):
    acc = AgentConfig(model="m1", compactor="sized", catalog=CountingCatalog({"m1": 10_000}))
    changed = acc.replace(catalog=StaticCatalog({"m1": 30_000}, include_defaults=False))
    assert build_context(changed, mid_round=False).window == 30_000
    assert build_context(acc, mid_round=False).window == 10_000


def test_unknown_model_is_refused_at_config_time(sized):
    for make in (
        lambda: AgentConfig(model="mystery-9000", compactor="sized"),
        lambda: AgentConfig(model="mystery-9000").with_compactor("sized"),
    ):
        with pytest.raises(WindowUnknownError) as info:
            make()
        msg = str(info.value)
        assert isinstance(info.value, ValueError)
        assert "'mystery-9000'" in msg
        assert "compactor 'sized'" in msg
        assert "context_window" in msg  # how to pin a window
        assert "StaticCatalog(overrides=" in msg
    with pytest.raises(WindowUnknownError, match="names no model"):
        AgentConfig(compactor="sized")
    # Pinning the window, or teaching the catalog, makes it acceptable.
    AgentConfig(model="mystery-9000", compactor="sized", compactor_opts={"context_window": 9_000})
    AgentConfig(
        model="mystery-9000",
        compactor="sized",
        catalog=StaticCatalog(overrides={"mystery-9000": 32_000}),
    )


def test_options_errors_begin_with_the_entry_point_and_name_everything(sized):
    with pytest.raises(OptionsError) as info:
        AgentConfig(model="gpt-4o", compactor="sized", compactor_opts={"trigger": 1.5})
    msg = str(info.value)
    assert msg.startswith("normandy_core.AgentConfig(): compactor 'sized' refused its options")
    assert "option 'trigger'" in msg
    assert "less than or equal to 1" in msg
    assert "1.5" in msg

    acc = AgentConfig(model="gpt-4o", compactor="sized")
    with pytest.raises(OptionsError) as info:
        acc.replace(compactor_opts={"strategi": "cut"})
    msg = str(info.value)
    assert msg.startswith("normandy_core.AgentConfig.replace(): compactor 'sized'")
    assert (
        "option 'strategi': unknown option; did you mean 'strategy'? "
        "allowed options: context_window, strategy, trigger" in msg
    )

    with pytest.raises(OptionsError) as info:
        acc.with_compactor("sized", {"context_window": -3})
    msg = str(info.value)
    assert msg.startswith("normandy_core.AgentConfig.with_compactor(): compactor 'sized'")
    assert "option 'context_window'" in msg
    assert "positive whole number" in msg


def test_validate_options_helper():
    assert validate_options(SizedOptions, None, entry="e()", compactor="c") == SizedOptions()
    with pytest.raises(OptionsError, match=r"^e\(\): compactor 'c' options must be a mapping"):
        validate_options(SizedOptions, ["trigger"], entry="e()", compactor="c")  # type: ignore[arg-type]
    with pytest.raises(OptionsError) as info:
        validate_options(SizedOptions, {"trigger": "high", "x": 1}, entry="e()", compactor="c")
    lines = str(info.value).splitlines()
    assert lines[0] == "e(): compactor 'c' refused its options:"
    assert any(line.startswith("  option 'trigger':") and "'high'" in line for line in lines)
    assert any(line.startswith("  option 'x': unknown option") for line in lines)


def test_noop_refuses_options_naming_the_entry_point():
    with pytest.raises(OptionsError, match=r"^normandy_core\.AgentConfig\(\): compactor 'noop'"):
        AgentConfig(compactor_opts={"keep": 3})


def test_with_memory_does_not_revalidate_and_keeps_settings(sized):
    calls: list[str] = []

    class Watch:
        @hookimpl
        def validate_opts(self, opts: dict[str, Any], entry: str) -> None:
            calls.append(entry)

        @hookimpl
        def needs_window(self, opts: dict[str, Any]) -> bool:
            return False

        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
            return acc, {"compacted": False}

    register_compactor("watch", Watch())
    acc = AgentConfig(compactor="watch", compactor_opts={"a": 1})
    acc.with_memory(acc.memory.copy())
    acc.replace(system_prompt="x")
    acc.with_compactor("watch", {"a": 2})
    assert calls == [
        "normandy_core.AgentConfig()",
        "normandy_core.AgentConfig.replace()",
        "normandy_core.AgentConfig.with_compactor()",
    ]


class Plain:
    """Needs a window and validates its options with a plain ValueError (no entry point)."""

    @hookimpl
    def validate_opts(self, opts: dict[str, Any], entry: str) -> None:
        if opts.get("keep", 1) < 1:
            raise ValueError("keep must be at least 1")

    @hookimpl
    def maybe_compact(self, acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
        assert opts.get("keep", 1) >= 1, "maybe_compact got options that were never validated"
        return acc, {"compacted": False}


def test_any_refusal_is_an_options_error_naming_entry_point_and_compactor():
    register_compactor("plain", Plain())
    with pytest.raises(OptionsError) as info:
        AgentConfig(model="gpt-4o", compactor="plain", compactor_opts={"keep": 0})
    msg = str(info.value)
    assert msg.startswith("normandy_core.AgentConfig(): compactor 'plain' refused its options")
    assert "keep must be at least 1" in msg
    assert isinstance(info.value.__cause__, ValueError)
    acc = AgentConfig(model="gpt-4o", compactor="plain")
    with pytest.raises(OptionsError, match=r"^normandy_core\.AgentConfig\.with_compactor\(\)"):
        acc.with_compactor("plain", {"keep": -1})


def test_options_cannot_change_behind_the_configs_back():
    register_compactor("plain", Plain())
    opts = {"keep": 2}
    acc = AgentConfig(model="gpt-4o", compactor="plain", compactor_opts=opts)
    opts["keep"] = 0  # the caller reuses its dict: the validated config must not change
    assert acc.compactor_opts == {"keep": 2}
    _, meta = run_compaction(acc, mid_round=False)
    assert meta == {"compacted": False}


@pytest.mark.parametrize("bad", [0, -5, True, "big", 1.5, [8000]])
def test_a_pinned_window_must_be_a_positive_whole_number(bad):
    register_compactor("plain", Plain())  # no options model: the core reads context_window
    with pytest.raises(OptionsError) as info:
        AgentConfig(model="gpt-4o", compactor="plain", compactor_opts={"context_window": bad})
    msg = str(info.value)
    assert msg.startswith("normandy_core.AgentConfig(): compactor 'plain'")
    assert "option 'context_window'" in msg
    assert "positive" in msg


@pytest.mark.parametrize(("pinned", "window"), [(8000, 8000), (8000.0, 8000), ("8000", 8000)])
def test_a_pinned_window_accepts_what_an_options_model_would(pinned, window):
    register_compactor("plain", Plain())
    acc = AgentConfig(model="gpt-4o", compactor="plain", compactor_opts={"context_window": pinned})
    assert build_context(acc, mid_round=False).window == window

"""Survival rules across every in-tree compactor, property-based.

Over generated tool-using conversations and drawn rules (the first user message and the
current request on or off, ``keep_tools``, a ``keep_if`` predicate), for every strategy
of ``window_manager`` (the summarizer with and without a model), ``clear_tool_results``
and the ``pipeline``:
an entry a rule keeps is never dropped nor rewritten (its thinking aside) unless the
config is refused where it is made or the compactor returns the irreducible error, and
tool pairs are never split. What a rule keeps is computed here, independently of
:meth:`normandy_core.SurvivalRules.protected`. A long session then shows that the
default keeps the task and the current request through every compaction.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from normandy_core import (
    AgentConfig,
    AgentMemory,
    ContractViolation,
    Entry,
    OptionsError,
    SurvivalRules,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    call_compactor,
    pairing_problems,
    run_compaction,
)
from normandy_core.app.workload import generate_session
from normandy_core.clients.base import ModelReply
from normandy_core.clients.scripted import ScriptedClient
from normandy_core.contract.preparation import pin_if_needed
from normandy_core.testing import context_for
from normandy_core.testing.strategies import Case, cases, survival_rules

_WM = {"counter": "estimate", "reserved_tokens": 500}
#: name -> (compactor, options, whether the config has a model client)
CONFIGS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "oldest_first": ("window_manager", _WM, False),
    "sliding_window": ("window_manager", {**_WM, "strategy": "sliding_window"}, False),
    "sliding_window_1": (
        "window_manager",
        {**_WM, "strategy": "sliding_window", "keep_last_turns": 1},
        False,
    ),
    "summarize_extractive": (
        "window_manager",
        {**_WM, "strategy": "summarize", "summary_max_tokens": 200},
        False,
    ),
    "summarize_model": (
        "window_manager",
        {**_WM, "strategy": "summarize", "summarizer": "model", "summary_max_tokens": 200},
        True,
    ),
    "clear_tool_results": (
        "clear_tool_results",
        {"trigger_tokens": 1_500, "keep": 1, "counter": "estimate"},
        False,
    ),
    "clear_tool_inputs": (
        "clear_tool_results",
        {"trigger_tool_uses": 2, "keep": 1, "clear_tool_inputs": True},
        False,
    ),
    "pipeline": (
        "pipeline",
        {
            "counter": "estimate",
            "steps": [
                {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 3_000, "keep": 2}},
                {"compactor": "window_manager", "opts": {**_WM, "reserved_tokens": 0}},
            ],
        },
        False,
    ),
}

_INSERTED = ("normandy.compaction_marker", "normandy.summary")
_TAGS = ("[normandy:marker]", "[normandy:summary]")


def user_messages(entries: list[Entry]) -> list[Entry]:
    """The messages the user wrote: user entries carrying no tool result, neither a marker
    nor a summary (by metadata or tag)."""
    return [
        e
        for e in entries
        if e.role == "user"
        and not any(e.metadata.get(k) for k in _INSERTED)
        and not any(isinstance(b, ToolResultBlock) for b in e.blocks)
        and not e.text().startswith(_TAGS)
    ]


def expected_kept(entries: list[Entry], rules: SurvivalRules) -> set[str]:
    """The ids the rules keep, computed from their definitions (not from ``protected``)."""
    kept = {e.id for e in entries if e.pinned}
    users = user_messages(entries)
    if rules.keep_first_user and users:
        kept.add(users[0].id)
    if rules.keep_current_request and users:
        kept.add(users[-1].id)
    if rules.keep_tools:
        calls = {
            b.id
            for e in entries
            if e.role == "assistant"
            for b in e.blocks
            if isinstance(b, ToolUseBlock) and b.name in rules.keep_tools
        }
        for e in entries:
            if any(
                (isinstance(b, ToolUseBlock) and b.id in calls)
                or (isinstance(b, ToolResultBlock) and b.tool_use_id in calls)
                for b in e.blocks
            ):
                kept.add(e.id)
    if rules.keep_if is not None:
        kept |= {e.id for e in entries if rules.keep_if(e)}
    return kept


def _client() -> ScriptedClient:
    reply = ModelReply(content=(TextBlock(text="The agent read files and ran the tests."),))
    return ScriptedClient([reply] * 50)


def _config(name: str, case: Case, rules: SurvivalRules) -> AgentConfig | None:
    """The config of ``name`` for ``case`` under ``rules``; ``None`` when it is refused."""
    compactor, opts, with_client = CONFIGS[name]
    options = pin_if_needed(compactor, opts, case.window, entry="test")
    try:
        acc = AgentConfig(
            model="claude-sonnet-4-5",
            compactor=compactor,
            compactor_opts=options,
            survival=rules,
            client=_client() if with_client else None,
        )
    except OptionsError:
        return None
    return acc.with_memory(case.conversation.memory)


def _assert_honoured(acc: AgentConfig, new_acc: AgentConfig, meta: Any, rules: Any) -> None:
    entries = acc.memory.entries()
    kept_ids = expected_kept(entries, rules)
    if not meta.compacted:
        error = meta.error
        if error is not None:
            # the only error a valid conversation may get: the kept part cannot fit
            assert "cannot fit the context window" in error, error
            assert "irreducible" in error
            for rule in rules.active():
                assert rules.describe(rule) in error, (rule, error)
        return
    now = {e.id: e for e in new_acc.memory.entries()}
    for e in entries:
        if e.id in kept_ids:
            assert e.id in now, f"{e.id} ({e.role}) kept by a rule was dropped: {rules!r}"
            assert now[e.id].without_thinking().content == e.without_thinking().content
    dropped = {e.id for e in meta.dropped}
    assert not (dropped & kept_ids), dropped & kept_ids
    assert pairing_problems(new_acc.memory.entries()) == []


_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_kept_entry_survives_every_compaction_or_the_error_says_why(name: str) -> None:
    compactions = 0

    @_SETTINGS
    @given(case=cases(windows=(600, 6_000)), rules=survival_rules())
    def run(case: Case, rules: SurvivalRules) -> None:
        nonlocal compactions
        acc = _config(name, case, rules)
        if acc is None:
            return  # refused where the config is made
        ctx = context_for(acc, mid_round=case.conversation.ends_mid_round)
        try:
            new_acc, meta = call_compactor(acc.compactor_handle, acc, ctx, acc.prepared.options)
        except ContractViolation as exc:  # the check the boundary applies
            raise AssertionError(f"{name}: {exc}") from exc
        _assert_honoured(acc, new_acc, meta, rules)
        if meta.compacted:
            compactions += 1
            again_acc, again = call_compactor(
                new_acc.compactor_handle, new_acc, ctx, new_acc.prepared.options
            )
            _assert_honoured(new_acc, again_acc, again, rules)

    run()
    assert compactions > 0, f"{name} never compacted: the property was not exercised"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_current_request_survives_by_default_or_the_error_names_it(name: str) -> None:
    """Issue 34 item 1, as a property: with the default rules, after any compaction of a
    generated conversation the newest user message (the request being answered) is kept
    unchanged, or the error path says the kept part, that request with it, cannot fit."""
    multi_turn = 0

    @_SETTINGS
    @given(case=cases(windows=(600, 6_000)))
    def run(case: Case) -> None:
        nonlocal multi_turn
        acc = _config(name, case, SurvivalRules())
        if acc is None:
            return
        users = user_messages(acc.memory.entries())
        ctx = context_for(acc, mid_round=case.conversation.ends_mid_round)
        new_acc, meta = call_compactor(acc.compactor_handle, acc, ctx, acc.prepared.options)
        if not users:
            return
        request = users[-1]
        if meta.error is not None:
            assert "keep_current_request (the user message that opened" in meta.error
            return
        kept = new_acc.memory.get(request.id)
        assert kept is not None, f"{name}: the current request {request.id} was dropped"
        assert kept.without_thinking().content == request.without_thinking().content
        multi_turn += meta.compacted and len(users) > 1

    run()
    assert multi_turn > 0, f"{name}: no multi-turn conversation was compacted"


def test_the_irreducible_error_is_returned_only_when_the_kept_part_cannot_fit() -> None:
    """With every entry kept by ``keep_if``, window_manager has nothing to drop: a window
    smaller than the conversation gets the irreducible error, naming the rule."""
    mem = generate_session(2, 40)
    rules = SurvivalRules(keep_if=lambda e: True)
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={"context_window": 8_000, "counter": "cl100k_base", "reserved_tokens": 0},
        survival=rules,
    ).with_memory(mem)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert new_acc is acc and not meta.compacted
    assert "keep_if (test_the_irreducible" in (meta.error or "")


@pytest.mark.parametrize(
    "name", ["oldest_first", "sliding_window_1", "summarize_extractive", "pipeline"]
)
def test_the_default_keeps_the_task_through_every_compaction_of_a_long_session(name: str) -> None:
    """A 500-message session fed boundary by boundary, as the turn loop does: the first
    user message comes back unchanged after every one of many compactions."""
    compactor, opts, _ = CONFIGS[name]
    if compactor == "window_manager":
        opts = {**opts, "counter": "cl100k_base", "reserved_tokens": 2_000}
    acc = AgentConfig(
        model="gpt-4o",
        compactor=compactor,
        compactor_opts={**opts, "context_window": 20_000},
    ).with_memory(AgentMemory())
    session = generate_session(11, 500)
    task = next(e for e in session.entries() if e.role == "user")
    request = task
    compactions = 0
    requests_seen: set[str] = set()
    for e in session.entries():
        acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
        if e.role == "user" and not e.tool_results:
            request = e
        if e.role == "user" and e.tool_results:
            acc, meta = run_compaction(acc, mid_round=True)
            assert "error" not in meta, meta["error"]
            compactions += meta.compacted
            kept = acc.memory.get(task.id)
            assert kept is not None and kept.content == task.content
            assert acc.memory.entries()[1].id == task.id  # after the system prompt
            current = acc.memory.get(request.id)  # the request this turn answers
            assert current is not None and current.content == request.content
            requests_seen.add(request.id)
    assert compactions >= 5
    assert len(requests_seen) >= 3  # many turns, each request kept through its rounds

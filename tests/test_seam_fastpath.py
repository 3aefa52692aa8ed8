"""The boundary's shortcuts give the verdicts of the full paths they stand in for.

A boundary that does not compact takes shortcuts (issue 11's timing targets): the plain
skip result is accepted without the full check, ``ctx`` is reused without looking up
the counter, the ``on_boundary`` selection is kept while the hook plugins stay the same,
and the turn loop's provider-compaction check looks only at new entries. Each property
here compares a shortcut with the full computation over generated inputs.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import event, given, settings, strategies as st

from normandy_core import (
    AgentConfig,
    AgentMemory,
    Calibration,
    CompactionMeta,
    SurvivalRules,
    get_counter,
    hookimpl,
    register_compactor,
    register_hook,
    run_compaction,
    unregister_hook,
)
from normandy_core.contract import hooks
from normandy_core.contract.check import _check, build_context, call_compactor, check_compaction
from normandy_core.contract.faults import FAULT_FLOOD
from normandy_core.contract.plugins import hook_manager
from normandy_core.contract.types import SKIP as _SKIP, CompactionContext, ContractViolation
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.testing import check_call
from strategies import build, conversations, well_formed_conversations

EXAMPLES = 60


def _acc() -> AgentConfig:
    memory = AgentMemory()
    for i in range(4):
        memory.add_message("user" if i % 2 == 0 else "assistant", f"message {i}")
    return AgentConfig(model="gpt-4o", compactor="noop").with_memory(memory)


class _Meta(dict[str, Any]):
    """A dict subclass: not the plain skip path's exact type."""


_COMPACTED = st.sampled_from([False, True, 0, 1, 0.0, None, "no"])
_EXTRA = st.dictionaries(
    st.sampled_from(["error", "dropped", "tokens_before", "strategy"]),
    st.sampled_from([None, "text", 0, [], ()]),
    max_size=2,
)


@st.composite
def _results(draw: st.DrawFn, acc: AgentConfig) -> object:
    """What a compactor may return, weighted toward the shapes of the plain skip path."""
    meta: dict[str, Any] = {}
    if draw(st.booleans()):
        meta["compacted"] = draw(_COMPACTED)
    meta.update(draw(_EXTRA))
    kind = draw(st.sampled_from(["dict", "meta", "subclass", "proxy"]))
    wrapped: object = {
        "dict": meta,
        "meta": CompactionMeta(meta),
        "subclass": _Meta(meta),
        "proxy": MappingProxyType(meta),
    }[kind]
    who = draw(st.sampled_from(["same", "copy", "changed", "other"]))
    first: object = {
        "same": acc,
        "copy": acc.with_memory(acc.memory.copy()),
        "changed": acc.replace(system_prompt="hijacked"),
        "other": "not a config",
    }[who]
    shape = draw(st.sampled_from(["tuple", "list", "triple"]))
    if shape == "list":
        return [first, wrapped]
    if shape == "triple":
        return (first, wrapped, None)
    return (first, wrapped)


def _verdict(fn: Any, *args: Any) -> tuple[str, object, object]:
    try:
        out = fn(*args)
    except ContractViolation as exc:
        return ("refused", str(exc), None)
    return ("accepted", out.acc, dict(out.meta))


@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_the_plain_skip_shortcut_gives_the_full_checks_verdict(data):
    """Over generated results, check_compaction (with its shortcut) and the full check
    accept and refuse the same results, with the same acc, meta and message; the plain
    skip shape (``{"compacted": 0}`` compares equal to it) is not let through unchecked."""
    acc = _acc()
    ctx = build_context(acc, mid_round=data.draw(st.booleans()))
    result = data.draw(_results(acc))
    fast = _verdict(check_compaction, "probe", acc, ctx, result)
    full = _verdict(_check, "probe", acc, ctx, result)
    assert fast[0] == full[0], (result, fast, full)
    if fast[0] == "refused":
        assert fast[1] == full[1]
    else:
        assert fast[1] is full[1] and fast[2] == full[2]


def test_a_skip_with_a_non_boolean_compacted_is_refused():
    """``{"compacted": 0}`` equals ``{"compacted": False}``; before, the shortcut took it."""
    acc = _acc()
    ctx = build_context(acc, mid_round=False)
    with pytest.raises(ContractViolation, match="without a boolean 'compacted'"):
        check_compaction("probe", acc, ctx, (acc, {"compacted": 0}))


def test_call_compactor_still_restores_and_refuses_a_mutated_memory():
    """The written-out mutation snapshot catches an append, as the method did."""

    class Appends:
        def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
            acc.memory.add_message("user", "sneaked in")
            return acc, {"compacted": False}

    acc = _acc()
    before = acc.memory.entries()
    with pytest.raises(ContractViolation, match="mutated the memory"):
        call_compactor(Appends(), acc, build_context(acc, mid_round=False), None)
    assert acc.memory.entries() == before


_MODELS = st.sampled_from(["gpt-4o", "gpt-4o-mini", None])
_CALLS = st.lists(
    st.tuples(
        _MODELS,
        st.sampled_from([0, 10, 500]),
        st.booleans(),
        st.sampled_from([None, "t1", "t2"]),
        st.sampled_from([0, 1, 2]),  # calibration: none, the first, the second
        st.sampled_from([0, 1, 2]),  # rules: none, the first, an equal second object
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=EXAMPLES)
@given(calls=_CALLS, pinned=st.booleans())
def test_a_reused_ctx_equals_the_ctx_built_in_full(calls, pinned):
    """Whatever sequence of boundaries, build_context returns a ctx whose every field is
    what building it in full gives (the counter and rules the very objects)."""
    opts = {"context_window": 100_000} if pinned else {}
    acc = AgentConfig(model="gpt-4o", compactor="window_manager", compactor_opts=opts)
    prepared = acc.prepared
    calibrations = [None, Calibration(), Calibration()]
    first = SurvivalRules(keep_first_user=False)
    rules = [None, first, SurvivalRules(keep_first_user=False)]
    for model, prompt, mid_round, turn_id, cal, rule in calls:
        ctx = build_context(
            prepared,
            model=model,
            prompt_tokens=prompt,
            mid_round=mid_round,
            turn_id=turn_id,
            calibration=calibrations[cal],
            rules=rules[rule],
        )
        counter = prepared.counter_for(model, calibrations[cal])
        window = prepared.window
        expected = CompactionContext(
            model=model,
            window=window,
            prompt_tokens=prompt + counter.request_tokens if window is not None else 0,
            mid_round=mid_round,
            turn_id=turn_id,
            counter=counter,
            rules=rules[rule] if rules[rule] is not None else prepared.rules,
        )
        assert ctx == expected
        assert ctx.counter is expected.counter and ctx.rules is expected.rules


class _Gated:
    """An on_boundary hook plugin in code whose gate is a flag the test flips."""

    def __init__(self) -> None:
        self.open = False
        self.seen = 0

        def gate() -> bool:
            return self.open

        def on_boundary(acc: Any, ctx: Any, meta: Any, info: Any) -> None:
            self.seen += 1

        on_boundary.normandy_active = gate  # type: ignore[attr-defined]
        self.on_boundary = hookimpl(on_boundary)


class _Always:
    def __init__(self) -> None:
        self.seen = 0

    @hookimpl
    def on_boundary(self, acc: Any, ctx: Any, meta: Any, info: Any) -> None:
        self.seen += 1


_OPS = st.lists(
    st.sampled_from(["open", "close", "register_gated", "register_always", "unregister"]),
    min_size=1,
    max_size=10,
)


@settings(max_examples=EXAMPLES)
@given(ops=_OPS)
def test_the_kept_observer_selection_equals_selecting_afresh(ops):
    """Registering, unregistering and flipping gates between boundaries: the kept
    selection is always the fresh one, and every boundary reaches exactly those."""
    pm = hook_manager()
    gated, always = _Gated(), _Always()
    registered: list[str] = []
    acc = _acc()
    try:
        for n, op in enumerate(ops):
            if op == "open":
                gated.open = True
            elif op == "close":
                gated.open = False
            elif op.startswith("register"):
                plugin = gated if op == "register_gated" else always
                if not pm.is_registered(plugin):
                    registered.append(register_hook(plugin, name=f"fastpath-{op}-{n}"))
            elif registered:
                unregister_hook(registered.pop())
            # afresh, from pluggy's own list: the implementations in call order whose
            # gate is open
            fresh = [
                impl
                for impl in reversed(pm.hook.on_boundary.get_hookimpls())
                if impl.plugin is not gated or gated.open
            ]
            kept = hooks.selected("on_boundary", gated=True)
            assert [c.impl for c in kept] == fresh
            seen = gated.seen, always.seen
            run_compaction(acc, mid_round=False)
            plugins = {impl.plugin for impl in fresh}
            assert gated.seen == seen[0] + (gated in plugins)
            assert always.seen == seen[1] + (always in plugins)
    finally:
        for qname in registered:
            unregister_hook(qname)


def _marked(memory: AgentMemory) -> bool:
    return any(e.metadata.get(PROVIDER_COMPACTION_KEY) for e in memory)


@settings(max_examples=EXAMPLES)
@given(
    script=conversations(max_steps=6),
    ops=st.lists(st.sampled_from(["mark", "plain", "ask", "fork", "copy", "derive"]), max_size=12),
)
def test_any_marked_equals_a_scan_of_the_active_branch(script, ops):
    """The incremental check gives a full scan's answer after appends, forks, copies and
    derived memories, asked at any point."""
    memory = build(script)
    for n, op in enumerate(ops):
        if op in ("mark", "plain"):
            memory.add_message(
                "assistant",
                f"reply {n}",
                metadata={PROVIDER_COMPACTION_KEY: True} if op == "mark" else {},
            )
        elif op == "fork":
            entries = memory.entries()
            memory = memory.fork(entries[len(entries) // 2].id if entries else None)
        elif op == "copy":
            memory = memory.copy()
        elif op == "derive":
            memory = memory.derive(memory.entries()[1:])
        assert memory.any_marked(PROVIDER_COMPACTION_KEY) == _marked(memory)
    assert memory.any_marked(PROVIDER_COMPACTION_KEY) == _marked(memory)


# -- the declared threshold: the boundary skips without calling the compactor --------

_RATIOS = st.sampled_from([0.3, 0.9, 0.999, 1.0, 1.001, 1.1, 3.0])
_SCHEDULES = st.sampled_from(
    [
        {},
        {"trigger": 0.8, "target": 0.5},
        {"round_aware": False},
        {"round_max": 0.3, "round_prior": 0.3},
        {"schedule": "cost"},
        {"schedule": "cost", "target": 0.4},
    ]
)


class _Recorder:
    """An on_boundary hook plugin that records what every boundary reports."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    @hookimpl
    def on_boundary(self, acc: Any, ctx: Any, meta: Any, info: Any) -> None:
        self.seen.append(
            (
                info.outcome,
                info.compactor,
                info.distribution,
                info.plugin,
                info.error_type,
                info.compactor_start is not None,
                info.compactor_duration is not None,
                ctx,
                _comparable(meta),
                [(e.role, e.content) for e in acc.memory.entries()],
            )
        )


class _Lines(logging.Handler):
    """The boundary's log lines, their durations left out."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, re.sub(r"[\d.]+ ms", "? ms", record.getMessage())))


def _comparable(meta: Any) -> dict[str, Any]:
    """``meta`` with entries as ids, the ids of inserted entries (new on every call) as
    a placeholder and the notes left out (an archive's name its path)."""
    out = {k: v for k, v in dict(meta).items() if k != "hook_notes"}
    if "dropped" in out:
        out["dropped"] = [e.id for e in out["dropped"]]
    for key in out:
        if key.endswith("_id") and isinstance(out[key], str):
            out[key] = "<new id>"
    return out


def _same_boundary(
    acc: AgentConfig,
    full_acc: AgentConfig,
    kwargs: dict[str, Any],
    meta: Callable[[Any], Any],
    seen: Callable[[Any], Any],
) -> tuple[Any, Any]:
    """Run one boundary on ``acc`` (the shortcut may apply) and on ``full_acc`` (the full
    path); assert they agree: meta (through ``meta``), untouched acc on a skip, entries,
    what on_boundary saw (through ``seen``, the ctx compared apart) and log lines."""
    fast, fast_seen, fast_lines = _boundary(acc, **kwargs)
    full, full_seen, full_lines = _boundary(full_acc, **kwargs)
    assert meta(fast.meta) == meta(full.meta)
    assert type(fast.meta) is type(full.meta)
    if not fast.meta["compacted"]:
        assert fast.acc is acc and full.acc is full_acc
    entries = [[(e.role, e.content) for e in r.acc.memory.entries()] for r in (fast, full)]
    assert entries[0] == entries[1]
    assert [seen(s) for s in fast_seen] == [seen(s) for s in full_seen]
    # equal ctx (each config has its own counter object: compared by what it counts with)
    assert [_ctx_fields(s[7]) for s in fast_seen] == [_ctx_fields(s[7]) for s in full_seen]
    assert fast_lines == full_lines
    return fast, full


def _ctx_fields(ctx: CompactionContext | None) -> Any:
    if ctx is None:
        return None
    fields = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)}
    counter = fields.pop("counter")
    return (fields, counter.name, counter.model, counter.calibration)


def _without_threshold(acc: AgentConfig) -> AgentConfig:
    """A copy of ``acc`` (its memory copied) whose prepared compactor declares no
    threshold, so every boundary calls it; ``acc`` keeps its own."""
    full = acc.replace(memory=acc.memory.copy())
    full._derived.prepared = dataclasses.replace(full.prepared, thresholds=(None, None))
    return full


def _boundary(acc: AgentConfig, **kwargs: Any) -> tuple[Any, list[Any], list[Any]]:
    """Run one boundary; its result, what on_boundary saw and the boundary's log lines."""
    recorder, lines = _Recorder(), _Lines()
    name = register_hook(recorder, name="threshold-recorder")
    logger = logging.getLogger("normandy_core.boundary")
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    FAULT_FLOOD.reset()  # both paths' failure lines logged, not the second held back
    try:
        result = run_compaction(acc, **kwargs)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
        unregister_hook(name)
    return result, recorder.seen, lines.lines


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    script=well_formed_conversations(),
    ratio=_RATIOS,
    schedule=_SCHEDULES,
    spec=st.sampled_from(["cl100k_base", "estimate", "conservative"]),
    factor=st.sampled_from([None, 1.0, 1.17]),
    system=st.sampled_from(["", "You are terse. " * 20]),
    mid_round=st.booleans(),
    turn_id=st.sampled_from([None, "t1"]),
    timeout=st.sampled_from([None, 30.0]),
)
def test_the_declared_threshold_gives_the_full_paths_result(
    script, ratio, schedule, spec, factor, system, mid_round, turn_id, timeout
):
    """window_manager declares its skip level (compaction_threshold); a boundary at or
    below it returns without calling the compactor. Over generated sessions sized around
    the level, under both schedules, calibrated or not, with and without a time limit,
    the fast path gives what calling the compactor gives: the same outcome, ``acc`` and
    meta, the same on_boundary report and the same log line."""
    memory = build(script)
    calibration = Calibration()
    if factor is not None:
        calibration.observe("gpt-4o", get_counter(spec).name, 1_000, round(1_000 * factor))
    opts: dict[str, Any] = {"counter": spec, "reserved_tokens": 100, **schedule}
    probe = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={**opts, "context_window": 10**9},
        system_prompt=system,
    )
    ctx = build_context(probe, mid_round=mid_round, turn_id=turn_id, calibration=calibration)
    size = ctx.counter.memory_tokens(memory) + ctx.prompt_tokens
    share = 1.0 if mid_round else schedule.get("trigger", 1.0)
    if schedule.get("schedule") == "cost" and not mid_round:
        share = schedule.get("target", 0.25)
    elif schedule.get("round_aware", True) and not mid_round:
        # round-aware: a turn start may compact from 1 - round_max of the usable window
        share = min(share, 1.0 - schedule.get("round_max", 0.5))
    window = 100 + max(int(size * ratio / share), ctx.prompt_tokens + 1)
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={**opts, "context_window": window},
        system_prompt=system,
        compaction_timeout=timeout,
        memory=memory.copy(),
    )
    assert acc.prepared.thresholds[mid_round] is not None
    full_acc = _without_threshold(acc)
    kwargs = {"mid_round": mid_round, "turn_id": turn_id, "calibration": calibration}
    _, full = _same_boundary(acc, full_acc, kwargs, _comparable, lambda s: s[:7] + s[8:])
    event("compacted" if full.meta["compacted"] else "skipped")
    # the input is never touched, on either path
    assert [e.id for e in acc.memory.entries()] == [e.id for e in memory.entries()]


class _Declares:
    """A compactor in code that declares ``level`` and counts its maybe_compact calls."""

    def __init__(self, level: object) -> None:
        self.level = level
        self.calls = 0

    @hookimpl
    def needs_window(self, opts: Any) -> bool:
        return False

    @hookimpl
    def compaction_threshold(self, opts: Any, window: Any, mid_round: bool) -> Any:
        if isinstance(self.level, BaseException):
            raise self.level
        return self.level

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
        self.calls += 1
        return acc, {"compacted": False}


def _declared(level: object, n: int = 6) -> tuple[_Declares, AgentConfig]:
    plugin = _Declares(level)
    register_compactor("declares", plugin, replace=True)
    memory = AgentMemory()
    for i in range(n):
        memory.add_message("user" if i % 2 == 0 else "assistant", f"message {i} " + "x" * 40)
    acc = AgentConfig(model="gpt-4o", compactor="declares").with_memory(memory)
    return plugin, acc


def test_a_boundary_at_or_below_the_level_does_not_call_the_compactor():
    """At or below the declared level the compactor is not called; one token over, it is."""
    plugin, acc = _declared(0)
    ctx = build_context(acc, mid_round=False)
    size = ctx.counter.memory_tokens(acc.memory) + ctx.prompt_tokens
    for level, called in ((size + 1, 0), (size, 0), (size - 1, 1), (-1, 1)):
        plugin.level = level
        acc = acc.replace(entry="test")  # prepared again: the hook is asked again
        plugin.calls = 0
        result = run_compaction(acc, mid_round=False)
        assert result.meta is _SKIP and result.acc is acc
        assert plugin.calls == called, level


@pytest.mark.parametrize(
    ("level", "said"),
    [
        (RuntimeError("no level today"), "raised RuntimeError: no level today"),
        (SystemExit(3), "raised SystemExit: 3"),
        ("5", "returned '5', not an int or None"),
        (True, "returned True, not an int or None"),
    ],
)
def test_a_failing_threshold_hook_is_logged_and_every_boundary_calls(level, said, caplog):
    """A hook that raises (SystemExit included) or returns no int does not stop the
    config: it is logged naming the compactor, and every boundary calls maybe_compact."""
    with caplog.at_level(logging.ERROR, logger="normandy_core.plugins"):
        plugin, acc = _declared(level)
    assert acc.prepared.thresholds == (None, None)
    assert "compaction_threshold of compactor 'declares'" in caplog.text
    assert said in caplog.text
    run_compaction(acc, mid_round=False)
    run_compaction(acc, mid_round=True)
    assert plugin.calls == 2


def test_the_kit_fails_a_compactor_that_breaks_its_declared_level():
    """A compactor that compacts at or below the level it declared fails check_call."""

    class Liar(_Declares):
        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
            return acc, {"compacted": False, "strategy": "waited"}

    register_compactor("liar", Liar(10**9), replace=True)
    acc = AgentConfig(model="gpt-4o", compactor="liar").with_memory(_acc().memory)
    with pytest.raises(AssertionError, match="compaction_threshold"):
        check_call("liar", acc)


_BOUNDARIES = st.lists(
    st.tuples(
        st.lists(st.sampled_from(["", "hello", "a longer message " * 8, "x" * 300]), max_size=3),
        st.booleans(),  # mid_round
        st.sampled_from([None, "t1", "t2"]),  # turn_id
        st.sampled_from([0, 1, 2]),  # calibration: None, the plain one, one with evidence
        st.booleans(),  # whether the calibration gets new evidence first
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    script=well_formed_conversations(),
    boundaries=_BOUNDARIES,
    ratio=_RATIOS,
    spec=st.sampled_from(["cl100k_base", "estimate"]),
    timeout=st.sampled_from([None, 30.0]),
)
def test_a_run_of_boundaries_around_the_threshold_gives_the_full_paths_result(
    script, boundaries, ratio, spec, timeout
):
    """A run of boundaries on one agent (appends between them, the turn and kind and
    calibration changing, evidence arriving): where run_compaction takes the written-out
    shortcut (the last ctx of its kind reused, memory_tokens inline), the shortcut says
    exactly what build_context and memory_tokens say, and every boundary gives what the
    compactor's own call gives: the same meta, acc, on_boundary report and log line."""
    memory = build(script)
    cals = [None, Calibration(), Calibration()]
    name = get_counter(spec).name
    cals[2].observe("gpt-4o", name, 1_000, 1_170)  # type: ignore[union-attr]
    opts: dict[str, Any] = {"counter": spec, "reserved_tokens": 100}
    probe = AgentConfig(
        model="gpt-4o", compactor="window_manager", compactor_opts={**opts, "context_window": 10**9}
    )
    ctx = build_context(probe, mid_round=False)
    size = ctx.counter.memory_tokens(memory) + ctx.prompt_tokens
    window = 100 + max(int(size * ratio) + 200, ctx.prompt_tokens + 1)
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={**opts, "context_window": window},
        compaction_timeout=timeout,
        memory=memory.copy(),
    )
    full_acc = _without_threshold(acc)
    for b, (texts, mid_round, turn_id, cal, evidence) in enumerate(boundaries):
        for n, text in enumerate(texts):
            role = "user" if n % 2 == 0 else "assistant"
            acc.memory.add_message(role, text, id=f"b{b}-{n}")  # the same ids on both sides
            full_acc.memory.add_message(role, text, id=f"b{b}-{n}")
        calibration = cals[cal]
        if evidence and calibration is not None:
            calibration.observe("gpt-4o", name, 1_000, 1_050 + 100 * cal)
        level = acc.prepared.thresholds[mid_round]
        built = build_context(acc, mid_round=mid_round, turn_id=turn_id, calibration=calibration)
        if level is not None and built.counter.at_most(acc.memory, level - built.prompt_tokens):
            event("at or below the declared threshold")
        else:
            event("over the declared threshold")
        kwargs = {"mid_round": mid_round, "turn_id": turn_id, "calibration": calibration}
        # entries a compaction inserted have new ids on each side: compared by content
        fast, full = _same_boundary(
            acc, full_acc, kwargs, _by_content, lambda s: (*s[:7], _without_ids(s[8]), *s[9:])
        )
        acc, full_acc = fast.acc, full.acc


def _without_ids(seen: dict[str, Any]) -> dict[str, Any]:
    """What ``_Recorder`` kept of a meta, the dropped entries counted, not named by id."""
    return {k: len(v) if k == "dropped" else v for k, v in seen.items()}


def _by_content(meta: Any) -> dict[str, Any]:
    """``_comparable(meta)`` with the dropped entries as roles and contents."""
    out = _comparable(meta)
    if "dropped" in out:
        out["dropped"] = [(e.role, e.content) for e in meta["dropped"]]
    return out


def test_a_boundary_at_or_below_the_declared_threshold_never_calls_the_compactor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whether the counter is exact yet or still bounds, at a kind's first boundary of a
    turn and at a repeated one, a boundary at or below the threshold skips without the
    compactor's call, with the ctx build_context gives; one over it calls it."""
    memory = AgentMemory()
    for i in range(6):
        memory.add_message("user" if i % 2 == 0 else "assistant", f"message {i}")
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={"counter": "cl100k_base", "context_window": 10**6},
        memory=memory,
    )
    comp = acc.prepared.compactor
    calls: list[Any] = []
    call = comp.maybe_compact
    monkeypatch.setattr(comp, "maybe_compact", lambda *a: calls.append(a) or call(*a))
    seen: list[Any] = []
    recorder = _Recorder()
    name = register_hook(recorder, name="threshold-calls")
    try:
        for turn in ("t0", "t1"):
            for mid_round in (False, True, True):
                result = run_compaction(acc, mid_round=mid_round, turn_id=turn)
                assert result.meta is _SKIP and result.acc is acc
                ctx = build_context(acc, mid_round=mid_round, turn_id=turn)
                seen.append(recorder.seen[-1][7] is ctx)
        assert calls == []
        assert all(seen)
        small = acc.replace(compactor_opts={"counter": "cl100k_base", "context_window": 8_000})
        comp = small.prepared.compactor
        monkeypatch.setattr(comp, "maybe_compact", lambda *a: calls.append(a) or call(*a))
        for i in range(40):
            small.memory.add_message("user", f"a longer message number {i} " * 60)
        run_compaction(small, mid_round=False, turn_id="t2")
        assert len(calls) == 1
    finally:
        unregister_hook(name)


_CALIBRATION_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("observe"),
            st.sampled_from(["gpt-4o", "claude"]),
            st.sampled_from(["tiktoken:cl100k_base", "estimate"]),
            st.integers(0, 3_000),
            st.integers(0, 4_000),
        ),
        st.tuples(st.just("reset"), st.sampled_from([None, "gpt-4o", "claude"])),
        st.tuples(
            st.just("snapshot"),
            st.sampled_from([None, "gpt-4o", "claude"]),
            st.sampled_from(["tiktoken:cl100k_base", "estimate"]),
        ),
    ),
    max_size=30,
)


@settings(max_examples=EXAMPLES)
@given(ops=_CALIBRATION_OPS)
def test_a_kept_calibration_snapshot_equals_one_made_afresh(ops):
    """The turn shells snapshot the calibration at every boundary; the snapshot kept
    until evidence arrives or is reset is always what making it afresh gives, and each
    call returns dicts of its own (changing one changes no later snapshot)."""
    cal = Calibration(window=3)
    for op in ops:
        if op[0] == "observe":
            cal.observe(op[1], op[2], op[3], op[4])
        elif op[0] == "reset":
            cal.reset(op[1])
        else:
            snap = cal.snapshot(op[1], op[2])
            assert snap == cal._snapshot(op[1], op[2])[1]
            again = cal.snapshot(op[1], op[2])
            assert again == snap and again is not snap
            assert again["recent_ratios"] is not snap["recent_ratios"]
            snap["recent_ratios"].append(99.0)
            snap["factor"] = -1
            assert cal.snapshot(op[1], op[2]) == again

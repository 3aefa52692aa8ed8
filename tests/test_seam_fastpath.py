"""The boundary's shortcuts give the verdicts of the full paths they stand in for.

A boundary that does not compact takes shortcuts (issue 11's timing targets): the plain
skip result is accepted without the full check, ``ctx`` is reused without looking up
the counter, the ``on_boundary`` selection is kept while the hook plugins stay the same,
and the turn loop's provider-compaction check looks only at new entries. Each property
here compares a shortcut with the full computation over generated inputs.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from normandy_core import (
    AgentConfig,
    AgentMemory,
    Calibration,
    CompactionMeta,
    SurvivalRules,
    hookimpl,
    register_hook,
    run_compaction,
    unregister_hook,
)
from normandy_core import boundary as boundary_module
from normandy_core.contract import (
    CompactionContext,
    ContractViolation,
    _check,
    build_context,
    call_compactor,
    check_compaction,
)
from normandy_core.plugins import hook_manager
from normandy_core.transcript import PROVIDER_COMPACTION
from strategies import build, conversations

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
            fresh = boundary_module._selected("on_boundary", gated=True)
            kept = boundary_module._observers()
            assert [i for i, _ in kept] == [i for i, _ in fresh]
            seen = gated.seen, always.seen
            run_compaction(acc, mid_round=False)
            plugins = {i.plugin for i, _ in fresh}
            assert gated.seen == seen[0] + (gated in plugins)
            assert always.seen == seen[1] + (always in plugins)
    finally:
        for qname in registered:
            unregister_hook(qname)


def _marked(memory: AgentMemory) -> bool:
    return any(e.metadata.get(PROVIDER_COMPACTION) for e in memory)


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
                metadata={PROVIDER_COMPACTION: True} if op == "mark" else {},
            )
        elif op == "fork":
            entries = memory.entries()
            memory = memory.fork(entries[len(entries) // 2].id if entries else None)
        elif op == "copy":
            memory = memory.copy()
        elif op == "derive":
            memory = memory.derive(memory.entries()[1:])
        assert memory.any_marked(PROVIDER_COMPACTION) == _marked(memory)
    assert memory.any_marked(PROVIDER_COMPACTION) == _marked(memory)

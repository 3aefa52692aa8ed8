"""run_compaction: a misbehaving compactor or hook never breaks the turn or touches acc."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    hookimpl,
    register_compactor,
    register_hook,
    run_compaction,
)


def _conversation(acc: AgentConfig, n: int = 6) -> AgentConfig:
    for i in range(n):
        acc.memory.add_message("user" if i % 2 == 0 else "assistant", f"message {i}", id=f"m{i}")
    return acc


class _Fn:
    """A compactor plugin whose maybe_compact is the given function; needs no window."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    @hookimpl
    def needs_window(self, opts: dict[str, Any]) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
        return self.fn(acc, ctx, opts)


def _acc_with(fn: Any, name: str = "probe") -> AgentConfig:
    register_compactor(name, _Fn(fn))
    # The toy compactors drop the oldest entries, the task among them: its rule is off.
    return _conversation(AgentConfig(compactor=name, survival={"keep_first_user": False}))


def _drop_first(k: int, **extra: Any) -> Any:
    def fn(acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
        entries = acc.memory.entries()
        meta = {"compacted": True, "dropped": entries[:k], **extra}
        return acc.with_memory(acc.memory.derive(entries[k:])), meta

    return fn


def _raise(acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
    raise RuntimeError("kaboom")


def _append_then_skip(acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
    acc.memory.add_message("assistant", "sneaky")
    return acc, {"compacted": False}


def _append_then_raise(acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
    acc.memory.add_message("assistant", "sneaky")
    acc.memory.add_message("user", "sneakier")
    raise ValueError("after appending")


def _append_then_compact(acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
    acc.memory.add_message("assistant", "sneaky")
    entries = acc.memory.entries()
    return acc.with_memory(AgentMemory.from_entries(entries[3:])), {
        "compacted": True,
        "dropped": entries[:3],
    }


def _returns(value: Any) -> Any:
    return lambda acc, ctx, opts: value


BAD = {
    "raises": (_raise, "raised RuntimeError: kaboom"),
    "returns None": (_returns(None), "returned NoneType, not (acc, meta)"),
    "returns a list": (lambda a, c, o: [a, {"compacted": False}], "not (acc, meta)"),
    "returns a 3-tuple": (lambda a, c, o: (a, {"compacted": False}, 1), "not (acc, meta)"),
    "swapped": (lambda a, c, o: ({"compacted": False}, a), "returned acc of type dict"),
    "meta not a dict": (lambda a, c, o: (a, [("compacted", False)]), "boolean 'compacted'"),
    "meta without compacted": (lambda a, c, o: (a, {"strategy": "x"}), "boolean 'compacted'"),
    "compacted not boolean": (lambda a, c, o: (a, {"compacted": 1}), "boolean 'compacted'"),
    "compacted a string": (lambda a, c, o: (a, {"compacted": "yes"}), "boolean 'compacted'"),
    "dropped not a list": (_drop_first(2, dropped="m0"), "not a list"),
    "dropped but not compacted": (
        lambda a, c, o: (a, {"compacted": False, "dropped": a.memory.entries()[:1]}),
        "dropped entries with compacted=False",
    ),
    "error while compacted": (
        lambda a, c, o: (a, {"compacted": True, "error": "half done"}),
        "reported an error while compacted=True",
    ),
    "appends, then skips": (_append_then_skip, "mutated the memory it was given (restored)"),
    "appends, then raises": (_append_then_raise, "raised ValueError: after appending"),
    "appends, then compacts": (_append_then_compact, "mutated the memory it was given"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_misbehaving_compactor_becomes_the_error_path_with_acc_untouched(case, caplog):
    fn, expected = BAD[case]
    calls: list[Any] = []

    class Hook:
        @hookimpl
        def after_compact(self, acc, ctx, meta):
            calls.append(meta)

    register_hook(Hook(), name="spy")
    acc = _acc_with(fn)
    memory = acc.memory
    before = memory.dump()
    before_entries = memory.entries()
    with caplog.at_level(logging.WARNING, logger="normandy_core.boundary"):
        out, meta = run_compaction(acc, mid_round=False)
    assert out is acc
    assert acc.memory is memory
    assert memory.dump() == before
    assert memory.entries() == before_entries
    assert len(memory) == 6
    assert set(meta) == {"compacted", "error"}
    assert meta["compacted"] is False
    assert expected in meta["error"]
    assert meta["error"].startswith("compactor 'probe' (group normandy_core.compactors)")
    assert calls == []  # no after_compact on the error path
    # a failed compaction is a warning (the turn goes on with its conversation), once
    (record,) = [r for r in caplog.records if expected in r.getMessage()]
    assert record.levelno == logging.WARNING
    # The restored memory is fully usable: appends and token totals behave.
    memory.add_message("user", "next")
    assert [e.id for e in memory][:6] == [f"m{i}" for i in range(6)]


def test_compactor_error_path_is_passed_through_without_dropped():
    acc = _acc_with(
        lambda a, c, o: (a, {"compacted": False, "error": "too busy", "dropped": []}),
    )
    out, meta = run_compaction(acc, mid_round=True)
    assert out is acc
    assert meta == {"compacted": False, "error": "too busy"}


def test_error_path_returns_the_callers_acc_even_when_the_compactor_returned_another():
    acc = _acc_with(
        lambda a, c, o: (
            a.with_memory(AgentMemory()),
            {"compacted": False, "error": "gave up"},
        ),
    )
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc
    assert len(out.memory) == 6
    assert meta == {"compacted": False, "error": "gave up"}


def test_replacing_the_memory_of_the_given_config_is_refused_and_undone():
    def swap(acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
        object.__setattr__(acc, "memory", AgentMemory())
        return acc, {"compacted": False}

    acc = _acc_with(swap)
    memory = acc.memory
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc
    assert acc.memory is memory
    assert "replaced the memory" in meta["error"]


def test_a_config_keeps_the_compactor_it_was_prepared_with():
    """The compactor is resolved once, where the config is made: unregistering the name
    later changes new configs, not this one (its boundary still calls it)."""
    register_compactor("gone", _Fn(_raise))
    acc = _conversation(AgentConfig(compactor="gone"))
    from normandy_core import UnknownCompactorError, unregister_compactor

    unregister_compactor("gone")
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc
    assert meta["compacted"] is False
    assert "compactor 'gone'" in meta["error"] and "kaboom" in meta["error"]
    with pytest.raises(UnknownCompactorError, match="unknown compactor 'gone'"):
        AgentConfig(compactor="gone")


class _Recorder:
    def __init__(self, log: list[tuple[str, Any]], tag: str) -> None:
        self.log = log
        self.tag = tag

    @hookimpl
    def after_compact(self, acc: AgentConfig, ctx: Any, meta: dict[str, Any]) -> None:
        self.log.append((self.tag, [e.id for e in meta["dropped"]]))


class _Raiser:
    @hookimpl
    def after_compact(self, acc: AgentConfig, ctx: Any, meta: dict[str, Any]) -> None:
        raise OSError("archive is read-only")


def test_after_compact_runs_when_dropped_is_non_empty():
    log: list[tuple[str, Any]] = []
    register_hook(_Recorder(log, "a"), name="a")
    register_hook(_Recorder(log, "b"), name="b")
    acc = _acc_with(_drop_first(2, strategy="probe"))
    out, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] is True
    assert [e.id for e in out.memory] == ["m2", "m3", "m4", "m5"]
    assert [e.id for e in acc.memory] == [f"m{i}" for i in range(6)]
    assert sorted(log) == [("a", ["m0", "m1"]), ("b", ["m0", "m1"])]
    assert "hook_errors" not in meta


@pytest.mark.parametrize(
    "fn",
    [
        _returns(None),  # error path
        lambda a, c, o: (a, {"compacted": False}),  # skip path
        lambda a, c, o: (a, {"compacted": True}),  # compacted, dropped absent
        lambda a, c, o: (a, {"compacted": True, "dropped": []}),  # compacted, dropped empty
    ],
    ids=["error", "skip", "no-dropped", "empty-dropped"],
)
def test_after_compact_does_not_run_without_dropped_entries(fn):
    log: list[tuple[str, Any]] = []
    register_hook(_Recorder(log, "a"), name="a")
    run_compaction(_acc_with(fn), mid_round=True)
    assert log == []


@pytest.mark.parametrize("raiser_first", [True, False])
def test_a_raising_hook_lands_in_hook_errors_and_the_others_still_run(raiser_first, caplog):
    log: list[tuple[str, Any]] = []
    hooks = [("raiser", _Raiser()), ("recorder", _Recorder(log, "r"))]
    if not raiser_first:
        hooks.reverse()
    for name, hook in hooks:
        register_hook(hook, name=name)
    acc = _acc_with(_drop_first(2))
    with caplog.at_level(logging.ERROR, logger="normandy_core.boundary"):
        out, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] is True
    assert [e.id for e in out.memory] == ["m2", "m3", "m4", "m5"]
    assert log == [("r", ["m0", "m1"])]
    assert meta["hook_errors"] == [
        {
            "hook": "code:raiser",
            "plugin": "hook plugin 'code:raiser' (<registered in code>)",
            "error": "OSError: archive is read-only",
        },
    ]
    assert any("archive is read-only" in r.getMessage() for r in caplog.records)


def test_hooks_registered_in_code_are_validated_and_can_be_removed():
    from normandy_core import PluginLoadError, unregister_hook

    class Wrong:
        @hookimpl
        def after_compact(self, acc, ctx, meta, extra):
            raise AssertionError("never called")

    with pytest.raises(PluginLoadError, match="after_compact"):
        register_hook(Wrong(), name="wrong")

    log: list[tuple[str, Any]] = []
    qname = register_hook(_Recorder(log, "x"), name="x")
    assert qname == "code:x"
    with pytest.raises(ValueError, match="already registered"):
        register_hook(_Recorder(log, "y"), name="x")
    unregister_hook(qname)
    run_compaction(_acc_with(_drop_first(2)), mid_round=False)
    assert log == []


def test_a_hook_with_fewer_arguments_gets_the_ones_it_names():
    seen: list[Any] = []

    class Lean:
        @hookimpl
        def after_compact(self, meta):
            seen.append(meta["compacted"])

    register_hook(Lean(), name="lean")
    run_compaction(_acc_with(_drop_first(2)), mid_round=False)
    assert seen == [True]


def test_code_hooks_survive_reload_plugins():
    from normandy_core import reload_plugins

    log: list[tuple[str, Any]] = []
    register_hook(_Recorder(log, "kept"), name="kept")
    reload_plugins()
    run_compaction(_acc_with(_drop_first(2)), mid_round=False)
    assert log == [("kept", ["m0", "m1"])]


def _reporting(make_dropped: Any, keep_from: int = 2) -> Any:
    """A compactor keeping entries[keep_from:] and reporting make_dropped(entries)."""

    def fn(acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
        entries = acc.memory.entries()
        kept = acc.memory.derive(entries[keep_from:])
        return acc.with_memory(kept), {"compacted": True, "dropped": make_dropped(entries)}

    return fn


BAD_DROPPED = {
    "ids instead of entries": (lambda es: [e.id for e in es[:2]], "not an Entry"),
    "an entry it never had": (
        lambda es: [es[0], es[1].model_copy(update={"id": "ghost"})],
        "'ghost', which is not on the active branch it was given",
    ),
    "an entry it kept": (lambda es: [es[0], es[1], es[2]], "'m2', which it kept"),
    "newest first": (lambda es: [es[1], es[0]], "not oldest first"),
    "twice": (lambda es: [es[0], es[0], es[1]], "not oldest first"),
    "other content": (
        lambda es: [es[0], es[1].model_copy(update={"content": "rewritten"})],
        "'m1' with content other than it had",
    ),
}


@pytest.mark.parametrize("case", list(BAD_DROPPED))
def test_dropped_must_report_the_removed_entries_as_they_were(case):
    make, expected = BAD_DROPPED[case]
    log: list[tuple[str, Any]] = []
    register_hook(_Recorder(log, "a"), name="a")
    acc = _acc_with(_reporting(make))
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc
    assert set(meta) == {"compacted", "error"}
    assert expected in meta["error"]
    assert log == []


def test_dropped_may_be_a_subset_of_what_was_removed_in_order():
    # A summarising compactor replaces entries; it reports the ones it removed.
    def summarise(acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
        entries = acc.memory.entries()
        new = AgentMemory()
        new.add_message("user", "summary of m0..m2", id="summary")
        for e in entries[3:]:
            new.add_message(e.role, e.content, id=e.id)
        return acc.with_memory(new), {"compacted": True, "dropped": entries[:3]}

    out, meta = run_compaction(_acc_with(summarise), mid_round=False)
    assert "error" not in meta
    assert [e.id for e in meta["dropped"]] == ["m0", "m1", "m2"]
    assert [e.id for e in out.memory] == ["summary", "m3", "m4", "m5"]

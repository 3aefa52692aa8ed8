"""The contract seam (issue 11): one check, hooks apart, prepared configs, contained faults.

Each test reproduces a hole the seam closes: it failed on the code before the seam.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from reliability_counts import (
    BASE_EXCEPTIONS,
    MUTATED_DROPPED,
    READER_APPENDS,
    READER_THREADS,
    SEAM_VERDICTS,
)

from normandy_core import (
    AgentConfig,
    AgentMemory,
    Calibration,
    CompactionMeta,
    OptionsError,
    abandoned_threads,
    check_compaction,
    compact,
    default_counter_for,
    get_counter,
    hookimpl,
    register_compactor,
    register_hook,
    run_compaction,
)
from normandy_core.contract.faults import MAX_ABANDONED
from normandy_core.contract.types import ContractViolation
from normandy_core.testing import check_call, context_for


def _memory(n: int, size: int = 40) -> AgentMemory:
    mem = AgentMemory()
    for i in range(n):
        mem.add_message("user" if i % 2 == 0 else "assistant", f"message {i} " + "x" * size)
    return mem


class _Probe:
    """A compactor in code whose ``maybe_compact`` is the function given."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    @hookimpl
    def needs_window(self, opts: Any) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
        return self.fn(acc, ctx, opts)


def _acc(fn: Any, n: int = 41, **kw: Any) -> AgentConfig:
    register_compactor("probe", _Probe(fn), replace=True)
    # The toy compactors drop the oldest entries, the task among them: its rule is off.
    kw.setdefault("survival", {"keep_first_user": False})
    return AgentConfig(model="gpt-4o", compactor="probe", **kw).with_memory(_memory(n))


# -- one check, everywhere -----------------------------------------------------------


def test_silent_drop_without_dropped_is_refused():
    """38 of 41 messages gone, no 'dropped': the error path, the memory kept."""

    def cut(acc, ctx, opts):
        return acc.with_memory(acc.memory.derive(acc.memory.entries()[-3:])), {"compacted": True}

    acc = _acc(cut)
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc and len(out.memory) == 41
    assert "without reporting them in 'dropped' (lost silently)" in meta["error"]
    assert "38 entries" in meta["error"]


def test_listing_a_kept_unchanged_entry_is_refused_by_kit_and_boundary_alike():
    def over_report(acc, ctx, opts):
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[1:])), {
            "compacted": True,
            "dropped": entries[:2],
        }

    acc = _acc(over_report)
    _, meta = run_compaction(acc, mid_round=False)
    assert "which it kept unchanged" in meta["error"]
    with pytest.raises(AssertionError, match="which it kept unchanged"):
        check_call("probe", acc, context_for(acc, mid_round=False))


def test_skip_path_with_a_changed_config_is_refused():
    acc = _acc(lambda a, c, o: (a.replace(system_prompt="hijacked"), {"compacted": False}))
    _, meta = run_compaction(acc, mid_round=False)
    assert "changed the config's 'system_prompt'" in meta["error"]


_ACTIONS = st.lists(
    st.sampled_from(
        ["keep", "drop_listed", "drop_silent", "rewrite_listed", "rewrite_silent", "keep_listed"]
    ),
    min_size=6,
    max_size=6,
)


@settings(max_examples=SEAM_VERDICTS)
@given(actions=_ACTIONS, compacted=st.booleans(), reorder=st.booleans())
def test_kit_and_boundary_give_the_same_verdict(actions, compacted, reorder):
    """Over generated results, the kit fails exactly when the boundary takes the error path,
    with the same message."""

    def result(acc, ctx, opts):
        entries = acc.memory.entries()
        kept, listed = [], []
        for e, action in zip(entries, actions, strict=True):
            if action.startswith("keep"):
                kept.append(e)
            elif action.startswith("rewrite"):
                kept.append(e.model_copy(update={"content": "rewritten"}))
            if action.endswith("listed"):
                listed.append(e)
        if reorder:
            listed.reverse()
        meta: dict[str, Any] = {"compacted": compacted}
        if listed:
            meta["dropped"] = listed
        return acc.with_memory(acc.memory.derive(kept)), meta

    acc = _acc(result, n=6)
    _, meta = run_compaction(acc, mid_round=False)
    verdict: str | None = None
    try:
        check_call("probe", acc, context_for(acc, mid_round=False))
    except AssertionError as exc:
        verdict = str(exc)
    if verdict is None:
        assert meta.error is None
    else:
        assert meta.error is not None and meta.error in verdict


def test_check_compaction_names_the_compactor():
    acc = _acc(lambda a, c, o: (a, {"compacted": False}))
    with pytest.raises(ContractViolation, match=r"^compactor 'probe'"):
        check_compaction(acc.compactor_handle, acc, context_for(acc, mid_round=False), (acc,))


def test_a_kept_history_starting_with_an_assistant_message_is_refused():
    def cut(acc, ctx, opts):
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[1:])), {
            "compacted": True,
            "dropped": entries[:1],
        }

    _, meta = run_compaction(_acc(cut), mid_round=False)
    assert "starts with an assistant message" in meta["error"]


# -- hooks get a read-only meta ------------------------------------------------------


def test_a_hook_cannot_change_what_the_next_hook_receives():
    seen: list[int] = []

    class Recorder:
        @hookimpl
        def after_compact(self, acc, ctx, meta):
            seen.append(len(meta["dropped"]))

    class Mutator:
        @hookimpl
        def after_compact(self, acc, ctx, meta):
            meta["dropped"].clear()

    register_hook(Recorder(), name="recorder")
    register_hook(Mutator(), name="mutator")  # registered last: runs first

    def drop(acc, ctx, opts):
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[MUTATED_DROPPED:])), {
            "compacted": True,
            "dropped": entries[:MUTATED_DROPPED],
        }

    register_compactor("probe", _Probe(drop), replace=True)
    acc = AgentConfig(compactor="probe", survival={"keep_first_user": False})
    acc = acc.with_memory(_memory(MUTATED_DROPPED + 10))
    _, meta = run_compaction(acc, mid_round=False)
    assert seen == [MUTATED_DROPPED]
    assert isinstance(meta, CompactionMeta)
    assert isinstance(meta["dropped"], tuple) and len(meta["dropped"]) == MUTATED_DROPPED
    assert [e["hook"] for e in meta["hook_errors"]] == ["code:mutator"]
    with pytest.raises(TypeError, match="read-only"):
        meta["compacted"] = False  # type: ignore[index]


def test_hook_calls_go_through_pluggy_monitoring():
    from normandy_core import hook_manager

    calls: list[str] = []

    class Hook:
        @hookimpl
        def after_compact(self, acc, ctx, meta):
            pass

    register_hook(Hook(), name="monitored")
    undo = hook_manager().add_hookcall_monitoring(
        lambda name, impls, kwargs: calls.append(name), lambda *a: None
    )

    def drop(acc, ctx, opts):
        kept = acc.memory.derive(acc.memory.entries()[2:])
        return acc.with_memory(kept), {"compacted": True, "dropped": acc.memory.entries()[:2]}

    try:
        run_compaction(_acc(drop, n=6), mid_round=False)
    finally:
        undo()
    assert "after_compact" in calls


# -- faults contained ---------------------------------------------------------------


@pytest.mark.parametrize("kind", BASE_EXCEPTIONS)
def test_base_exceptions_mid_compaction_are_contained_and_the_memory_restored(kind):
    exc = {
        "SystemExit": SystemExit(3),
        "KeyboardInterrupt": KeyboardInterrupt("plugin"),
        "GeneratorExit": GeneratorExit(),
    }[kind]

    def bad(acc, ctx, opts):
        acc.memory.add_message("user", "appended before raising")
        raise exc

    acc = _acc(bad, n=5)
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc and len(acc.memory) == 5
    assert f"raised {type(exc).__name__}" in meta["error"]


@pytest.mark.parametrize("where", ["SIG_IGN", "SIG_DFL", "worker thread"])
def test_a_plugins_keyboard_interrupt_where_no_ctrl_c_can_arrive_is_contained(where, monkeypatch):
    """Under an ignored or default SIGINT, or in a worker thread (a compaction timeout), a
    Ctrl-C never raises KeyboardInterrupt there: one raised is the plugin's own."""
    import signal

    def bad(acc, ctx, opts):
        acc.memory.add_message("user", "appended before raising")
        raise KeyboardInterrupt("plugin")

    kw: dict[str, Any] = {}
    if where == "worker thread":
        kw["compaction_timeout"] = 5.0
    else:
        previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, getattr(signal, where))
        monkeypatch.setattr("normandy_core.contract.faults._SIGINTS.seen", 0)
    try:
        acc = _acc(bad, n=5, **kw)
        out, meta = run_compaction(acc, mid_round=False)
    finally:
        if where != "worker thread":
            signal.signal(signal.SIGINT, previous)
    assert out is acc and len(acc.memory) == 5
    assert "raised KeyboardInterrupt" in meta["error"]


@pytest.mark.usefixtures("sigint_raises")  # the runner may ignore SIGINT
def test_a_genuine_ctrl_c_still_stops_the_process_with_the_memory_restored():
    import os
    import signal

    def interrupted(acc, ctx, opts):
        acc.memory.add_message("user", "appended before the user pressed Ctrl-C")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the signal arrives here
        return acc, {"compacted": False}

    acc = _acc(interrupted, n=5)
    with pytest.raises(KeyboardInterrupt):
        run_compaction(acc, mid_round=False)
    assert len(acc.memory) == 5


def test_compaction_timeout_bounds_the_hooks_too():
    class Slow:
        @hookimpl
        def after_compact(self, acc, ctx, meta):
            time.sleep(8)

    register_hook(Slow(), name="slow")

    def drop(acc, ctx, opts):
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[2:])), {
            "compacted": True,
            "dropped": entries[:2],
        }

    acc = _acc(drop, n=6, compaction_timeout=0.5)
    started = time.monotonic()
    out, meta = run_compaction(acc, mid_round=False)
    assert time.monotonic() - started < 2.0
    assert meta.compacted and len(out.memory) == 4
    assert meta["hook_errors"][0]["hook"] == "code:slow"
    assert "abandoned" in meta["hook_errors"][0]["error"]


def test_abandoned_compactor_threads_are_capped_and_counted():
    release = threading.Event()

    def hang(acc, ctx, opts):
        release.wait(30)
        return acc, {"compacted": False}

    acc = _acc(hang, n=4, compaction_timeout=0.01)
    before = threading.active_count()
    try:
        errors = [
            run_compaction(acc, mid_round=True).meta.error or "" for _ in range(3 * MAX_ABANDONED)
        ]
        assert threading.active_count() - before <= MAX_ABANDONED
        assert abandoned_threads() >= MAX_ABANDONED - 1
        assert any("not starting another" in e for e in errors)
        assert all(e for e in errors)
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while abandoned_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert abandoned_threads() == 0


def test_an_abandoned_compactor_never_reaches_the_live_memory_or_its_totals():
    counter = get_counter("cl100k_base")
    stop = threading.Event()

    def keeps_counting(acc, ctx, opts):
        while not stop.is_set():
            acc.memory.tokens(counter)
            acc.memory.add_message("user", "late append from an abandoned compactor")
            time.sleep(0.001)
        return acc, {"compacted": False}

    acc = _acc(keeps_counting, n=10, compaction_timeout=0.05)
    _, meta = run_compaction(acc, mid_round=True)
    assert meta.error is not None and "compaction_timeout" in meta.error
    try:
        for i in range(300):
            acc.memory.add_message("user", f"turn message {i} " * (i % 7 + 1))
            acc.memory.tokens(counter)
    finally:
        stop.set()
    assert len(acc.memory) == 310
    assert acc.memory.tokens(counter) == sum(counter.count_entry(e) for e in acc.memory)


def test_token_totals_are_exact_under_concurrent_readers():
    counter = get_counter("cl100k_base")
    mem = _memory(5)
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            mem.tokens(counter)

    threads = [threading.Thread(target=reader) for _ in range(READER_THREADS)]
    for t in threads:
        t.start()
    try:
        for i in range(READER_APPENDS):
            mem.add_message("user", f"message {i} " * (i % 5 + 1))
            if i % 3 == 0:
                mem.tokens(counter)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert mem.tokens(counter) == sum(counter.count_entry(e) for e in mem)


# -- the count cache stays as large as the live conversation -------------------------


def test_the_count_cache_is_pruned_to_live_entries():
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={"context_window": 6000, "reserved_tokens": 500, "target": 0.5},
    )
    for i in range(1500):
        acc.memory.add_message("user" if i % 2 == 0 else "assistant", f"step {i} " + "y" * 300)
        acc, _ = run_compaction(acc, mid_round=False)
    caches = acc.memory._counts
    live = len(acc.memory)
    assert live < 100
    assert all(len(cache) <= live for cache in caches.values())


# -- configs prepared once ----------------------------------------------------------


def test_a_custom_calibration_reaches_the_compactor():
    seen: list[Any] = []

    def record(acc, ctx, opts):
        seen.append(ctx.counter.calibration)
        return acc, {"compacted": False}

    cal = Calibration()
    acc = _acc(record, n=3)
    run_compaction(acc, mid_round=True, calibration=cal)
    assert seen == [cal]

    mine = Calibration(min_tokens=1)
    # factors are kept per counter name: o200k_base's, or the offline fallback's
    mine.observe("gpt-4o", get_counter(default_counter_for("gpt-4o")).name, 100, 200)
    wm = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={"context_window": 2000, "reserved_tokens": 100},
        calibration=mine,
    ).with_memory(_memory(60, size=200))
    _, meta = run_compaction(wm, mid_round=False)
    assert meta.compacted
    assert meta["calibration"]["factor"] == 2.0


def test_a_window_smaller_than_the_reserve_is_refused_at_config_time():
    with pytest.raises(OptionsError, match=r"^normandy_core.AgentConfig\(\).*reserved_tokens"):
        AgentConfig(compactor="window_manager", compactor_opts={"context_window": 3000})


class _Counted:
    """A compactor without a window recording the entry of every validate_opts call."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    @hookimpl
    def needs_window(self, opts):
        return False

    @hookimpl
    def validate_opts(self, opts, entry):
        self.calls.append((dict(opts), entry))

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        return acc, {"compacted": False}


def test_options_are_validated_once_per_config():
    counted = _Counted()
    register_compactor("counted", counted)
    from normandy_core import compact

    compact([{"role": "user", "content": "hi"}], compactor="counted", opts={"a": 1})
    assert counted.calls == [({"a": 1}, "normandy_core.compact()")]


def test_options_are_validated_once_per_normandy_compact(tmp_path, capsys):
    counted = _Counted()
    register_compactor("counted", counted)
    from normandy_core.app.cli import main

    src = tmp_path / "chat.json"
    src.write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    out = str(tmp_path / "out.json")
    code = main(["compact", str(src), "-o", out, "--compactor", "counted", "--opt", "a=1"])
    assert code == 0, capsys.readouterr().err
    assert counted.calls == [({"a": 1}, "normandy compact")]


def test_the_boundary_computes_the_token_figures():
    def cut(acc, ctx, opts):
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[2:])), {
            "compacted": True,
            "dropped": entries[:2],
            "tokens_before": 1,
            "tokens_after": 1,
            "tokens_removed": 999,
        }

    acc = _acc(cut, n=6)
    _, meta = run_compaction(acc, mid_round=False)
    counter = acc.prepared.counter_for("gpt-4o")
    assert meta.tokens_before == counter.memory_tokens(acc.memory)
    assert meta.tokens_after < meta.tokens_before
    # No turn ids: every entry is the running turn's, so all that was cut counts.
    assert meta.tokens_removed == meta.tokens_before - meta.tokens_after


# -- before_commit: required hooks ---------------------------------------------------


def _cut_two(acc, ctx, opts):
    entries = acc.memory.entries()
    kept = acc.memory.derive(entries[2:])
    return acc.with_memory(kept), {"compacted": True, "dropped": entries[:2]}


def test_a_before_commit_hook_that_raises_refuses_the_compaction():
    seen: list[str] = []

    class Durable:
        @hookimpl
        def before_commit(self, acc, ctx, meta):
            raise OSError("database or disk is full")

    class Notified:
        @hookimpl
        def after_compact(self, acc, ctx, meta):
            seen.append("after")

    register_hook(Notified(), name="notified")
    register_hook(Durable(), name="durable")
    acc = _acc(_cut_two, n=6)
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc and len(acc.memory) == 6 and not meta.compacted
    assert "refused" in meta.error and "code:durable" in meta.error
    assert "database or disk is full" in meta.error
    assert seen == []  # no after_compact for a compaction that did not happen


def test_before_commit_sees_the_checked_meta_and_then_after_compact_runs():
    order: list[tuple[str, int]] = []

    class Durable:
        @hookimpl
        def before_commit(self, acc, ctx, meta):
            order.append(("before", len(meta["dropped"])))

        @hookimpl
        def after_compact(self, acc, ctx, meta):
            order.append(("after", len(meta["dropped"])))

    register_hook(Durable(), name="durable")
    _, meta = run_compaction(_acc(_cut_two, n=6), mid_round=False)
    assert meta.compacted and order == [("before", 2), ("after", 2)]


def test_hooks_return_notes_the_caller_sees_in_meta_and_compact_result():
    class Archiver:
        @hookimpl
        def before_commit(self, acc, ctx, meta):
            return {"where": "/tmp/a", "entries": len(meta["dropped"]), "message": "kept 2"}

        @hookimpl
        def after_compact(self, acc, ctx, meta):
            return None  # nothing to say

    class Chatty:
        @hookimpl
        def after_compact(self, acc, ctx, meta):
            return "a string is not a note"  # ignored

    class Indexer:
        @hookimpl
        def after_compact(self, acc, ctx, meta):
            return {"indexed": True}

    register_hook(Archiver(), name="archiver")
    register_hook(Chatty(), name="chatty")
    register_hook(Indexer(), name="indexer")
    _, meta = run_compaction(_acc(_cut_two, n=6), mid_round=False)
    assert meta.compacted and "hook_errors" not in meta
    ours = [n for n in meta.hook_notes if n["hook"].startswith("code:")]  # the archive's aside
    assert [(n["hook"], n["note"]) for n in ours] == [
        ("code:archiver", {"where": "/tmp/a", "entries": 2, "message": "kept 2"}),
        ("code:indexer", {"indexed": True}),
    ]
    assert ours[0]["plugin"] == "hook plugin 'code:archiver' (<registered in code>)"
    # compact() gives them to its caller; note() finds one by the hook's bare name
    register_compactor("probe", _Probe(_cut_two), replace=True)
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(6)
    ]
    result = compact(messages, compactor="probe", survival={"keep_first_user": False})
    assert result.compacted and result.notes == result.meta.hook_notes
    assert result.note("archiver") == {"where": "/tmp/a", "entries": 2, "message": "kept 2"}
    assert result.note("code:indexer") == {"indexed": True}
    assert result.note("nobody") is None


def test_a_refused_compaction_has_no_notes():
    class Noting:
        @hookimpl
        def before_commit(self, acc, ctx, meta):
            return {"where": "somewhere"}

    class Refusing:
        @hookimpl
        def before_commit(self, acc, ctx, meta):
            raise OSError("disk full")

    register_hook(Refusing(), name="refusing")
    register_hook(Noting(), name="noting")
    _, meta = run_compaction(_acc(_cut_two, n=6), mid_round=False)
    assert not meta.compacted and "hook_notes" not in meta and meta.hook_notes == ()


def test_a_slow_before_commit_past_the_timeout_refuses_the_compaction():
    class Slow:
        @hookimpl
        def before_commit(self, acc, ctx, meta):
            time.sleep(5)

    register_hook(Slow(), name="slow_commit")
    acc = _acc(_cut_two, n=6, compaction_timeout=0.3)
    started = time.monotonic()
    out, meta = run_compaction(acc, mid_round=False)
    assert time.monotonic() - started < 2.0
    assert out is acc and not meta.compacted and "its share of compaction_timeout" in meta.error

"""Every boundary is observable: the ``on_boundary`` hook and the boundary's log lines.

``on_boundary`` fires at every boundary (skipped, compacted, failed in each way) once the
result is final, isolated like the other hooks; the ``normandy_core.boundary`` logger
says DEBUG for a skip, INFO for a compaction and WARNING for a failure, naming the
compactor and its distribution.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from normandy_core import (
    AgentConfig,
    BoundaryInfo,
    TextBlock,
    active_when,
    compact,
    hook_manager,
    hookimpl,
    register_compactor,
    register_hook,
    run_compaction,
)
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.turn import run_turn

LOGGER = "normandy_core.boundary"


class _Fn:
    """A compactor whose maybe_compact is the given function; needs no window."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    @hookimpl
    def needs_window(self, opts: Any) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: AgentConfig, ctx: Any, opts: Any) -> Any:
        return self.fn(acc, ctx, opts)


def _acc(fn: Any, name: str = "probe", **config: Any) -> AgentConfig:
    register_compactor(name, _Fn(fn))
    # The toy compactors drop the oldest entries, the task among them: its rule is off.
    config.setdefault("survival", {"keep_first_user": False})
    acc = AgentConfig(compactor=name, model="gpt-4o", **config)
    for i in range(6):
        acc.memory.add_message("user" if i % 2 == 0 else "assistant", f"message {i}", id=f"m{i}")
    return acc


def _skip(acc: AgentConfig, ctx: Any, opts: Any) -> Any:
    return acc, {"compacted": False}


def _drop_two(acc: AgentConfig, ctx: Any, opts: Any) -> Any:
    entries = acc.memory.entries()
    meta = {"compacted": True, "dropped": entries[:2], "strategy": "cut"}
    return acc.with_memory(acc.memory.derive(entries[2:])), meta


def _report(acc: AgentConfig, ctx: Any, opts: Any) -> Any:
    return acc, {"compacted": False, "error": "cannot fit"}


def _raise(acc: AgentConfig, ctx: Any, opts: Any) -> Any:
    raise RuntimeError("kaboom")


def _break_contract(acc: AgentConfig, ctx: Any, opts: Any) -> Any:
    return acc, {"compacted": "yes"}


class _Observer:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, Any, Any, BoundaryInfo]] = []

    @hookimpl
    def on_boundary(self, acc: AgentConfig, ctx: Any, meta: Any, info: BoundaryInfo) -> None:
        self.seen.append((acc, ctx, meta, info))


def _observe() -> _Observer:
    observer = _Observer()
    register_hook(observer, name="observer")
    return observer


def test_a_skipped_boundary_is_observed_with_the_callers_acc_and_meta():
    observer = _observe()
    acc = _acc(_skip)
    out, meta = run_compaction(acc, mid_round=True, turn_id="t1")
    ((seen_acc, ctx, seen_meta, info),) = observer.seen
    assert seen_acc is out is acc
    assert seen_meta is meta  # exactly what the caller gets
    assert ctx.mid_round is True and ctx.turn_id == "t1" and ctx.model == "gpt-4o"
    assert info.outcome == "skipped" and not info.compacted and not info.failed
    assert info.compactor == "probe"
    assert info.distribution == "<registered in code>" and info.version == "-"
    assert info.plugin == (
        "compactor 'probe' (group normandy_core.compactors) from <registered in code> -"
    )
    assert info.error_type is None
    assert 0 <= info.compactor_start <= info.duration
    assert 0 <= info.compactor_duration <= info.duration
    assert abs(info.start_ns - time.time_ns()) < 60 * 10**9
    with pytest.raises(AttributeError):
        info.outcome = "compacted"  # type: ignore[misc]  # shared by every observer


def test_a_compaction_is_observed_after_its_other_hooks_with_the_final_meta():
    order: list[str] = []

    class Archive:
        @hookimpl
        def before_commit(self, meta: Any) -> dict[str, Any]:
            order.append("before_commit")
            return {"message": "recorded"}

        @hookimpl
        def after_compact(self, meta: Any) -> None:
            order.append("after_compact")

        @hookimpl
        def on_boundary(self, meta: Any, info: BoundaryInfo) -> None:
            order.append(f"on_boundary:{info.outcome}")

    register_hook(Archive(), name="archive_like")
    observer = _observe()
    acc = _acc(_drop_two)
    out, meta = run_compaction(acc, mid_round=False)
    assert order == ["before_commit", "after_compact", "on_boundary:compacted"]
    ((seen_acc, _ctx, seen_meta, info),) = observer.seen
    assert seen_acc is out and out is not acc
    assert seen_meta is meta
    assert [e.id for e in seen_meta["dropped"]] == ["m0", "m1"]
    assert seen_meta["tokens_before"] > seen_meta["tokens_after"]
    assert seen_meta["hook_notes"][0]["note"] == {"message": "recorded"}
    assert info.outcome == "compacted" and info.compacted and info.error_type is None


@pytest.mark.parametrize(
    ("fn", "error_type", "error"),
    [
        (_report, "reported", "cannot fit"),
        (_raise, "RuntimeError", "raised RuntimeError: kaboom"),
        (_break_contract, "contract", "boolean 'compacted'"),
    ],
    ids=["reported", "raised", "contract"],
)
def test_a_failed_boundary_is_observed_with_its_error_type(fn, error_type, error):
    observer = _observe()
    acc = _acc(fn)
    out, meta = run_compaction(acc, mid_round=False)
    ((seen_acc, _ctx, seen_meta, info),) = observer.seen
    assert seen_acc is out is acc and seen_meta is meta
    assert error in meta["error"]
    assert info.outcome == "failed" and info.failed
    assert info.error_type == error_type


def test_a_refused_compaction_is_observed_as_failed_refused():
    class Refuser:
        @hookimpl
        def before_commit(self) -> None:
            raise OSError("disk full")

    register_hook(Refuser(), name="refuser")
    observer = _observe()
    acc = _acc(_drop_two)
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc and "disk full" in meta["error"]
    ((_acc_seen, _ctx, _meta, info),) = observer.seen
    assert info.outcome == "failed" and info.error_type == "refused"


def test_a_boundary_that_ran_out_of_time_is_still_observed():
    release = threading.Event()

    def slow(acc: AgentConfig, ctx: Any, opts: Any) -> Any:
        release.wait(5)
        return acc, {"compacted": False}

    observer = _observe()
    acc = _acc(slow, compaction_timeout=0.05)
    try:
        _out, meta = run_compaction(acc, mid_round=False)
    finally:
        release.set()
    assert "compaction_timeout" in meta["error"]
    ((_acc_seen, _ctx, _meta, info),) = observer.seen
    assert info.outcome == "failed" and info.error_type == "timeout"
    assert info.duration >= 0.05


class _Gated:
    """An observer that is idle while ``on`` is false (its ``active_when`` gate)."""

    def __init__(self, on: bool = False, broken: bool = False) -> None:
        self.on = on
        self.broken = broken
        self.seen: list[BoundaryInfo] = []

    def active(self) -> bool:
        if self.broken:
            raise SystemExit("gate gone")
        return self.on


def _gated(observer: _Gated, name: str) -> _Gated:
    @hookimpl
    @active_when(observer.active)
    def on_boundary(info: BoundaryInfo) -> None:
        observer.seen.append(info)

    plugin = _Plugin()
    plugin.on_boundary = on_boundary  # type: ignore[attr-defined]
    register_hook(plugin, name=name)
    return observer


class _Plugin:
    """A hook plugin whose hooks are set on the instance."""


def _monitor() -> list[str]:
    called: list[str] = []
    undo = hook_manager().add_hookcall_monitoring(
        lambda name, impls, kwargs: called.extend(
            # the observers of these tests (an installed one, otel, may be in use here)
            i.plugin_name
            for i in impls
            if name == "on_boundary" and i.plugin_name.startswith("code:")
        ),
        lambda outcome, name, impls, kwargs: None,
    )
    _undo.append(undo)
    return called


_undo: list[Any] = []


@pytest.fixture(autouse=True)
def _stop_monitoring():
    yield
    while _undo:
        _undo.pop()()


def test_an_idle_observer_is_not_called_until_its_gate_opens():
    gated = _gated(_Gated(on=False), "gated")
    called = _monitor()
    acc = _acc(_skip)
    run_compaction(acc, mid_round=False)
    assert gated.seen == [] and called == []  # not even through pluggy's call path
    gated.on = True
    run_compaction(acc, mid_round=True)
    assert [i.outcome for i in gated.seen] == ["skipped"]
    assert called == ["code:gated"]


def test_an_idle_observer_does_not_keep_the_others_from_being_called():
    idle = _gated(_Gated(on=False), "idle")
    observer = _observe()
    busy = _gated(_Gated(on=True), "busy")
    called = _monitor()
    acc = _acc(_drop_two)
    _out, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] is True
    assert idle.seen == [] and len(observer.seen) == 1
    assert [i.outcome for i in busy.seen] == ["compacted"]
    assert sorted(called) == ["code:busy", "code:observer"]  # each once, the idle one not


def test_a_gate_that_raises_is_logged_and_its_observer_still_called(caplog):
    gated = _gated(_Gated(broken=True), "broken_gate")
    acc = _acc(_skip)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        run_compaction(acc, mid_round=False)
    assert [i.outcome for i in gated.seen] == ["skipped"]
    (record,) = [r for r in caplog.records if "gate" in r.getMessage()]
    assert "hook plugin 'code:broken_gate'" in record.getMessage()
    assert "SystemExit: gate gone" in record.getMessage()


def test_a_raising_observer_changes_nothing_and_the_others_still_run(caplog):
    class Broken:
        @hookimpl
        def on_boundary(self) -> None:
            raise SystemExit("observer gone")

    register_hook(Broken(), name="broken")
    observer = _observe()
    acc = _acc(_drop_two)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        _out, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] is True and "hook_errors" not in meta
    assert len(observer.seen) == 1
    (record,) = [r for r in caplog.records if "on_boundary" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert "hook plugin 'code:broken'" in record.getMessage()
    assert "SystemExit: observer gone" in record.getMessage()


def test_a_slow_observer_is_abandoned_under_compaction_timeout(caplog):
    release = threading.Event()

    class Slow:
        @hookimpl
        def on_boundary(self) -> None:
            release.wait(5)

    register_hook(Slow(), name="slow")
    acc = _acc(_skip, compaction_timeout=0.05)
    t0 = time.perf_counter()
    try:
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            out, meta = run_compaction(acc, mid_round=False)
    finally:
        release.set()
    assert time.perf_counter() - t0 < 2
    assert out is acc and meta == {"compacted": False}
    assert any("on_boundary of hook plugin 'code:slow'" in r.getMessage() for r in caplog.records)


def test_every_boundary_of_compact_is_observed_with_the_real_window_manager():
    observer = _observe()
    msgs = []
    for i in range(30):
        msgs.append({"role": "user", "content": f"question {i} " + "q" * 400})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "a" * 400})
    small = compact(msgs[:2], model="gpt-4o", window=8000, fresh=True)
    big = compact(msgs, model="gpt-4o", window=8000, opts={"reserved_tokens": 500}, fresh=True)
    assert not small.compacted and big.compacted
    outcomes = [info.outcome for *_, info in observer.seen]
    assert outcomes == ["skipped", "compacted"]
    info = observer.seen[-1][3]
    assert info.compactor == "window_manager"
    assert info.distribution == "normandy-window-manager"
    assert observer.seen[-1][2]["tokens_before"] == big.meta["tokens_before"]


def test_every_boundary_of_a_turn_is_observed():
    observer = _observe()
    client = ScriptedClient([ModelReply(content=(TextBlock(text="hello"),))])
    acc = AgentConfig(model="gpt-4o")
    result = run_turn(acc, "hi", client=client)
    boundaries = result.events_of("boundary")
    assert len(observer.seen) == len(boundaries) >= 1
    assert all(info.outcome == "skipped" for *_, info in observer.seen)
    assert all(info.compactor == "noop" for *_, info in observer.seen)
    assert observer.seen[0][3].distribution == "normandy-core"


# -- logging ----------------------------------------------------------------------------


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def test_a_skipped_boundary_is_logged_at_debug_naming_the_compactor(caplog):
    acc = _acc(_skip)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        run_compaction(acc, mid_round=False)
    (record,) = _records(caplog)
    assert record.levelno == logging.DEBUG
    assert "compactor 'probe'" in record.getMessage()
    assert "skipped" in record.getMessage() and "gpt-4o" in record.getMessage()
    assert record.normandy_outcome == "skipped"  # type: ignore[attr-defined]
    assert record.normandy_compactor == "probe"  # type: ignore[attr-defined]


def test_nothing_is_logged_for_a_skip_at_info(caplog):
    acc = _acc(_skip)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        run_compaction(acc, mid_round=False)
    assert _records(caplog) == []


def test_a_compaction_is_logged_at_info_with_tokens_strategy_and_dropped(caplog):
    acc = _acc(_drop_two)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, meta = run_compaction(acc, mid_round=False)
    (record,) = _records(caplog)
    text = record.getMessage()
    assert record.levelno == logging.INFO
    assert text.startswith("compactor 'probe'")
    assert f"{meta['tokens_before']:,} -> {meta['tokens_after']:,} tokens" in text
    assert "strategy cut" in text and "2 entries dropped" in text
    assert record.normandy_tokens_before == meta["tokens_before"]  # type: ignore[attr-defined]
    assert record.normandy_dropped == 2  # type: ignore[attr-defined]


def test_a_real_compaction_names_its_distribution(caplog):
    msgs = []
    for i in range(30):
        msgs.append({"role": "user", "content": f"question {i} " + "q" * 400})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "a" * 400})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = compact(msgs, model="gpt-4o", window=8000, fresh=True)
    assert result.compacted
    (record,) = _records(caplog)
    assert "compactor 'window_manager'" in record.getMessage()
    assert "from normandy-window-manager" in record.getMessage()
    assert record.normandy_distribution == "normandy-window-manager"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (_report, "from <registered in code> - failed: cannot fit"),
        (_raise, "raised RuntimeError: kaboom"),
        (_break_contract, "boolean 'compacted'"),
    ],
    ids=["reported", "raised", "contract"],
)
def test_a_failure_is_logged_once_at_warning(caplog, fn, expected):
    acc = _acc(fn)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        run_compaction(acc, mid_round=False)
    (record,) = _records(caplog)
    assert record.levelno == logging.WARNING
    assert expected in record.getMessage()
    assert "compactor 'probe'" in record.getMessage()
    assert record.normandy_outcome == "failed"  # type: ignore[attr-defined]
    assert (record.exc_info is not None) == (fn is _raise)


def test_a_refused_compaction_is_logged_at_warning_naming_both_plugins(caplog):
    class Refuser:
        @hookimpl
        def before_commit(self) -> None:
            raise OSError("disk full")

    register_hook(Refuser(), name="refuser")
    acc = _acc(_drop_two)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        run_compaction(acc, mid_round=False)
    warnings = [r for r in _records(caplog) if r.levelno == logging.WARNING]
    (record,) = warnings
    text = record.getMessage()
    assert "compactor 'probe'" in text and "compaction was refused" in text
    assert "hook plugin 'code:refuser'" in text and "disk full" in text
    assert record.normandy_error_type == "refused"  # type: ignore[attr-defined]


@pytest.mark.usefixtures("sigint_raises")  # the runner may ignore SIGINT
def test_a_gates_own_keyboard_interrupt_is_contained_and_a_real_ctrl_c_stops_the_boundary(
    caplog,
):
    import os
    import signal

    def own() -> bool:
        raise KeyboardInterrupt("the gate's own")

    def ctrl_c() -> bool:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the signal arrives here
        return True

    interrupting = _Gated(on=True)
    interrupting.active = own  # type: ignore[method-assign]
    gated = _gated(interrupting, "own_interrupt")
    acc = _acc(_skip)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        run_compaction(acc, mid_round=False)
    assert [i.outcome for i in gated.seen] == ["skipped"]  # a gate that raises counts as true
    assert any("KeyboardInterrupt: the gate's own" in r.getMessage() for r in caplog.records)
    pressed = _Gated(on=True)
    pressed.active = ctrl_c  # type: ignore[method-assign]
    _gated(pressed, "ctrl_c")
    with pytest.raises(KeyboardInterrupt):
        run_compaction(acc, mid_round=True)

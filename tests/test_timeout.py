"""A compactor that takes far too long is abandoned after compaction_timeout; nothing changes."""

from __future__ import annotations

import threading
import time

import pytest

from normandy_core import (
    AgentConfig,
    hookimpl,
    register_compactor,
    run_compaction,
    unregister_compactor,
)


class Slow:
    """Sleeps, then tries to return a changed config (which must be ignored)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    @hookimpl
    def needs_window(self, opts):
        return False

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        self.release.wait(5)
        return acc.with_memory(acc.memory.fork(None)), {"compacted": True, "dropped": []}


@pytest.fixture
def slow():
    plugin = Slow()
    register_compactor("slow_test", plugin, replace=True)
    yield plugin
    plugin.release.set()
    unregister_compactor("slow_test")


def test_a_slow_compactor_is_abandoned_and_the_conversation_kept(slow):
    acc = AgentConfig(compactor="slow_test", compaction_timeout=0.2)
    acc.memory.add_message("user", "hello")
    before = acc.memory.dump()
    t0 = time.perf_counter()
    new_acc, meta = run_compaction(acc, mid_round=False)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2
    assert new_acc is acc
    assert meta["compacted"] is False
    assert "did not return within 0.2 s" in meta["error"]
    assert "slow_test" in meta["error"]
    assert acc.memory.dump() == before


def test_the_call_timeout_overrides_the_config(slow):
    acc = AgentConfig(compactor="slow_test")
    _, meta = run_compaction(acc, mid_round=True, timeout=0.1)
    assert "did not return within 0.1 s" in meta["error"]


def test_a_fast_compactor_under_a_timeout_runs_normally():
    acc = AgentConfig(compactor="noop", compaction_timeout=5)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta == {"compacted": False}
    assert new_acc is acc


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "3"])
def test_a_bad_timeout_is_refused_at_config_time(bad):
    with pytest.raises(ValueError, match="compaction_timeout must be a positive number"):
        AgentConfig(compaction_timeout=bad)


class RaisesTimeout:
    """A compactor whose own work timed out (a model call, say): its error, not the limit."""

    @hookimpl
    def needs_window(self, opts):
        return False

    @hookimpl
    def maybe_compact(self, acc, ctx, opts):
        raise TimeoutError("the summary request timed out")


@pytest.mark.parametrize("limit", [None, 5.0], ids=["unbounded", "bounded"])
def test_a_compactors_own_timeout_error_is_its_error_not_the_limit(limit):
    register_compactor("raises_timeout", RaisesTimeout(), replace=True)
    try:
        acc = AgentConfig(compactor="raises_timeout", compaction_timeout=limit)
        acc.memory.add_message("user", "hello")
        new_acc, meta = run_compaction(acc, mid_round=False)
    finally:
        unregister_compactor("raises_timeout")
    assert new_acc is acc
    assert "raised TimeoutError: the summary request timed out" in meta["error"]
    assert "compaction_timeout" not in meta["error"]


def test_a_hooks_own_timeout_error_is_its_error_not_the_limit():
    from normandy_core import register_hook

    class Hook:
        @hookimpl
        def after_compact(self):
            raise TimeoutError("index server timed out")

    class DropFirst:
        @hookimpl
        def needs_window(self, opts):
            return False

        @hookimpl
        def maybe_compact(self, acc, ctx, opts):
            entries = acc.memory.entries()
            new = acc.with_memory(acc.memory.derive(entries[2:]))
            return new, {"compacted": True, "dropped": entries[:2]}

    register_hook(Hook(), name="times_out")
    register_compactor("drop_first_two", DropFirst(), replace=True)
    try:
        acc = AgentConfig(
            compactor="drop_first_two",
            compaction_timeout=5.0,
            survival={"keep_first_user": False},  # it drops the task too
        )
        for i in range(4):
            acc.memory.add_message("user" if i % 2 == 0 else "assistant", f"m{i}")
        _, meta = run_compaction(acc, mid_round=False)
    finally:
        unregister_compactor("drop_first_two")
    assert meta["compacted"] is True
    (error,) = meta["hook_errors"]
    assert error["error"] == "TimeoutError: index server timed out"

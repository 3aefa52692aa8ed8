"""Observers and the log with the cap of abandoned threads reached (issue 32, case 4).

Under ``compaction_timeout`` the ``on_boundary`` hooks ran in bounded threads; once
hung compactors had filled the cap (:data:`~normandy_core.contract.faults.MAX_ABANDONED`)
no thread could be had, so the observers were not called at all (an adversary's
observer saw 14 of 3,000 boundaries) and each refusal was logged at ERROR with its
traceback, beside the boundary's own WARNING: 5,986 records, 2,986 tracebacks. Now the
report is made on the boundary's own thread when no thread can be had, and identical
faults are logged once per interval with a count
(:class:`~normandy_core.contract.faults.FaultFlood`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from reliability_counts import (
    FLOOD_INTERVAL,
    FLOOD_INTERVALS,
    HUNG_OBSERVER_MULTIPLE,
    OBSERVED_AT_CAP_BOUNDARIES,
)

from normandy_core import (
    AgentConfig,
    AgentMemory,
    abandoned_threads,
    hookimpl,
    register_compactor,
    register_hook,
    run_compaction,
)
from normandy_core.contract.faults import FAULT_FLOOD, MAX_ABANDONED

LOGGER = "normandy_core.boundary"


class Hangs:
    """A compactor that never returns until released: each call leaves a thread behind."""

    def __init__(self) -> None:
        self.release = threading.Event()

    @hookimpl
    def needs_window(self, opts: Any) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
        self.release.wait(60)
        return acc, {"compacted": False}


class Observer:
    """Notes every boundary it is told of, and on which thread."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str]] = []

    @hookimpl
    def on_boundary(self, info: Any) -> None:
        self.seen.append((info.outcome, info.error_type, threading.current_thread().name))


class Raises:
    """An observer that fails at every boundary, the same way."""

    @hookimpl
    def on_boundary(self) -> None:
        raise ValueError("the metrics backend refused the point")


@pytest.fixture
def at_cap() -> Iterator[AgentConfig]:
    """A config whose compactor hangs, called until the cap of abandoned threads is
    reached (and released afterwards, every thread waited for)."""
    FAULT_FLOOD.reset()
    hangs = Hangs()
    register_compactor("hangs", hangs, replace=True)
    mem = AgentMemory()
    for i in range(6):
        mem.add_message("user" if i % 2 == 0 else "assistant", f"message {i}")
    acc = AgentConfig(model="gpt-4o", compactor="hangs", compaction_timeout=0.01).with_memory(mem)
    try:
        for _ in range(4 * MAX_ABANDONED):
            if abandoned_threads() >= MAX_ABANDONED:
                break
            run_compaction(acc, mid_round=False)
        assert abandoned_threads() >= MAX_ABANDONED
        # Observed under a limit a loaded machine keeps: should a thread another test left
        # end meanwhile, the compactor takes its place again, and the observers called in
        # a thread then have the time to answer.
        yield acc.replace(compaction_timeout=1.0)
    finally:
        hangs.release.set()
        end = time.monotonic() + 30
        while abandoned_threads() and time.monotonic() < end:
            time.sleep(0.01)
        FAULT_FLOOD.reset()


def _faults(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_observers_see_every_boundary_with_the_cap_reached(at_cap, caplog):
    observer = Observer()
    register_hook(observer, name="observer")
    FAULT_FLOOD.reset()
    refused = 0
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(OBSERVED_AT_CAP_BOUNDARIES):
            meta = run_compaction(at_cap, mid_round=False).meta
            refused += "not starting another" in (meta.error or "")
    # (a thread another test left may end meanwhile: the compactor takes its place again)
    assert refused >= OBSERVED_AT_CAP_BOUNDARIES - MAX_ABANDONED
    # every boundary reported, those at the cap on the boundary's own thread
    assert len(observer.seen) == OBSERVED_AT_CAP_BOUNDARIES
    at_cap_reports = [s for s in observer.seen if s[1] == "abandoned_limit"]
    assert len(at_cap_reports) == refused
    assert {s[2] for s in at_cap_reports} == {threading.current_thread().name}
    # and the log has that fault once, without a traceback: not a line per boundary
    records = _faults(caplog)
    mine = [r for r in records if _fault(r).endswith(": abandoned_limit")]
    assert len(mine) == 1, [r.getMessage()[:120] for r in records[:5]]
    assert mine[0].levelno == logging.WARNING
    assert "not starting another" in mine[0].getMessage()
    assert len(records) <= 1 + OBSERVED_AT_CAP_BOUNDARIES - refused
    assert all(r.exc_info is None for r in records)


def _fault(record: logging.LogRecord) -> str:
    return str(getattr(record, "normandy_fault", ""))


def test_a_flood_of_identical_faults_is_logged_once_per_interval_with_a_count(
    at_cap, caplog, monkeypatch
):
    """A failing observer at every boundary, and the boundary's own failure: each is
    logged once per interval (0.25 s here), its traceback once per interval, with the
    count of those held back since; the observer beside it still sees every boundary."""
    interval = FLOOD_INTERVAL
    monkeypatch.setattr(FAULT_FLOOD, "interval", interval)
    observer = Observer()
    register_hook(Raises(), name="raises")
    register_hook(observer, name="observer")
    FAULT_FLOOD.reset()
    boundaries = 0
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        while time.monotonic() - t0 < FLOOD_INTERVALS * interval + 0.05:
            run_compaction(at_cap, mid_round=False)
            boundaries += 1
    elapsed = time.monotonic() - t0
    assert len(observer.seen) == boundaries
    intervals = int(elapsed / interval) + 1
    records = _faults(caplog)
    for key, level, traced in (
        (": abandoned_limit", logging.WARNING, False),
        (
            "on_boundary of hook plugin 'code:raises' (<registered in code>): ValueError",
            logging.ERROR,
            True,
        ),
    ):
        mine = [r for r in records if _fault(r).endswith(key)]
        # about one record per interval (at least the first and one after an interval) ...
        assert 2 <= len(mine) <= intervals, (key, len(mine), intervals)
        assert all(r.levelno == level for r in mine)
        assert all((r.exc_info is not None) is traced for r in mine)
        # ... each after the first saying how many like it were held back since
        repeats = [r.normandy_repeats for r in mine]
        assert repeats[0] == 0 and all(n > 0 for n in repeats[1:]), repeats
        assert f"{repeats[1]:,} more like it since it was last logged" in mine[1].getMessage()
        # every fault is either logged or counted (those after the last record not yet)
        assert len(mine) + sum(repeats) <= boundaries
        assert len(mine) + sum(repeats) > boundaries // 2
    assert len(records) < boundaries


class HungObserver:
    """An observer that never returns until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    @hookimpl
    def on_boundary(self) -> None:
        self.calls += 1
        self.release.wait(60)


def test_a_hung_observer_holds_one_thread_and_is_never_called_on_the_boundarys():
    """An observer that hangs is abandoned once and not called again while its call
    runs: it neither fills the cap (so it can never be called, unbounded, on the
    boundary's own thread) nor keeps the other observers from any report."""
    FAULT_FLOOD.reset()
    hung, observer = HungObserver(), Observer()
    register_hook(hung, name="hung")
    register_hook(observer, name="observer")
    mem = AgentMemory()
    mem.add_message("user", "hello")
    acc = AgentConfig(model="gpt-4o", compactor="noop", compaction_timeout=0.05).with_memory(mem)
    before = abandoned_threads()
    boundaries = HUNG_OBSERVER_MULTIPLE * MAX_ABANDONED
    try:
        for _ in range(boundaries):
            t0 = time.monotonic()
            run_compaction(acc, mid_round=False)
            assert time.monotonic() - t0 < 2.0  # never waits on the hung observer
        assert hung.calls == 1
        assert abandoned_threads() - before == 1
        assert len(observer.seen) == boundaries
    finally:
        hung.release.set()
    end = time.monotonic() + 10
    while abandoned_threads() > before and time.monotonic() < end:
        time.sleep(0.01)
    assert abandoned_threads() == before

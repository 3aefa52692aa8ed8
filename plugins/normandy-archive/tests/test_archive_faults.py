"""The archive under faults: every dropped entry is archived or still in the conversation.

Each scenario replays an agent session through the boundary with the archive hook
installed for real (``window_manager``, a compaction after every tool batch) while the
archive is broken in one way, and ends with the same check: every entry the agent ever
appended is either still in its conversation or archived, byte for byte. By default the
archive is *required*: a compaction it cannot record is refused with the archive's own
error. Best-effort (``NORMANDY_ARCHIVE_REQUIRED=0``) compactions stand, and every entry
they lose is counted in ``hook_errors``.
"""

from __future__ import annotations

import time

import pytest
from archive_helpers import (
    DROP_DAC,
    LOCK_HOLDER,
    Replay,
    agent,
    archived,
    digest,
    lost,
    release,
    start_holder,
)
from reliability_counts import (
    DISK_FULL_LIMITS,
    LOCKED_COMPACTIONS,
    READ_ONLY_SESSIONS,
    ROTATIONS,
)

from normandy_archive import Archive, archive_settings, maintenance
from normandy_core.app.workload import generate_session

# -- disk full --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("limit", DISK_FULL_LIMITS)
def test_disk_full_refuses_the_compaction_and_loses_nothing(tmp_path, limit):
    path = tmp_path / "archive.sqlite3"
    report = agent(path, "full", seed=51, messages=700, fsize=limit)
    committed = [b for b in report["boundaries"] if b["compacted"]]
    refused = [b for b in report["boundaries"] if not b["compacted"]]
    print(f"limit {limit}: {len(committed)} committed, {len(refused)} refused")
    assert committed and refused
    for b in refused:
        assert "database or disk is full" in b["error"], b["error"]
        assert "cannot rollback" not in b["error"]
        assert "conversation is kept" in b["error"]
    assert all(not b["hook_errors"] for b in committed)
    assert lost(report, path) == set()
    # every compaction that happened is archived whole
    found = archived(path)
    for b in committed:
        assert set(b["dropped"]) <= found


@pytest.mark.slow
@pytest.mark.parametrize("limit", DISK_FULL_LIMITS)
def test_disk_full_best_effort_counts_every_lost_entry(tmp_path, limit):
    path = tmp_path / "archive.sqlite3"
    report = agent(
        path,
        "full",
        seed=51,
        messages=700,
        fsize=limit,
        env={"NORMANDY_ARCHIVE_REQUIRED": "0"},
    )
    assert report["boundaries"] and all(b["compacted"] for b in report["boundaries"])
    failed = [b for b in report["boundaries"] if b["hook_errors"]]
    assert failed
    reported: set[tuple[str, str]] = set()
    for b in failed:
        (err,) = b["hook_errors"]
        assert err["hook"] == "normandy_core.hooks:archive"
        assert f"{len(b['dropped'])} dropped entries were NOT archived" in err["error"]
        assert "database or disk is full" in err["error"]
        assert "cannot rollback" not in err["error"]
        reported |= set(b["dropped"])
    # nothing is missing that was not reported
    missing = lost(report, path)
    assert missing and missing <= reported


# -- a write lock held by another process -------------------------------------------------


@pytest.mark.slow
def test_a_write_lock_held_past_the_busy_wait_refuses_and_loses_nothing(tmp_path):
    """Another process holds the archive's write lock: each compaction is refused after
    the bounded busy wait; once the lock is gone, the next one goes through."""
    path = tmp_path / "archive.sqlite3"
    agent = Replay("locked", seed=52, messages=600)
    with archive_settings(path=path, busy_timeout=0.5):
        assert agent.next_compaction()["compacted"]  # the archive exists and works
        assert maintenance.drain(30)
        holder = start_holder(LOCK_HOLDER, path, "locked")
        try:
            for _ in range(LOCKED_COMPACTIONS):
                started = time.monotonic()
                meta = agent.next_compaction()
                waited = time.monotonic() - started
                assert not meta["compacted"] and "database is locked" in meta["error"]
                assert "busy_timeout" in meta["error"]
                assert waited < 0.5 + 2.0, waited  # a bounded wait, not 30 s
        finally:
            release(holder)
        meta = agent.next_compaction()  # the lock is gone: the next one goes through
        assert meta["compacted"] and "hook_errors" not in meta
    assert agent.lost(path) == set()


# -- the archive deleted or rotated while the agent runs -----------------------------------


@pytest.mark.parametrize("how", ROTATIONS)
def test_a_deleted_or_rotated_archive_is_reopened_and_nothing_is_lost(tmp_path, how):
    path = tmp_path / "archive.sqlite3"
    rotated = tmp_path / "archive.sqlite3.1"
    agent = Replay(how, seed=53, messages=600)
    with archive_settings(path=path):
        first = agent.next_compaction()
        assert first["compacted"]
        if how == "delete":
            path.unlink()
        else:
            path.rename(rotated)
        later = [agent.next_compaction() for _ in range(3)]
    assert all(m["compacted"] and "hook_errors" not in m for m in later)
    after = {digest(e) for m in later for e in m["dropped"]}
    assert path.exists()  # a new archive at the path, holding what came after
    assert after <= archived(path)
    if how == "rotate":  # the rotated file keeps what was written before, whole
        before = {digest(e) for e in first["dropped"]}
        assert before <= archived(rotated)
        assert agent.lost(path, rotated) == set()
    else:  # what was deleted is gone with the file; nothing after it went there
        assert agent.lost(path) == {digest(e) for e in first["dropped"]}


# -- a read-only archive ------------------------------------------------------------------


@pytest.mark.slow
def test_a_read_only_archive_refuses_compactions_and_loses_nothing(tmp_path):
    path = tmp_path / "archive.sqlite3"
    mem = list(generate_session(54, 20))
    archive = Archive(path)
    archive.record(mem[:5], session_id="earlier")
    archive.close()
    for p in tmp_path.iterdir():
        p.chmod(0o400)  # read-only for us, and owner-only (else refused as such)
    for n in range(READ_ONLY_SESSIONS):
        report = agent(path, f"ro-{n}", seed=55 + n, messages=300, drop_dac=DROP_DAC)
        refused = [b for b in report["boundaries"] if not b["compacted"]]
        assert refused and len(refused) == len(report["boundaries"])
        for b in refused:
            assert "readonly database" in b["error"], b["error"]
        assert lost(report, path) == set()
    assert Archive(path).count() == 5  # untouched

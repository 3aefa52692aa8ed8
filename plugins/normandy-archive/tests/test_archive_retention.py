"""Bounded: retention by size, age and session count, oldest sessions first.

``Archive.prune`` (and ``normandy archive prune``, with ``--dry-run``) removes whole
sessions, oldest first, with their compactions, caller ids and index entries; the hook
prunes by itself when a limit is set (``NORMANDY_ARCHIVE_MAX_BYTES``,
``NORMANDY_ARCHIVE_MAX_AGE_DAYS``, ``NORMANDY_ARCHIVE_MAX_SESSIONS``).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from normandy_archive import Archive, main, maintenance
from normandy_core import AgentConfig, Entry, run_compaction
from normandy_core.app.cli import main as normandy_main
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session

DAY = 86_400.0
NOW = time.time()


def _sessions(path: Path, count: int = 5) -> dict[str, list[Entry]]:
    """``count`` sessions, one compaction each, the first ``count - 1`` days old."""
    archive = Archive(path)
    made: dict[str, list[Entry]] = {}
    for n in range(count):
        entries = list(generate_session(90 + n, 60))
        session = f"s{n}"
        archive.record(entries, session_id=session, at=NOW - (count - 1 - n) * DAY)
        made[session] = entries
    archive.close()
    return made


def _word(e: Entry) -> str:
    return e.text().split()[0]


def _fts_ok(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('integrity-check')")
    finally:
        conn.close()


@pytest.fixture
def path(tmp_path, monkeypatch):
    p = tmp_path / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(p))
    return p


def test_prune_by_age_count_and_size_oldest_sessions_first(path):
    made = _sessions(path)
    archive = Archive(path)
    total = archive.count()
    plan = archive.prune_plan(max_age_seconds=2.5 * DAY, now=NOW)
    assert [s.session_id for s in plan.sessions] == ["s0", "s1"]  # 4 and 3 days old
    assert plan.total_sessions == 5
    assert archive.prune(max_age_seconds=2.5 * DAY, now=NOW, dry_run=True) == plan.entries
    assert archive.count() == total  # a dry run removes nothing
    assert archive.prune(max_age_seconds=2.5 * DAY, now=NOW) == plan.entries
    assert archive.count() == total - plan.entries
    assert archive.count("s0") == archive.count("s1") == 0
    # the system prompt, archived first by s0, was dropped since by s4: it stays, under s4
    system = made["s4"][0]
    assert system.role == "system" and archive.count("s4") == len(made["s4"])
    assert [v.session_id for v in archive.versions(made["s0"][0].id)] == ["s4"]
    assert {c.session_id for c in archive.compactions()} == {"s2", "s3", "s4"}
    gone, kept = made["s0"][5], made["s4"][5]
    assert archive.recall(gone.id) is None and archive.recall(kept.id) == kept
    assert gone.id not in {h.entry.id for h in archive.search(_word(gone), limit=10**6)}
    assert kept.id in {h.entry.id for h in archive.search(_word(kept), limit=10**6)}
    tool = next(e for e in made["s1"] if e.tool_uses)
    assert archive.by_source_id(tool.tool_uses[0].id) == []
    _fts_ok(path)

    expected = archive.prune_plan(max_sessions=2)
    assert [s.session_id for s in expected.sessions] == ["s2"]  # all but the 2 most recent
    assert archive.prune(max_sessions=2) == expected.entries
    assert {c.session_id for c in archive.compactions()} == {"s3", "s4"}

    # size: the oldest go until the estimate fits; the most recent session never does
    used = archive.prune_plan(max_bytes=0).used_bytes
    plan = archive.prune_plan(max_bytes=used * 2 // 3)
    assert [s.session_id for s in plan.sessions] == ["s3"]
    assert [s.session_id for s in archive.prune_plan(max_bytes=1).sessions] == ["s3"]
    assert archive.prune_plan(max_bytes=used).sessions == ()
    before = path.stat().st_size
    archive.prune(max_bytes=1, vacuum=True)
    assert {c.session_id for c in archive.compactions()} == {"s4"}
    assert archive.count() == len(made["s4"])
    assert path.stat().st_size < before  # vacuum gave the space back
    _fts_ok(path)
    assert kept.id in {h.entry.id for h in archive.search(_word(kept), limit=10**6)}
    assert archive.prune() == 0  # no limit, nothing goes


def test_the_prune_command_with_dry_run_and_limits(path, capsys, monkeypatch):
    _sessions(path)
    archive = Archive(path)
    total = archive.count()
    for script in ("normandy archive", "normandy-archive"):

        def run(*args: str, script: str = script) -> tuple[int, str, str]:
            if script == "normandy archive":
                status = normandy_main(["archive", "prune", *args])
            else:
                status = main(["prune", *args])
            out, err = capsys.readouterr()
            return status, out, err

        status, out, err = run("--dry-run", "--max-sessions", "3")
        lines = out.splitlines()
        assert status == 0 and err == "" and archive.count() == total
        assert [x.split()[0] for x in lines[:-1]] == ["s0", "s1"]
        assert lines[-1].startswith(f"{script} prune: would remove 2 of 5 sessions (")
        for bad, word in ((["--max-bytes", "lots"], "--max-bytes"), ([], "no limit")):
            status, out, err = run(*bad)
            assert status == 2 and len(err.splitlines()) == 1 and word in err, err
        for bad in (["--max-age-days", "-1"], ["--max-sessions", "x"]):
            status, _, err = run(*bad)
            assert status == 2 and len(err.splitlines()) == 1, err
    monkeypatch.setenv("NORMANDY_ARCHIVE_MAX_SESSIONS", "3")  # the environment's limit
    status, out, _ = run("--dry-run")
    assert status == 0 and "would remove 2 of 5 sessions" in out
    status, out, _ = run("--max-age-days", "0.5", "--max-sessions", "4")
    assert status == 0 and "removed 4 of 5 sessions" in out.splitlines()[-1]
    assert {c.session_id for c in archive.compactions()} == {"s4"}


def test_the_hook_prunes_past_the_limits(path, monkeypatch):
    monkeypatch.setenv("NORMANDY_ARCHIVE_MAX_SESSIONS", "2")
    monkeypatch.setattr(maintenance, "PRUNE_EVERY", 0.0)
    for n in range(4):
        acc = AgentConfig(
            model="claude-sonnet-4-5",
            system_prompt=SYSTEM_PROMPT,
            tools=TOOLS,
            compactor="window_manager",
            compactor_opts={"context_window": 20_000, "counter": "cl100k_base"},
            session_id=f"agent-{n}",
        ).with_memory(generate_session(95 + n, 150, end_mid_round=True))
        _, meta = run_compaction(acc, mid_round=True)
        assert meta["compacted"] and "hook_errors" not in meta
        assert maintenance.drain(30)  # the background writer prunes after each compaction
        time.sleep(0.01)  # distinct compaction times
    sessions = {c.session_id for c in Archive(path).compactions()}
    assert sessions == {"agent-2", "agent-3"}
    _fts_ok(path)


def test_prune_counts_what_is_not_indexed_yet(path):
    archive = Archive(path)
    for n in range(3):  # as the hook writes: indexed later, by the background writer
        entries = list(generate_session(97 + n, 30))
        archive.record(entries, session_id=f"p{n}", at=NOW - (3 - n) * DAY, index=False)
    plan = archive.prune_plan(max_sessions=1)
    assert [s.session_id for s in plan.sessions] == ["p0", "p1"]
    assert archive.prune(max_sessions=1) == plan.entries > 0
    assert {c.session_id for c in archive.compactions()} == {"p2"}
    _fts_ok(path)

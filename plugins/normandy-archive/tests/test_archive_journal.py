"""The SQLite archive's spool and journal: what a compacting boundary commits, and waits for.

A compaction is committed as one frame appended to its process's spool file (``spool``,
the default), or as one journal row (``journal``: past the spool's bound, after a failed
move, or without file locks); the background writer moves frames into the journal and
the journal into the indexed tables later. Between the two, every read (``list``,
``show``, ``search``, ``recall``, both console scripts) sees the spooled frames and the
journal's rows, numbered as the move numbers them; a process killed before the move
leaves them to the next writer, which moves them when it opens; content is stored once
whether it is still spooled, in the journal or already moved; and a write that fails
(disk full) refuses the compaction with the error the archive got.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from archive_helpers import digest
from reliability_counts import JOURNAL_KILLS

from normandy_archive import Archive, archive_settings, main as archive_main
from normandy_archive.hooks import recall_entries
from normandy_archive.spool import read_frames, spool_files
from normandy_core import Entry
from normandy_core.app.cli import main as normandy_main
from normandy_core.app.workload import generate_session

ENTRIES = list(generate_session(71, 60))


def _raw(path: Path) -> dict[str, int]:
    """Rows of the journal and of the indexed tables, read directly."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("journal", "entries", "compactions", "seen")
        }
    finally:
        conn.close()


def _pending(path: Path) -> int:
    """Compactions committed and not moved yet: journal rows and spooled frames."""
    return _raw(path)["journal"] + len(read_frames(path))


@pytest.fixture(params=["spool", "journal"])
def mode(request, monkeypatch) -> str:
    """How a compaction's write is committed: spooled (the default) or a journal row."""
    if request.param == "journal":
        monkeypatch.setattr(Archive, "SPOOL_MAX_BYTES", 0)
    return str(request.param)


#: ``Archive.SPOOL_MAX_BYTES`` in a child process, per mode.
_BOUND = {"spool": str(Archive.SPOOL_MAX_BYTES), "journal": "0"}


def _distinct(entries: list[Entry]) -> int:
    from normandy_archive.schema import content_hash

    return len({content_hash(e) for e in entries})


def _word(entry: Entry) -> str:
    return max(entry.text().split(), key=len).strip(".,:;()\"'")


def test_reads_see_the_journal_before_the_move_numbered_as_the_move_numbers_them(
    tmp_path, monkeypatch, capsys, mode
):
    path = tmp_path / "archive.sqlite3"
    first, second = ENTRIES[:30], ENTRIES[30:]
    archive = Archive(path)
    archive.record(first, session_id="s1", compactor="window_manager")  # moved, indexed
    cid = archive.record(second, session_id="s1", compactor="window_manager", index=False)
    raw = _raw(path)
    assert _pending(path) == 1 and raw["entries"] == _distinct(first)
    assert raw["journal"] == (mode == "journal")
    assert cid.entries == _distinct(ENTRIES) - _distinct(first)

    reader = Archive(path)  # another connection: what another process sees
    before = reader.list("s1", limit=1000)
    assert len(before) == reader.count("s1") == _distinct(ENTRIES)
    assert [a.seq for a in before] == sorted(a.seq for a in before)
    for a in before:
        assert a.entry.model_dump_json() == a.entry_json  # byte for byte
    late = next(e for e in second if e.role == "user" and isinstance(e.content, str))
    assert reader.recall(late.id) == late
    assert reader.versions(late.id)[0].entry_json == late.model_dump_json()
    assert late.id in {a.entry.id for a in reader.search(_word(late), limit=100)}
    tool = next(e for e in second if e.tool_uses)
    assert tool.id in {a.entry.id for a in reader.by_source_id(tool.tool_uses[0].id)}
    pending = [c for c in reader.compactions(limit=100) if c.compaction_id == str(cid)]
    assert [(c.compactor, c.entry_count) for c in pending] == [("window_manager", cid.entries)]

    # the recall tool, and both console scripts
    with archive_settings(path=path):
        hits = recall_entries(query=late.id, session_id="s1", limit=5)
    assert hits and hits[0].entry == late
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    for run in (lambda a: normandy_main(["archive", *a]), archive_main):
        assert run(["show", late.id]) == 0
        assert capsys.readouterr().out == late.model_dump_json() + "\n"
        assert run(["list", "--json", "--limit", "1000"]) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [r["seq"] for r in listed] == [a.seq for a in before]
        assert run(["search", "--json", _word(late)]) == 0
        assert late.id in {
            json.loads(line)["entry_id"] for line in capsys.readouterr().out.splitlines()
        }

    # moved: the same rows, the same numbers, the same bytes; the journal and spool empty
    archive.index()
    assert _pending(path) == 0
    after = reader.list("s1", limit=1000)
    assert [(a.seq, a.entry_json, a.compaction_id) for a in after] == [
        (a.seq, a.entry_json, a.compaction_id) for a in before
    ]
    moved = [c for c in reader.compactions(limit=100) if c.compaction_id == str(cid)]
    assert [c.entry_count for c in moved] == [cid.entries]
    archive.close()
    reader.close()


def test_recompaction_stores_nothing_twice_while_the_first_is_in_the_journal(tmp_path, mode):
    path = tmp_path / "archive.sqlite3"
    n = _distinct(ENTRIES)
    archive = Archive(path)
    first = archive.record(ENTRIES, session_id="s1", index=False, at=1_000.0)
    again = archive.record(ENTRIES, session_id="s2", index=False, at=2_000.0)
    assert (first.entries, first.existing) == (n, 0)
    assert (again.entries, again.existing) == (0, n)  # all still in the journal
    assert archive.count() == n and len(archive.list(limit=1000)) == n
    assert [c.compaction_id for c in archive.compactions()] == [str(first)]
    # the second session dropped it last: its recall finds it before the move, too
    word = _word(next(e for e in ENTRIES if e.role == "user" and isinstance(e.content, str)))
    assert archive.search(word, session_id="s2", seen=True)
    # another process (its own writer, which does not know this one's journal rows)
    other = Archive(path)
    other.record(ENTRIES, session_id="s3", index=False, at=3_000.0)
    assert archive.count() == n  # read once though journaled twice
    assert len({a.content_hash for a in archive.list(limit=1000)}) == n

    archive.index()
    raw = _raw(path)
    assert raw == {"journal": 0, "entries": n, "compactions": 1, "seen": n}
    assert [c.entry_count for c in archive.compactions()] == [n]
    usage = archive.prune_plan(max_sessions=0)
    assert {s.session_id for s in usage.sessions} == {"s3"}  # it dropped everything last
    # re-compaction once moved: nothing new, no journal row with content
    third = archive.record(ENTRIES, session_id="s4", index=False, at=4_000.0)
    assert (third.entries, third.existing) == (0, n)
    # (a spooled frame holds it again, so that a prune meanwhile loses nothing; the
    # move stores none of it)
    archive.index()
    assert _raw(path) == {"journal": 0, "entries": n, "compactions": 1, "seen": n}
    archive.close()
    other.close()


KILLED = textwrap.dedent(
    """
    import json, sys
    from normandy_archive import Archive
    from normandy_core.app.workload import generate_session

    entries = list(generate_session(int(sys.argv[2]), 400))
    Archive.SPOOL_MAX_BYTES = int(sys.argv[3])  # 0: journal rows, not spooled frames
    archive = Archive(sys.argv[1])
    for n in range(0, len(entries), 25):
        batch = entries[n : n + 25]
        # the boundary's write: the frame or journal row committed, the move left to later
        cid = archive.record(batch, session_id="k", index=False)
        print(json.dumps([str(cid), [e.id for e in batch]]), flush=True)
    sys.stdin.readline()  # killed here, before any move
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("commits", JOURNAL_KILLS)
@pytest.mark.parametrize("how", ["spool", "journal"])
def test_killed_between_the_journal_commit_and_the_move_everything_is_recallable(
    tmp_path, commits, how
):
    path = tmp_path / "archive.sqlite3"
    source = {e.id: e for e in generate_session(83, 400)}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(path), "83", _BOUND[how]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    done = [json.loads(child.stdout.readline()) for _ in range(commits)]
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    raw = _raw(path)
    assert raw["entries"] == 0 and _pending(path) >= len(done)
    assert bool(spool_files(path)) == (how == "spool")  # the killed process's, left whole

    def check(archive: Archive) -> list[tuple[int, str]]:
        committed = {cid for cid, _ in done}
        assert committed <= {c.compaction_id for c in archive.compactions(limit=1000)}
        for _, ids in done:
            for entry_id in ids:
                entry = source[entry_id]
                found = archive.by_source_id(entry.tool_uses[0].id) if entry.tool_uses else []
                found += archive.search(_word(entry), limit=1000) if entry.text().strip() else []
                found += archive.versions(entry_id)
                # stored once by content: under this id, or under the first with it
                assert digest(entry) in {digest(a.entry) for a in found}, entry_id
        listed = archive.list(limit=10**6)
        for a in listed:
            assert a.entry.model_dump_json() == a.entry_json
        return [(a.seq, a.entry_json) for a in listed]

    reader = Archive(path)
    before = check(reader)  # read from the journal
    writer = Archive(path)
    writer.record([Entry(id="next", role="user", content="the next agent")], session_id="n")
    raw = _raw(path)  # its writer moved what the killed one left, when it opened
    assert _pending(path) == 0 and raw["entries"] == len(before) + 1
    assert spool_files(path) == []  # and removed its spool file
    assert check(reader)[: len(before)] == before  # the same rows, numbers and bytes
    writer.close()
    reader.close()


DISK_FULL = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    from archive_helpers import config
    from normandy_archive import Archive, ArchiveError, maintenance
    from normandy_core import Entry, run_compaction

    path = sys.argv[1]
    Archive.SPOOL_MAX_BYTES = int(sys.argv[2])  # 0: journal rows, not spooled frames
    archive = Archive(path)
    archive.record([Entry(id="early", role="user", content="archived before")], session_id="d")
    # a reader keeps the database open, so the writer reopened after the failure does
    # not checkpoint the log away (which would make room again)
    reader = Archive(path)
    assert reader.count() == 1
    size = max(os.path.getsize(p) for p in (path, path + "-wal"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4096, size + 4096))
    words = lambda n: " ".join(f"w{n}x{i}" for i in range(1500))
    out = {}
    try:
        archive.record(
            [Entry(id=f"big{n}", role="user", content=words(n) * 6) for n in range(3)],
            session_id="d", index=False,
        )
        out["record"] = "written"
    except ArchiveError as exc:
        out["record"] = str(exc)
    acc = config("d")
    for n in range(6):
        acc.memory.add_message("user", words(n), id=f"u{n}")
        acc.memory.add_message("assistant", f"noted {n}", id=f"a{n}")
    for n in ("", "2"):  # the second after the background writer tried to move the first
        before = acc
        after, meta = run_compaction(acc, mid_round=False)
        out["compacted" + n] = meta["compacted"]
        out["error" + n] = meta.get("error")
        out["kept" + n] = after is before
        out["dropped" + n] = [e.id for e in meta.get("dropped") or ()]
        maintenance.drain(30)
        acc = after
        for k in range(6, 12):
            acc.memory.add_message("user", words(k), id=f"u{n}-{k}")
            acc.memory.add_message("assistant", f"noted {k}", id=f"a{n}-{k}")
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_a_disk_full_on_the_journal_write_refuses_the_compaction(tmp_path, mode):
    """Journal: the compaction is refused. Spool: a frame the file-size limit lets through
    is committed, the background writer's move then fails, and the next compaction is
    written to the archive directly and refused; the first stays spooled, readable."""
    path = tmp_path / "archive.sqlite3"
    helpers = Path(__file__).parent
    env = {
        **os.environ,
        "NORMANDY_ARCHIVE_PATH": str(path),
        "PYTHONPATH": os.pathsep.join([str(helpers), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(path), _BOUND[mode]],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert "could not record 3 entries" in out["record"], out
    assert "database or disk is full" in out["record"]
    assert "cannot rollback" not in out["record"]
    spooled = out["dropped"] if mode == "spool" else []
    assert out["compacted"] is (mode == "spool") and out["kept"] is (mode == "journal")
    for n in ("", "2") if mode == "journal" else ("2",):
        assert out["compacted" + n] is False and out["kept" + n] is True
        assert "database or disk is full" in out["error" + n]
        assert "conversation is kept" in out["error" + n]
    # nothing half written: the journal holds no row of either, and what was there stays
    raw = _raw(path)
    assert raw["journal"] == 0 and raw["entries"] == 1
    assert len(read_frames(path)) == (mode == "spool")
    archive = Archive(path)
    listed = [a.entry.id for a in archive.list(limit=100)]
    assert listed[0] == "early" and set(listed[1:]) == set(spooled)
    if mode == "spool":  # dropped entries of the same content are stored once
        assert spooled and len(listed) > 1
    archive.close()


def test_a_compaction_interrupts_the_background_writers_transaction_and_it_is_redone(
    tmp_path, monkeypatch
):
    import threading
    import time

    from normandy_archive.store import ArchiveBusyError

    monkeypatch.setattr(Archive, "SPOOL_MAX_BYTES", 0)  # journal rows (spooled: test_archive_spool)
    path = tmp_path / "archive.sqlite3"
    archive = Archive(path)
    many = list(generate_session(72, 400))  # a journal row that takes a while to move
    archive.record(many, session_id="bg", index=False)
    outcome: dict[str, str] = {}

    def background() -> None:
        try:
            archive.index(batch=10**6, yield_to_writers=True)
            outcome["background"] = "finished"
        except ArchiveBusyError as exc:
            outcome["background"] = str(exc)

    worker = threading.Thread(target=background)
    worker.start()
    deadline = time.monotonic() + 30
    while not archive._background_running and time.monotonic() < deadline:
        time.sleep(0.0002)
    assert archive._background_running  # the move's transaction is running
    cid = archive.record(ENTRIES[:10], session_id="fg", index=False)
    worker.join(60)
    assert cid.entries + cid.existing == _distinct(ENTRIES[:10]) and cid.entries > 0
    assert "a compaction's write went first" in outcome["background"]
    assert archive.interrupted == 1
    raw = _raw(path)
    assert raw["journal"] == 2 and raw["entries"] == 0  # rolled back, nothing half moved
    assert Archive(path).count() == _distinct(many + ENTRIES[:10])  # reads see it all
    assert archive.index() == _distinct(many + ENTRIES[:10])  # done again, all of it
    assert _raw(path)["journal"] == 0


def test_an_interrupt_sqlite_reports_as_another_error_still_counts_as_one(tmp_path):
    """A foreground write's interrupt can reach the background writer's statement while
    SQLite builds a virtual table (``json_each``): SQLite then reports "vtable constructor
    failed: json_each", not "interrupted" (seen in the crash campaign). It is still the
    interrupt: the transaction is given up as busy and done again later, the write
    connection kept, nothing logged as a failure. The race cannot be timed here, so the
    work raises SQLite's message itself once the interrupt was sent."""
    import sqlite3
    import threading

    from normandy_archive import ArchiveError
    from normandy_archive.store import ArchiveBusyError

    path = tmp_path / "archive.sqlite3"
    archive = Archive(path)
    archive.record(ENTRIES[:3], session_id="s")  # the write connection is open

    def fails(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("vtable constructor failed: json_each")

    def interrupted(conn: sqlite3.Connection) -> None:
        interrupter = threading.Thread(target=archive._interrupt_background)
        interrupter.start()
        interrupter.join()
        fails(conn)

    with pytest.raises(ArchiveBusyError, match="a compaction's write went first"):
        archive._transaction(interrupted, "could not move the journal", background=True)
    assert archive.interrupted == 1 and archive._wconn is not None
    with pytest.raises(ArchiveError, match="vtable constructor failed"):  # no interrupt: a fault
        archive._transaction(fails, "could not move the journal", background=True)
    assert archive.interrupted == 1
    archive.close()

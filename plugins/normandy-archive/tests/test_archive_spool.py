"""The spool: a compaction committed by one append to its process's file beside the archive.

Frames read back exactly as written, and a torn or damaged end is left out; the file is
owner-only and locked by its process while it lives; what an ``Archive`` dropped without
closing, or a process that ended, left spooled is moved by the next writer; a spool file
removed under a running writer is written again whole; a child made by ``fork`` spools
into a file of its own. (Reads before the move, SIGKILL, disk full and a held lock are in
test_archive_journal.py and test_archive_faults.py, for both commit paths.)
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

import pytest
from archive_helpers import LOCK_HOLDER, python, release, start_holder
from hypothesis import given, settings, strategies as st
from reliability_counts import EXIT_LOCK_SECONDS

from normandy_archive import Archive
from normandy_archive.base import _prepare_one
from normandy_archive.spool import Frame, decode, encode, read_frames, spool_files
from normandy_core import Entry
from normandy_core.app.workload import generate_session

SESSION = list(generate_session(91, 120))


def _frame(n: int, entries: list[Entry], seen: tuple[str, ...] = ()) -> Frame:
    journal = (f"c{n}", "s", "window_manager", None, "gpt-4o", n % 2, 1000.0 + n, 9, 3, "{}", 5)
    again = json.dumps(list(seen)) if seen else None
    return Frame((*journal, again), tuple(_prepare_one(e).row for e in entries))


_frames = st.lists(
    st.tuples(
        st.integers(0, len(SESSION) - 1),
        st.integers(0, 12),
        st.lists(st.text("0123456789abcdef", min_size=64, max_size=64), max_size=3),
    ),
    min_size=1,
    max_size=5,
).map(
    lambda specs: [
        _frame(n, SESSION[start : start + count], tuple(seen))
        for n, (start, count, seen) in enumerate(specs)
    ]
)


@settings(max_examples=40, deadline=None)
@given(frames=_frames, cut=st.floats(0, 1), flip=st.integers(0, 10**6))
def test_frames_read_back_as_written_and_a_torn_or_damaged_end_is_left_out(frames, cut, flip):
    data = [encode(f) for f in frames]
    whole = b"".join(data)
    assert decode(whole) == (frames, len(whole))
    # a write cut anywhere: the frames before it, whole, and nothing of the torn one
    end = int(len(whole) * cut)
    read, size = decode(whole[:end])
    assert read == frames[: len(read)] and size == sum(len(d) for d in data[: len(read)])
    assert size <= end < size + len(data[len(read)]) if len(read) < len(frames) else True
    # a byte damaged in the last frame: that frame is left out, the others read
    last = len(whole) - len(data[-1])
    at = last + flip % len(data[-1])
    damaged = whole[:at] + bytes([whole[at] ^ 0x5A]) + whole[at + 1 :]
    assert decode(damaged)[0] == frames[:-1]


HOLDER = textwrap.dedent(
    """
    import sys
    from normandy_archive import Archive
    from normandy_core import Entry
    archive = Archive(sys.argv[1])
    archive.record([Entry(id="live", role="user", content="a live process's frame")],
                   session_id="live", index=False)
    print("spooled", flush=True)
    sys.stdin.readline()
    archive.close()  # moves it, and removes the file
    """
)


@pytest.mark.slow
def test_a_spool_file_is_owner_only_locked_and_removed_once_moved(tmp_path):
    old = os.umask(0)  # the most permissive umask: the spool must still be owner-only
    try:
        path = tmp_path / "archive.sqlite3"
        archive = Archive(path)
        archive.record(SESSION[:20], session_id="s", index=False)
        (spool,) = spool_files(path)
        assert stat.S_IMODE(spool.stat().st_mode) == 0o600
        assert len(read_frames(path)) == 1 and archive.count("s") > 0  # read before the move
        archive.index()  # moved, and the file emptied
        assert read_frames(path) == [] and spool.exists() and spool.stat().st_size == 0
        archive.close()  # empty: removed
        assert spool_files(path) == []
    finally:
        os.umask(old)
    # a live process's spool file is locked: another process's writer leaves it alone
    holder = start_holder(HOLDER, path, "spooled")
    try:
        writer = Archive(path)
        writer.record([Entry(id="w", role="user", content="writer")], session_id="w")
        assert [f.journal[1] for f in read_frames(path)] == ["live"]
        assert writer.count("live") == 1  # read from the live process's file
        writer.close()
    finally:
        assert release(holder) == 0
    assert spool_files(path) == [] and Archive(path).count("live") == 1


def test_what_an_archive_dropped_unclosed_spooled_is_moved_by_the_next_writer(tmp_path):
    path = tmp_path / "archive.sqlite3"
    dropped = Archive(path)
    cid = dropped.record(SESSION[:30], session_id="lost", index=False)
    del dropped  # never closed: its file is no longer locked
    assert len(spool_files(path)) == 1
    survivor = Archive(path)
    survivor.record([Entry(id="n", role="user", content="next")], session_id="n", index=False)
    survivor.index()
    assert survivor._spool is not None
    assert spool_files(path) == [survivor._spool.path]  # the dropped one's file removed
    assert read_frames(path) == []
    assert [c.compaction_id for c in survivor.compactions("lost")] == [str(cid)]
    assert survivor.count("lost") == cid.entries
    survivor.close()


def test_a_spool_file_removed_under_a_running_writer_is_written_again_whole(tmp_path):
    path = tmp_path / "archive.sqlite3"
    archive = Archive(path)
    archive.last_write = 0.0
    first = archive.record(SESSION[:20], session_id="s", index=False)
    (spool,) = spool_files(path)
    spool.unlink()  # a cleanup job, say: the frame is now only in memory
    second = archive.record(SESSION[20:40], session_id="s", index=False)
    (renewed,) = spool_files(path)
    assert renewed != spool
    # both frames in the new file, as a process killed now would leave them
    assert [f.compaction_id for f in read_frames(path)] == [str(first), str(second)]
    archive.index()
    assert archive.count("s") == first.entries + second.entries
    archive.close()


FORKED = textwrap.dedent(
    """
    import json, os, sys
    from normandy_archive import Archive
    from normandy_archive.spool import read_frames, spool_files
    from normandy_core import Entry
    path = sys.argv[1]
    archive = Archive(path)
    archive.record([Entry(id="p1", role="user", content="parent before fork")],
                   session_id="p", index=False)
    pid = os.fork()
    if pid == 0:  # the child: a file of its own; the parent's frame is not its to move
        archive.record([Entry(id="c1", role="user", content="child after fork")],
                       session_id="c", index=False)
        archive.index()
        os._exit(0)
    os.waitpid(pid, 0)
    after_child = len(read_frames(path))
    archive.index()
    print(json.dumps({"after_child": after_child, "files": len(spool_files(path)),
                      "p": archive.count("p"), "c": archive.count("c")}))
    archive.close()
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_child_made_by_fork_spools_into_a_file_of_its_own(tmp_path):
    path = tmp_path / "archive.sqlite3"
    out = python(FORKED, str(path)).stdout
    result = json.loads(out.strip().splitlines()[-1])
    # the child moved its own frame only; the parent's waited for the parent
    assert result == {"after_child": 1, "files": 1, "p": 1, "c": 1}


PRUNER = textwrap.dedent(
    """
    import sys
    from normandy_archive import Archive
    print(Archive(sys.argv[1]).prune(max_age_seconds=float(sys.argv[2])))
    """
)


@pytest.mark.slow
def test_content_dropped_again_is_not_lost_to_a_prune_before_the_move(tmp_path):
    """A spooled compaction that drops again content the archive holds writes it again:
    a prune by another process before the move (it cannot see the new drop) removes the
    old copy, and the move stores it anew, under the session that dropped it last."""
    path = tmp_path / "archive.sqlite3"
    entries = SESSION[:12]
    archive = Archive(path)
    archive.record(entries, session_id="old", at=1_000.0)  # stored, indexed
    stored = archive.count("old")
    again = archive.record(entries, session_id="new", index=False)  # spooled, not moved
    assert (again.entries, again.existing) == (0, len(entries))  # known to be there
    pruned = python(PRUNER, str(path), "86400").stdout
    assert int(pruned) == stored > 0 and archive.count("old") == 0  # gone from the tables
    archive.index()  # the move: what the prune removed is stored again
    kept = archive.list(limit=100)
    assert {a.entry.id for a in kept} == {e.id for e in entries}
    assert {a.session_id for a in kept} == {"new"}
    for a in kept:
        assert a.entry.model_dump_json() == a.entry_json
    archive.close()


_records = st.lists(
    st.tuples(
        st.sampled_from(["s1", "s2", "s3"]),
        st.integers(0, len(SESSION) - 1),
        st.integers(1, 30),
        st.booleans(),  # moved right after (index=True) or left to the background writer
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=25, deadline=None)
@given(records=_records)
def test_spooled_and_journaled_compactions_leave_the_same_archive(tmp_path_factory, records):
    """Whatever sequence of compactions (sessions, overlapping content, moved at once or
    not), the spool and the journal leave the same rows once moved: the same entries,
    numbers, bytes and sessions, and the same compactions with what they stored."""
    found = []
    for bound in (Archive.SPOOL_MAX_BYTES, 0):  # spooled frames, then journal rows
        path = tmp_path_factory.mktemp("same") / "archive.sqlite3"
        archive = Archive(path)
        archive.SPOOL_MAX_BYTES = bound
        for n, (session, start, count, now) in enumerate(records):
            archive.record(
                SESSION[start : start + count],
                session_id=session,
                compaction_id=f"c{n}",
                at=1_000.0 + n,
                index=now,
            )
        archive.index()
        found.append(
            (
                [
                    (a.seq, a.session_id, a.content_hash, a.entry_json)
                    for a in archive.list(limit=10**6)
                ],
                sorted((c.compaction_id, c.entry_count) for c in archive.compactions(limit=10**6)),
                archive.prune_plan(max_sessions=1).sessions,
            )
        )
        assert read_frames(path) == []
        archive.close()
    assert found[0] == found[1]


def test_a_spool_file_others_could_have_planted_is_neither_read_nor_moved(tmp_path):
    """In a directory others may write to, a file named like a spool file that another
    user owns, or that others may write, is left alone: its frames are not shown, nor
    moved into the archive."""
    path = tmp_path / "archive.sqlite3"
    archive = Archive(path)
    archive.record([Entry(id="real", role="user", content="real")], session_id="s")
    planted = [path.parent / f"{path.name}.spool-1-{n}" for n in ("writable", "foreign")]
    for p in planted:
        p.write_bytes(encode(_frame(7, SESSION[:3])))
    planted[0].chmod(0o666)
    if os.geteuid() == 0:  # another owner (root can give it away)
        os.chown(planted[1], 65534, 65534)
        planted[1].chmod(0o600)
    else:
        planted[1].unlink()
    assert spool_files(path) == [] and read_frames(path) == []
    archive.index()
    assert [a.entry.id for a in archive.list(limit=100)] == ["real"]
    assert planted[0].exists() and planted[1].exists() == (os.geteuid() == 0)  # untouched
    archive.close()


EXITING_AGENT = textwrap.dedent(
    """
    from normandy_core import AgentConfig, run_compaction
    from normandy_core.app.workload import generate_session
    acc = AgentConfig(
        model="gpt-4o", compactor="window_manager", session_id="exiting",
        compactor_opts={"context_window": 8_000, "reserved_tokens": 500, "target": 0.5,
                        "counter": "cl100k_base"},
    )
    done = 0
    for e in generate_session(17, 160):
        acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
        if e.role == "user" and e.tool_results:
            acc, meta = run_compaction(acc, mid_round=True)
            assert "error" not in meta and "hook_errors" not in meta, meta
            done += bool(meta["compacted"])
    print(done, flush=True)
    """
)


@pytest.mark.slow
def test_a_clean_exit_moves_what_it_spooled_once_a_lock_held_meanwhile_is_gone(tmp_path):
    """Another process holds the write lock while an agent compacts and exits: its
    compactions are spooled, its background writer gives up on the lock, and its exit
    moves them once the lock is free (waiting at most the busy timeout), then removes its
    spool file: a clean exit leaves every compaction in the archive file."""
    path = tmp_path / "archive.sqlite3"
    first = Archive(path)  # an archive exists (in WAL mode), so its lock can be held
    first.record([Entry(id="a", role="user", content="before")], session_id="before")
    first.close()
    holder = start_holder(LOCK_HOLDER, path, "locked")
    env = {**os.environ, "NORMANDY_ARCHIVE_PATH": str(path), "NORMANDY_ARCHIVE_BUSY_TIMEOUT": "20"}
    env.pop("NORMANDY_DISABLE_PLUGINS", None)
    agent = subprocess.Popen(
        [sys.executable, "-c", EXITING_AGENT], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert agent.stdout is not None
        compactions = int(agent.stdout.readline())  # all spooled; now it exits
        assert compactions > 0
        time.sleep(EXIT_LOCK_SECONDS)  # its background writer met the lock, and gave up
        assert len(read_frames(path)) == compactions  # none moved yet
    finally:
        assert release(holder) == 0
    assert agent.wait(timeout=60) == 0
    assert spool_files(path) == []
    conn = sqlite3.connect(path)  # in the file: its tables, or its journal (moved later)
    try:
        moved = conn.execute(
            "SELECT (SELECT count(*) FROM compactions) + (SELECT count(*) FROM journal)"
        ).fetchone()[0]
    finally:
        conn.close()
    assert moved == compactions + 1  # and the one written before


@pytest.mark.skipif(fcntl is None, reason="no flock: compactions are written directly")
def test_a_new_spool_file_is_never_seen_unlocked(tmp_path, monkeypatch):
    """Another process looking for ended processes' spool files (to move them) may scan
    between a new spool file's creation and its lock: it took the lock first, and the
    compaction was refused with "Resource temporarily unavailable" (found by
    test_processes_creating_a_new_archive_at_once_all_get_to_write). A spool file now
    appears under its name already locked. The other process's scan is run here, holding
    what it could lock, at the moment the file is made."""
    from normandy_archive import spool as spool_module

    path = tmp_path / "archive.sqlite3"
    archive = Archive(path)
    archive.record(SESSION[:3], session_id="first", index=True)  # no spool file yet
    real_open = os.open
    scans: list[list[str]] = []
    held: list[int] = []

    def open_then_scan(file, flags, *args):
        fd = real_open(file, flags, *args)
        if flags & os.O_CREAT and ".spool" in os.fspath(file):  # another process scans now
            found = []
            for other in spool_module.spool_files(path):
                ofd = real_open(other, os.O_RDONLY)
                try:
                    fcntl.flock(ofd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a live process's: left alone
                    os.close(ofd)
                    continue
                held.append(ofd)  # taken for an ended process's, and held while moved
                found.append(other.name)
            scans.append(found)
        return fd

    monkeypatch.setattr(os, "open", open_then_scan)
    try:
        archive.record(SESSION[3:9], session_id="s", index=False)
    finally:
        monkeypatch.undo()
        for fd in held:
            os.close(fd)
    assert scans and scans[-1] == []  # the scan never saw the new file unlocked
    (spool,) = spool_files(path)
    fd = os.open(spool, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # its process holds it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert [f.journal[1] for f in read_frames(path)] == ["s"]
    archive.close()

"""Two processes opening a new archive at once: the second never takes it for a stranger's,
and never commits into a log its creator removes.

An archive's version and tables were read in two statements; a writer creating the
schema between them made the new archive look like another application's file
(``user_version`` 0 with tables), and the agent's compaction was refused. Seen once in
test_archive_crash.py's concurrent agents; reproduced here deterministically.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_counts import HELD_CREATOR_ROUNDS, NEW_ARCHIVE_ROUNDS, NEW_ARCHIVE_WRITERS

from normandy_archive import Archive, schema
from normandy_archive.store import _archive_version


class _CreatesBetweenReads:
    """A connection that lets another writer create the schema between two statements."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path
        self.done = False

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if "sqlite_master" in sql and not self.done:
            self.done = True
            other = sqlite3.connect(self.path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            schema.create(other)
            other.execute("COMMIT")
            other.close()
        return self.conn.execute(sql, *args)


def test_a_schema_created_between_the_two_reads_is_not_taken_for_a_strangers(tmp_path):
    path = tmp_path / "archive.sqlite3"
    first = sqlite3.connect(path, isolation_level=None)
    assert first.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
    first.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # one snapshot: the archive was still empty when the reads began
        assert _archive_version(_CreatesBetweenReads(conn, str(path)), path) == 0
        assert not conn.in_transaction
        assert _archive_version(conn, path) == schema.SCHEMA_VERSION
    finally:
        conn.close()
    # and the archive the other writer created is usable
    archive = Archive(path)
    try:
        assert archive.count() == 0
    finally:
        archive.close()


OPENER = textwrap.dedent(
    """
    import os, sys, time
    from normandy_archive import Archive
    from normandy_core import Entry
    path, start = sys.argv[1], float(sys.argv[2])
    archive = Archive(path)
    time.sleep(max(0.0, start - time.time()))  # all at once
    archive.record([Entry(id=f"e{os.getpid()}", role="user", content=f"c{os.getpid()}")],
                   session_id="s", index=False)
    """
)


@pytest.mark.slow
def test_processes_creating_a_new_archive_at_once_all_get_to_write(tmp_path):
    """Four processes write their first compaction to a new archive at the same moment:
    switching the new file to WAL, SQLite answered "database is locked" at once, without
    its busy wait, to all but one (in 16 to 19 rounds of 40), and their compactions were
    refused with a message saying the lock was held past the busy timeout. Each now waits
    for it (at most the busy timeout) like any other lock."""
    for round_ in range(NEW_ARCHIVE_ROUNDS):
        path = tmp_path / f"round-{round_}" / "archive.sqlite3"
        start = time.time() + 1.0
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, str(path), str(start)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(NEW_ARCHIVE_WRITERS)
        ]
        errors = [p.communicate(timeout=60)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * NEW_ARCHIVE_WRITERS, "\n".join(errors)
        archive = Archive(path)
        assert archive.count("s") == NEW_ARCHIVE_WRITERS
        archive.close()


#: Creates a new archive with its first compaction, held up (``argv[2]`` s) after creating
#: the file and before removing a deleted archive's -wal beside it.
SLOW_CREATOR = textwrap.dedent(
    """
    import os, sys, time
    real = os.unlink
    def late(p, *a, **k):
        if str(p).endswith("-wal"):
            print("created", flush=True)
            time.sleep(float(sys.argv[2]))
        return real(p, *a, **k)
    os.unlink = late
    from normandy_archive import Archive
    from normandy_core import Entry
    archive = Archive(sys.argv[1])
    archive.record([Entry(id="c1", role="user", content="the creator's compaction")],
                   session_id="creator", index=False)
    archive.close()
    """
)
#: Records one compaction in the archive named, says so, and waits to be killed.
WRITER = textwrap.dedent(
    """
    import sys, time
    from normandy_archive import Archive
    from normandy_core import Entry
    archive = Archive(sys.argv[1])
    archive.record([Entry(id="w1", role="user", content="the other writer's compaction")],
                   session_id="writer", index=False)
    print("recorded", flush=True)
    time.sleep(120)
    """
)


@pytest.mark.slow
def test_a_writer_never_commits_into_the_log_a_new_archives_creator_removes(tmp_path):
    """Found by the crash campaign (seed 5302, round 416): a process created the new
    archive's file, and before it removed a deleted archive's -wal beside it, another
    found the file, opened it and committed its compaction into a new -wal; the creator
    then removed that log, and the second process, killed, lost a compaction it had
    reported done. Creating the file and removing what lay beside it is now one step
    under the directory's lock, which a writer looking for the file takes too."""
    for round_ in range(HELD_CREATOR_ROUNDS):
        path = tmp_path / f"round-{round_}" / "archive.sqlite3"
        _held_creator_and_killed_writer(path)
        archive = Archive(path)
        try:
            sessions = sorted(e.session_id for e in archive.list())
        finally:
            archive.close()
        assert sessions == ["creator", "writer"], f"round {round_}"


def _held_creator_and_killed_writer(path: Path) -> None:
    """Run :data:`SLOW_CREATOR` at ``path`` and, while it is held up, :data:`WRITER`,
    SIGKILLed once the creator is done and it said it recorded."""
    creator = subprocess.Popen(
        [sys.executable, "-c", SLOW_CREATOR, str(path), "3"], stdout=subprocess.PIPE, text=True
    )
    assert creator.stdout is not None and creator.stdout.readline().strip() == "created"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "recorded"
        assert creator.wait(timeout=60) == 0
    finally:
        writer.kill()  # SIGKILL: what it committed must be in the archive already
        writer.wait(timeout=60)
        creator.kill()
        creator.wait(timeout=60)

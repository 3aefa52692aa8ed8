"""Two processes opening a new archive at once: the second never takes it for a stranger's.

An archive's version and tables were read in two statements; a writer creating the
schema between them made the new archive look like another application's file
(``user_version`` 0 with tables), and the agent's compaction was refused. Seen once in
test_archive_crash.py's concurrent agents; reproduced here deterministically.
"""

from __future__ import annotations

import sqlite3
from typing import Any

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

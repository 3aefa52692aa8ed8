"""The one-time move of an archive an earlier version wrote: its journal and spool files.

Before issue 31, a compaction was committed as a *frame* appended to its process's spool
file beside the archive (``<archive>.spool-<pid>-<random>``) or as a row of the
``journal`` table, and moved into the tables later. Nothing writes either now: the first
writer that opens such an archive moves what is left (:func:`move_left`), in one
transaction, into the tables, and removes the spool files it moved. A spool file that
another process still holds (locked: an agent of the earlier version still running) is
left for a later writer; one whose frames cannot all be read (damaged), or that others
may write, is kept and named in a warning rather than silently dropped.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import os
import sqlite3
import stat
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normandy_archive.schema import COMPACTION_COLUMNS, ENTRY_COLUMNS, SEEN_SQL

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["Frame", "decode", "move_journal", "move_left", "spool_files"]

log = logging.getLogger("normandy_archive")

MAGIC = b"NSP1"
_HEAD = struct.Struct("<4sIII")
#: What a spool file's name adds to the archive's.
SUFFIX = ".spool-"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_EUID = os.geteuid() if hasattr(os, "geteuid") else 0

#: A ``journal_entries`` row without its journal row's id: entry id, content hash, turn
#: id, role, the entry's JSON, its caller's ids as JSON.
EntryRow = tuple[str, str, "str | None", str, str, "str | None"]

#: The journal as the earlier version made it (a frame is one of its rows): created here
#: only when spool files are moved into an archive that lost it.
JOURNAL_TABLE = """CREATE TABLE IF NOT EXISTS journal (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        compaction_id TEXT NOT NULL,
        session_id    TEXT NOT NULL,
        compactor     TEXT,
        strategy      TEXT,
        model         TEXT,
        mid_round     INTEGER,
        created_at    REAL NOT NULL,
        tokens_before INTEGER,
        tokens_after  INTEGER,
        meta_json     TEXT NOT NULL,
        dropped_count INTEGER,
        entry_count   INTEGER NOT NULL,
        seen          TEXT
    )"""

JOURNAL_ENTRIES_TABLE = """CREATE TABLE IF NOT EXISTS journal_entries (
        jid           INTEGER NOT NULL,
        entry_id      TEXT NOT NULL,
        content_hash  TEXT NOT NULL,
        turn_id       TEXT,
        role          TEXT NOT NULL,
        entry_json    TEXT NOT NULL,
        source_ids    TEXT
    )"""


_JOURNAL_INSERT = (
    "INSERT INTO journal (compaction_id, session_id, compactor, strategy, model, mid_round, "
    "created_at, tokens_before, tokens_after, meta_json, dropped_count, entry_count, seen) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_ENTRIES_INSERT = (
    "INSERT INTO journal_entries (jid, entry_id, content_hash, turn_id, role, entry_json, "
    "source_ids) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


@dataclass(frozen=True)
class Frame:
    """One compaction as the spool holds it."""

    journal: tuple[Any, ...]
    """Its ``journal`` row without ``id`` and ``entry_count``: compaction id, session,
    compactor, strategy, model, mid-round flag, time, tokens before and after, the meta's
    JSON, dropped count, and ``seen`` (a JSON array of the hashes of content it dropped
    again while that content was still in the journal, or ``None``)."""
    entries: tuple[EntryRow, ...]
    """The content it dropped (but what is named in ``seen``), as ``journal_entries``
    rows without the journal row's id."""

    @property
    def compaction_id(self) -> str:
        """The id of the compaction it commits."""
        return str(self.journal[0])


def decode(data: bytes) -> tuple[list[Frame], int]:
    """The whole frames at the start of ``data``, and how many bytes they take: a torn or
    damaged frame ends them."""
    frames: list[Frame] = []
    pos = 0
    while pos + _HEAD.size <= len(data):
        magic, head_size, body_size, crc = _HEAD.unpack_from(data, pos)
        start = pos + _HEAD.size
        end = start + head_size + body_size
        if magic != MAGIC or end > len(data):
            break
        head = data[start : start + head_size]
        body = data[start + head_size : end]
        if zlib.crc32(body, zlib.crc32(head)) != crc:
            break
        try:
            journal, sizes = json.loads(head)
            text = body.decode()
            entries: list[EntryRow] = []
            at = 0
            for size in sizes:
                entries.append(_row(text[at : at + size]))
                at += size
        except (ValueError, TypeError, UnicodeDecodeError):
            break
        frames.append(Frame(tuple(journal), tuple(entries)))
        pos = end
    return frames, pos


def _row(data: str) -> EntryRow:
    """The ``journal_entries`` row of the entry whose JSON is ``data``, as it was written."""
    from normandy_archive.base import entry_row
    from normandy_archive.schema import source_ids
    from normandy_core import Entry

    entry = Entry.model_validate_json(data)
    return entry_row(entry, data, source_ids(entry))


def spool_files(archive: str | os.PathLike[str]) -> list[Path]:
    """The spool files of the archive at ``archive``, by name: regular files (not links)
    of this user that no one else may write (in a directory others may write to, a file
    planted there is not read, nor moved into the archive)."""
    archive = Path(archive)
    prefix = archive.name + SUFFIX
    try:
        with os.scandir(archive.parent) as found:
            return sorted(
                Path(e.path)
                for e in found
                if e.name.startswith(prefix) and e.is_file(follow_symlinks=False) and _ours(e)
            )
    except (FileNotFoundError, NotADirectoryError):
        return []


def _ours(entry: os.DirEntry[str]) -> bool:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    if st.st_uid != _EUID:
        return False
    if st.st_mode & 0o022:
        log.warning(
            "spool file %s has mode %04o (others may write it): not moved into the archive; "
            "if it is yours and trusted, chmod 600 it",
            entry.path,
            stat.S_IMODE(st.st_mode),
        )
        return False
    return True


def _read(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def in_order(files: Sequence[list[Frame]]) -> list[Frame]:
    """The frames of several spool files as one list: each file's in its order, the
    files' merged by compaction time."""
    return list(heapq.merge(*files, key=lambda f: f.journal[6]))


@contextlib.contextmanager
def orphans(archive: Path) -> Iterator[list[Frame]]:
    """The frames of the spool files of ``archive`` no live process holds (their process
    ended before it moved them), in order, the files locked; when the block ends without
    error (the caller has moved the frames), the files read whole are removed, and a
    damaged one is kept and named in a warning."""
    held: list[tuple[Path, int, list[Frame], bool]] = []
    try:
        for path in spool_files(archive):
            try:
                fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
            except OSError:
                continue
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_nlink == 0:  # another writer moved it first
                    raise BlockingIOError
            except OSError:  # held by its live process
                os.close(fd)
                continue
            data = _read(fd)
            frames, used = decode(data)
            held.append((path, fd, frames, used == len(data)))
        yield in_order([frames for _, _, frames, _ in held])
        for path, _, frames, whole in held:
            if whole:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            else:
                log.warning(
                    "spool file %s is damaged after its frame %d: the frames before it are "
                    "moved into the archive, the file is kept",
                    path,
                    len(frames),
                )
    finally:
        for _, fd, _, _ in held:
            os.close(fd)


def _insert_frames(conn: sqlite3.Connection, frames: Sequence[Frame]) -> None:
    """Write ``frames`` into the journal (inside the caller's transaction), each a journal
    row with its entries; a frame whose compaction the archive holds already (moved
    before its file was removed) is skipped."""
    for f in frames:
        j = f.journal
        held = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM journal WHERE compaction_id = ?1) OR EXISTS "
            "(SELECT 1 FROM compactions WHERE compaction_id = ?1)",
            (j[0],),
        ).fetchone()[0]
        if held or (not f.entries and j[11] is None):
            continue
        jid = conn.execute(_JOURNAL_INSERT, (*j[:11], len(f.entries), j[11])).lastrowid
        conn.executemany(_ENTRIES_INSERT, [(jid, *e) for e in f.entries])


def _has_journal(conn: sqlite3.Connection) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'journal'"
    ).fetchone()
    return row is not None


def move_left(conn: sqlite3.Connection, path: Path) -> None:
    """Move what an earlier version left in the archive open on ``conn`` at ``path`` (its
    journal's rows, the frames of its spool files no live process holds) into the
    tables, in one transaction. A failure loses nothing (it stays where it was, and the
    next writer tries again): it is logged."""
    try:
        journal = _has_journal(conn)
        if not journal and not spool_files(path):
            return
        with orphans(path) as frames:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(JOURNAL_TABLE)
                conn.execute(JOURNAL_ENTRIES_TABLE)
                _insert_frames(conn, frames)
                moved = move_journal(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        if moved:
            log.info("archive %s: moved %d compactions an earlier version left", path, moved)
    except (sqlite3.Error, OSError) as exc:
        log.warning("archive %s: what an earlier version left is moved later: %s", path, exc)


#: The rows of the journal up to id ``?1`` as rows of ``entries`` (``ENTRY_COLUMNS``):
#: content neither in ``entries`` nor in an earlier journal row, in journal order, each
#: with the ``seq`` it is given.
_PENDING_SQL = """SELECT coalesce((SELECT seq FROM main.sqlite_sequence WHERE name = 'entries'), 0)
            + row_number() OVER (ORDER BY p.jid, p.k) AS seq,
        p.session_id, p.entry_id, p.content_hash, p.turn_id, p.role, p.entry_json,
        p.source_ids, p.compaction_id, p.archived_at
    FROM (SELECT j.id AS jid, r.rowid AS k, j.session_id, r.entry_id, r.content_hash,
            r.turn_id, r.role, r.entry_json, r.source_ids, j.compaction_id,
            j.created_at AS archived_at,
            row_number() OVER (PARTITION BY r.content_hash ORDER BY j.id, r.rowid) AS nth
        FROM main.journal_entries r JOIN main.journal j ON j.id = r.jid WHERE j.id <= ?1) p
    WHERE p.nth = 1
        AND NOT EXISTS (SELECT 1 FROM main.entries x WHERE x.content_hash = p.content_hash)"""


def move_journal(conn: sqlite3.Connection, rows: int = 0) -> int:
    """Move the oldest ``rows`` journal rows (0: all) into the indexed tables (inside the
    caller's transaction): their new content into ``entries`` (with the ``seq`` readers
    saw), each compaction that stored some into ``compactions`` with what it stored, the
    ``seen`` of content dropped again; how many journal rows were moved."""
    first, last = conn.execute("SELECT min(id), max(id) FROM journal").fetchone()
    if first is None:
        return 0
    top = last if rows <= 0 else min(last, first + rows - 1)
    before = conn.execute(
        "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'entries'), 0)"
    ).fetchone()[0]
    conn.execute(f"INSERT INTO entries ({ENTRY_COLUMNS}) {_PENDING_SQL}", (top,))
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS journal_moved (compaction_id TEXT PRIMARY KEY, n INTEGER) "
        "WITHOUT ROWID"
    )
    conn.execute(
        "INSERT INTO temp.journal_moved SELECT compaction_id, count(*) FROM entries WHERE seq > ? "
        "GROUP BY compaction_id",
        (before,),
    )
    conn.execute(
        f"INSERT OR IGNORE INTO compactions ({COMPACTION_COLUMNS}) "
        "SELECT j.compaction_id, j.session_id, j.compactor, j.strategy, j.model, "
        "j.mid_round, j.created_at, m.n, j.tokens_before, j.tokens_after, j.meta_json, "
        "j.dropped_count FROM journal j "
        "JOIN temp.journal_moved m ON m.compaction_id = j.compaction_id "
        "WHERE j.id <= ? ORDER BY j.id",
        (top,),
    )
    conn.execute("DELETE FROM temp.journal_moved")
    again = conn.execute(
        "SELECT j.session_id, j.created_at, h.value FROM journal j, json_each(j.seen) h "
        "WHERE j.id <= ? AND j.seen IS NOT NULL ORDER BY j.id",
        (top,),
    ).fetchall()
    # content a later journal row held again (written by another process before the
    # first was moved): the later session saw it last
    again += conn.execute(
        "SELECT j.session_id, j.created_at, r.content_hash FROM journal_entries r "
        "JOIN journal j ON j.id = r.jid WHERE j.id <= ? AND NOT EXISTS (SELECT 1 FROM "
        "entries e WHERE e.content_hash = r.content_hash AND e.compaction_id = j.compaction_id) "
        "ORDER BY j.id",
        (top,),
    ).fetchall()
    if again:
        again.sort(key=lambda row: row[1])
        conn.executemany(SEEN_SQL, again)
    conn.execute("DELETE FROM journal_entries WHERE jid <= ?", (top,))
    conn.execute("DELETE FROM journal WHERE id <= ?", (top,))
    return int(conn.execute("SELECT changes()").fetchone()[0])

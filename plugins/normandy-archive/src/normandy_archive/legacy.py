"""The one-time move of what an earlier version left beside an archive: journal rows and
spool files.

Before issue 31 a compaction was committed as a frame of its process's spool file
(``<archive>.spool-<pid>-<random>``) or as a row of the ``journal`` table, and moved into
the tables later. The first writer that opens such an archive moves both into the tables
in one transaction (:func:`move_left`) and removes the spool files it read whole. A spool
file a live process holds (locked) is left for a later writer; a damaged one, or one
others may write, is kept and named in a warning rather than dropped silently.
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
from pathlib import Path
from typing import Any, NamedTuple

from normandy_archive.schema import COMPACTION_COLUMNS, ENTRY_COLUMNS, SEEN_SQL

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["Frame", "decode", "move_left", "spool_files"]

log = logging.getLogger("normandy_archive")

#: A frame's head: the magic ``NSP1``, the sizes of its JSON head and body, their CRC-32.
_HEAD = struct.Struct("<4sIII")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_EUID = os.geteuid() if hasattr(os, "geteuid") else 0

#: The ``journal`` columns but ``id``, in the order of a frame's journal row; the earlier
#: version's tables are created (untyped: they only stage the move) for spool files
#: found beside an archive that has none.
_JOURNAL = (
    "compaction_id, session_id, compactor, strategy, model, mid_round, created_at, "
    "tokens_before, tokens_after, meta_json, dropped_count, entry_count, seen"
)
_JOURNAL_ENTRIES = "jid, entry_id, content_hash, turn_id, role, entry_json, source_ids"


class Frame(NamedTuple):
    """One compaction as a spool file holds it."""

    journal: tuple[Any, ...]
    """Its ``journal`` row (:data:`_JOURNAL`) without ``entry_count``."""
    entries: tuple[tuple[Any, ...], ...]
    """The content it dropped (but what its ``seen`` names), ``journal_entries`` rows
    without ``jid``."""


def decode(data: bytes) -> tuple[list[Frame], int]:
    """The whole frames at the start of ``data``, and how many bytes they take: a torn or
    damaged frame ends them."""
    from normandy_archive.base import entry_row
    from normandy_archive.schema import source_ids
    from normandy_core import Entry

    frames: list[Frame] = []
    pos = 0
    while pos + _HEAD.size <= len(data):
        magic, head_size, body_size, crc = _HEAD.unpack_from(data, pos)
        start = pos + _HEAD.size
        end = start + head_size + body_size
        if magic != b"NSP1" or end > len(data) or zlib.crc32(data[start:end]) != crc:
            break
        try:
            journal, sizes = json.loads(data[start : start + head_size])
            text = data[start + head_size : end].decode()
            rows, at = [], 0
            for size in sizes:
                row_json, at = text[at : at + size], at + size
                entry = Entry.model_validate_json(row_json)
                rows.append(entry_row(entry, row_json, source_ids(entry)))
        except (ValueError, TypeError, UnicodeDecodeError):
            break
        frames.append(Frame(tuple(journal), tuple(rows)))
        pos = end
    return frames, pos


def spool_files(archive: str | os.PathLike[str]) -> list[Path]:
    """The spool files of the archive at ``archive``, by name: regular files (not links) of
    this user that no one else may write (a file planted in a shared directory is never
    moved into the archive)."""
    archive = Path(archive)
    prefix = archive.name + ".spool-"
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


def _read_locked(path: Path, held: contextlib.ExitStack) -> bytes | None:
    """The bytes of the spool file at ``path``, locked until ``held`` closes; ``None`` when
    its live process holds it, or another writer moved it first."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except OSError:
        return None
    held.callback(os.close, fd)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_nlink == 0:  # another writer moved it first
            return None
    except OSError:  # held by its live process
        return None
    with open(fd, "rb", closefd=False) as f:
        return f.read()


@contextlib.contextmanager
def _orphans(archive: Path) -> Iterator[list[Frame]]:
    """The frames of the spool files of ``archive`` no live process holds, in compaction
    time order, the files locked; once the block ends without error (the frames are
    moved), the files read whole are removed and a damaged one is named in a warning."""
    read: list[tuple[Path, list[Frame], bool]] = []
    with contextlib.ExitStack() as held:
        for path in spool_files(archive):
            data = _read_locked(path, held)
            if data is not None:
                frames, used = decode(data)
                read.append((path, frames, used == len(data)))
        yield list(heapq.merge(*(frames for _, frames, _ in read), key=lambda f: f.journal[6]))
        for path, frames, whole in read:
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


def _insert_frames(conn: sqlite3.Connection, frames: Sequence[Frame]) -> None:
    """Write ``frames`` into the journal, but those whose compaction is there already
    (moved before the file was removed) or that hold nothing."""
    for f in frames:
        j = f.journal
        held = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM journal WHERE compaction_id = ?1) OR EXISTS "
            "(SELECT 1 FROM compactions WHERE compaction_id = ?1)",
            (j[0],),
        ).fetchone()[0]
        if held or (not f.entries and j[11] is None):
            continue
        jid = conn.execute(
            f"INSERT INTO journal ({_JOURNAL}) VALUES ({', '.join('?' * 13)})",
            (*j[:11], len(f.entries), j[11]),
        ).lastrowid
        conn.executemany(
            f"INSERT INTO journal_entries ({_JOURNAL_ENTRIES}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(jid, *e) for e in f.entries],
        )


def move_left(conn: sqlite3.Connection, path: Path) -> None:
    """Move what an earlier version left in the archive open on ``conn`` at ``path`` (its
    journal rows, the frames of spool files no live process holds) into the tables, in
    one transaction. A failure is logged and loses nothing: the next writer tries again."""
    try:
        journal = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'journal'"
        ).fetchone()
        if journal is None and not spool_files(path):
            return
        with _orphans(path) as frames:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS journal (id INTEGER PRIMARY KEY, {_JOURNAL})"
                )
                conn.execute(f"CREATE TABLE IF NOT EXISTS journal_entries ({_JOURNAL_ENTRIES})")
                _insert_frames(conn, frames)
                moved = _move_journal(conn)
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


#: The journal's rows as rows of ``entries``: the content neither in ``entries`` nor in an
#: earlier journal row, in journal order, each with the ``seq`` it is given.
_PENDING_SQL = """SELECT coalesce((SELECT seq FROM main.sqlite_sequence WHERE name = 'entries'), 0)
            + row_number() OVER (ORDER BY p.jid, p.k) AS seq,
        p.session_id, p.entry_id, p.content_hash, p.turn_id, p.role, p.entry_json,
        p.source_ids, p.compaction_id, p.archived_at
    FROM (SELECT j.id AS jid, r.rowid AS k, j.session_id, r.entry_id, r.content_hash,
            r.turn_id, r.role, r.entry_json, r.source_ids, j.compaction_id,
            j.created_at AS archived_at,
            row_number() OVER (PARTITION BY r.content_hash ORDER BY j.id, r.rowid) AS nth
        FROM main.journal_entries r JOIN main.journal j ON j.id = r.jid) p
    WHERE p.nth = 1
        AND NOT EXISTS (SELECT 1 FROM main.entries x WHERE x.content_hash = p.content_hash)"""


def _move_journal(conn: sqlite3.Connection) -> int:
    """Move the journal into the tables (in the caller's transaction): its new content
    into ``entries``, each compaction that stored some into ``compactions`` with how
    much, the ``seen`` of content dropped again; how many journal rows were moved."""
    before = conn.execute(
        "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'entries'), 0)"
    ).fetchone()[0]
    conn.execute(f"INSERT INTO entries ({ENTRY_COLUMNS}) {_PENDING_SQL}")
    conn.execute(
        "WITH moved AS (SELECT compaction_id, count(*) AS n FROM entries WHERE seq > ? "
        f"GROUP BY compaction_id) INSERT OR IGNORE INTO compactions ({COMPACTION_COLUMNS}) "
        "SELECT j.compaction_id, j.session_id, j.compactor, j.strategy, j.model, "
        "j.mid_round, j.created_at, m.n, j.tokens_before, j.tokens_after, j.meta_json, "
        "j.dropped_count FROM journal j JOIN moved m ON m.compaction_id = j.compaction_id "
        "ORDER BY j.id",
        (before,),
    )
    again = conn.execute(
        "SELECT j.session_id, j.created_at, h.value FROM journal j, json_each(j.seen) h "
        "WHERE j.seen IS NOT NULL ORDER BY j.id"
    ).fetchall()
    # content a later journal row held again (written by another process before the
    # first was moved): the later session saw it last
    again += conn.execute(
        "SELECT j.session_id, j.created_at, r.content_hash FROM journal_entries r "
        "JOIN journal j ON j.id = r.jid WHERE NOT EXISTS (SELECT 1 FROM entries e "
        "WHERE e.content_hash = r.content_hash AND e.compaction_id = j.compaction_id) "
        "ORDER BY j.id"
    ).fetchall()
    again.sort(key=lambda row: row[1])
    conn.executemany(SEEN_SQL, again)
    conn.execute("DELETE FROM journal_entries")
    return conn.execute("DELETE FROM journal").rowcount

"""The one-time move of what an earlier version left beside an archive: journal rows and
spool files.

Before issue 31 a compaction was committed as a frame of its process's spool file
(``<archive>.spool-<pid>-<random>``) or as a row of the ``journal`` table, and moved into
the tables later. The first writer that opens such an archive moves both into the tables
in one transaction (:func:`move_left`), each compaction as a compaction is written now
(:func:`~normandy_archive.schema.store`), and removes the spool files it read whole. A
spool file a live process holds (locked) is left for a later writer; a damaged one, or
one others may write, is kept and named in a warning rather than dropped silently.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import stat
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from normandy_archive.base import CompactionRecord, entry_row
from normandy_archive.schema import rollback, source_ids, store
from normandy_core import Entry

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["Frame", "decode", "move_left", "spool_files"]

log = logging.getLogger("normandy_archive")

#: A frame's head: the magic ``NSP1``, the sizes of its JSON head and body, their CRC-32.
_HEAD = struct.Struct("<4sIII")
_OPEN = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_EUID = os.geteuid() if hasattr(os, "geteuid") else 0
#: The ``journal`` columns a compaction is rebuilt from, in a frame's order.
_JOURNAL = (
    "compaction_id, session_id, compactor, strategy, model, mid_round, created_at, "
    "tokens_before, tokens_after, meta_json, dropped_count, seen"
)


#: One compaction as the earlier version committed it (a spool frame, a journal row): its
#: ``journal`` columns (:data:`_JOURNAL`; ``seen``, a JSON array of the hashes of the
#: content it dropped that the archive held already) and the ``entries`` rows of the rest.
Frame = tuple[tuple[Any, ...], list[tuple[Any, ...]]]


def decode(data: bytes) -> tuple[list[Frame], int]:
    """The whole frames at the start of ``data``, and how many bytes they take: a torn or
    damaged frame ends them."""
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
        frames.append((tuple(journal), rows))
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


@contextlib.contextmanager
def _orphans(files: list[Path]) -> Iterator[list[Frame]]:
    """The frames of the spool ``files`` no live process holds (it holds a lock on its
    own), the files locked; once the block ends without error (the frames are moved), the
    files read whole are removed and a damaged one is named in a warning."""
    read: list[tuple[Path, list[Frame], bool]] = []
    with contextlib.ExitStack() as held:
        for path in files:
            try:
                fd = os.open(path, _OPEN)
                held.callback(os.close, fd)
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # moved by another writer, or held by its live process
                continue
            if os.fstat(fd).st_nlink:  # none: another writer moved it first
                with open(fd, "rb", closefd=False) as f:
                    data = f.read()
                frames, used = decode(data)
                read.append((path, frames, used == len(data)))
        yield [f for _, frames, _ in read for f in frames]
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


def _journal(conn: sqlite3.Connection) -> list[Frame]:
    """The journal's rows, in their order, each with its entries."""
    entries: dict[int, list[tuple[Any, ...]]] = {}
    for jid, *row in conn.execute(
        "SELECT jid, entry_id, content_hash, turn_id, role, entry_json, source_ids "
        "FROM journal_entries ORDER BY rowid"
    ):
        entries.setdefault(jid, []).append(tuple(row))
    rows = conn.execute(f"SELECT id, {_JOURNAL} FROM journal ORDER BY id")
    return [(tuple(j[1:]), entries.get(j[0], [])) for j in rows]


def _move(conn: sqlite3.Connection, frames: list[Frame]) -> int:
    """Write ``frames`` (in the caller's transaction) but those whose compaction is there
    already (moved before its file was removed); how many were written."""
    moved = 0
    for (*head, before, after, meta, n, seen), rows in frames:
        if conn.execute("SELECT 1 FROM compactions WHERE compaction_id = ?", head[:1]).fetchone():
            continue
        record = CompactionRecord(*(*head, 0, before, after, n))
        store(conn, rows, record, meta, json.loads(seen) if seen else ())
        moved += 1
    return moved


def move_left(conn: sqlite3.Connection, path: Path) -> None:
    """Move what an earlier version left in the archive open on ``conn`` at ``path`` (its
    journal rows, the frames of spool files no live process holds) into the tables, in
    one transaction. A failure is logged and loses nothing: the next writer tries again."""
    try:
        journal = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'journal'"
        ).fetchone()
        files = spool_files(path)
        if journal is None and not files:
            return
        with _orphans(files) as frames:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # the journal's rows in their order, then the frames in compaction time order
                left = _journal(conn) if journal else []
                moved = _move(conn, [*left, *sorted(frames, key=lambda f: f[0][6])])
                if journal:
                    conn.execute("DELETE FROM journal_entries")
                    conn.execute("DELETE FROM journal")
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)
                raise
        if moved:
            log.info("archive %s: moved %d compactions an earlier version left", path, moved)
    except (sqlite3.Error, OSError) as exc:
        log.warning("archive %s: what an earlier version left is moved later: %s", path, exc)

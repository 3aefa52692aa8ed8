"""The SQLite archive of dropped entries: one transaction per compaction, WAL, owner-only files.

A compaction commits the content the archive does not hold yet in one ``BEGIN IMMEDIATE``
transaction into the tables (:mod:`normandy_archive.schema`): it is then *committed*. The
background writer indexes it for full-text search and it is *indexed*; reads scan the
committed rows past the indexed-up-to mark, and never write (``mode=ro``). An archive an
earlier version left with a journal or spool files is moved into the tables by the first
writer that opens it (:mod:`normandy_archive.legacy`).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from normandy_archive import legacy, schema
from normandy_archive.base import (
    MAX_ROWS,
    ArchiveBackend,
    ArchivedEntry,
    CompactionRecord,
    Dialect,
    Limits,
    Prepared,
    Recorded,
    Run,
    Search,
    prepare,
    searchable_text,
)
from normandy_archive.errors import ArchiveError, ArchiveQueryError, NotAnArchiveError
from normandy_archive.schema import SCHEMA_VERSION, rollback
from normandy_archive.settings import archive_path, current_settings
from normandy_archive.vectors import HeldSessions, pack_parts
from normandy_core.conversation.stems import WORD, stem_text

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MAX_ROWS",
    "Archive",
    "ArchiveBusyError",
    "ArchivedEntry",
    "CompactionRecord",
    "Recorded",
    "prepare",
    "searchable_text",
]

T = TypeVar("T")
log = logging.getLogger("normandy_archive")

#: Milliseconds a background transaction waits for another process's write lock.
_BACKGROUND_WAIT_MS = 20
#: Rows written but not indexed yet, and one term found in a row's searchable text.
_UNINDEXED = "e.seq > (SELECT value FROM archive_state WHERE key = 'indexed_seq') AND "
_CONTAINS = f"instr(lower({schema.TEXT_SQL}), lower(?)) > 0"
#: One term's stems (``' stem stem '``) found among a row's stems.
_CONTAINS_STEMS = f"instr(' ' || {schema.INDEXED_SQL} || ' ', ?) > 0"
#: Errors SQLite gives for a full-text query it cannot parse (with ``raw``).
_QUERY_ERRORS = ("fts5:", "unterminated string", "no such column", "unknown special query")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: What a symbolic link at the path is refused for, when reading and when writing.
_FOLLOW = "follow it (point the archive path at the file itself)"
_THROUGH = "write through it (point the archive path at a regular file)"


def _runner(conn: sqlite3.Connection) -> Run:
    """``conn``'s statements as a :data:`~normandy_archive.base.Run`."""
    return lambda q, p: conn.execute(q, p).fetchall()


#: The FTS5 operators a raw query may hold: not words, so not stemmed.
_FTS5_OPERATORS = frozenset({"AND", "OR", "NOT", "NEAR"})


class ArchiveBusyError(ArchiveError):
    """Another process holds the archive's write lock (background work tries later)."""


def _regular(path: str | Path, what: str, refusal: str) -> os.stat_result | None:
    """The file's status, not followed (``None``: none there); a link or non-file refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArchiveError(f"{what}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise ArchiveError(f"{what} is a symbolic link; refusing to {refusal}")
    if not stat.S_ISREG(st.st_mode):
        raise ArchiveError(f"{what} is not a regular file")
    return st


def _size(path: str | Path) -> int:
    """The size of the file at ``path`` (0: none there, or it cannot be read)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _refuse_unless_ours(path: Path) -> None:
    """Refuse a database, -wal or -shm file another user owns or others may read or write
    (planted in a shared directory, it would let them read what is written into it)."""
    euid = os.geteuid() if hasattr(os, "geteuid") else -1
    for p in (str(path), f"{path}-wal", f"{path}-shm"):
        what = f"archive {str(path)!r}" + ("" if p == str(path) else f": {p!r}")
        st = _regular(p, what, _THROUGH)
        if st is None:
            continue
        foreign = euid >= 0 and st.st_uid != euid
        if foreign or st.st_mode & 0o066:
            raise ArchiveError(
                f"{what}{'' if p == str(path) else ','} is owned by {_owner(st.st_uid)}, "
                f"mode {stat.S_IMODE(st.st_mode):04o}; refusing to write into a file "
                + ("another user owns" if foreign else "others may read or write")
                + " (remove it, or if it is yours and trusted, chmod 600 it)"
            )


def _owner(uid: int) -> str:
    """``uid N (name)``, or ``uid N`` where the name cannot be looked up."""
    with contextlib.suppress(ImportError, KeyError):
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    return f"uid {uid}"


def _secure_create(path: Path) -> None:
    """Create the directory (0700) and the file (0600) before SQLite opens it, so SQLite
    never creates a file with its own mode, or elsewhere through a link."""
    if not path.parent.exists():
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(path.parent, 0o700)
    _refuse_unless_ours(path)
    with _creating(path.parent):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o600))
        except FileExistsError:
            return  # there already, or another process created it first
        # a -wal or -shm beside a new file is a deleted one's: SQLite would replay it into
        # ours
        for p in (f"{path}-wal", f"{path}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)


@contextlib.contextmanager
def _creating(directory: Path) -> Iterator[None]:
    """Hold the archive directory's lock (``flock``; none where the system has none) while
    a writer looks for the file and creates it. A writer that found the file while its
    creator had not yet removed a deleted archive's -wal and -shm opened it and committed
    into a -wal the creator then removed: a compaction reported done and lost (found by
    the crash campaign, seed 5302, round 416)."""
    if fcntl is None:  # pragma: no cover - Windows: no flock
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


def _archive_version(conn: sqlite3.Connection, path: Path) -> int:
    """The archive's schema version (0: an empty file); refuse another application's file."""
    # in one snapshot: a writer creating the schema in between made an archive look foreign
    own = not conn.in_transaction
    try:
        if own:
            conn.execute("BEGIN")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "malformed" in str(exc):
            raise NotAnArchiveError(
                f"{str(path)!r} is not a Normandy archive ({exc}); refusing to touch it"
            ) from exc
        raise
    finally:
        if own:
            rollback(conn)  # a read: nothing to keep
    if version == 0 and not tables:
        return 0
    if version not in (1, 2, SCHEMA_VERSION) or not {"compactions", "entries"} <= tables:
        raise NotAnArchiveError(
            f"{str(path)!r} is not a Normandy archive (SQLite user_version {version}, tables: "
            f"{', '.join(sorted(tables)) or 'none'}); refusing to touch it"
        )
    return version


#: Connections inherited over ``fork``: kept, never used or closed, in the child.
_inherited: builtins.list[sqlite3.Connection] = []
#: Every Archive of the process, so a child made by ``fork`` starts afresh.
_instances: weakref.WeakSet[Archive] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: fresh locks (another thread may have held one) and connections."""
    for a in list(_instances):
        _inherited.extend(c for c in (a._wconn, getattr(a._local, "conn", None)) if c)
        a._wconn, a._local, a.writers_waiting = None, threading.local(), 0
        a._write_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _SQLite(Dialect):
    """The SQL of the shared queries, as SQLite writes it."""

    def by_source_id(self, source_id: str, version: int) -> tuple[str, builtins.list[Any]]:
        if version == 1:  # no index of the caller's ids in a version-1 archive: the JSON
            return "instr(e.entry_json, ?) > 0", [json.dumps(source_id)]
        # two indexed lookups (the indexed ids, the rows past the mark), not an OR that
        # SQLite answers by scanning the session (50 ms at 20,000 entries)
        return (
            "e.seq IN (SELECT x.seq FROM entries x WHERE x.content_hash IN "
            "(SELECT content_hash FROM entry_sources WHERE source_id = ?) "
            "UNION ALL SELECT y.seq FROM entries y WHERE y.seq > "
            "(SELECT value FROM archive_state WHERE key = 'indexed_seq') "
            "AND instr(y.source_ids, ?) > 0)"
        ), [source_id, json.dumps(source_id)]

    def seq_in(self, seqs: Sequence[int]) -> tuple[str, builtins.list[Any]]:
        return "e.seq IN (SELECT value FROM json_each(?))", [json.dumps(list(seqs))]

    def has_vectors(self) -> tuple[str, builtins.list[Any]]:
        # version 3 on; a reader may see a version-2 file
        return "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'vectors'", []


class Archive(ArchiveBackend):
    """The archive file at ``path`` (default: :func:`~normandy_archive.archive_path`).

    Writes go through one connection per process, kept open (closing the last connection
    of a WAL database checkpoints it), reopened after ``fork`` and when the file at
    ``path`` is no longer the open one (deleted or rotated), so nothing is written into an
    unlinked file. Reads use a read-only connection per thread and never create the file.

    ``timeout`` is how long a write waits for another writer's lock, in seconds (default:
    the ``busy_timeout`` setting, 5 s); ``sync`` how a commit reaches the disk,
    ``"normal"`` or ``"full"`` (default: the ``sync`` setting).
    """

    dialect = _SQLite()

    #: Size of the write-ahead log past which the background writer checkpoints it.
    WAL_CHECKPOINT_BYTES = 4 * 1024 * 1024
    #: The default bound of the write-ahead log (:attr:`wal_bound`): the write that finds
    #: it past the bound checkpoints it and cuts it to nothing, whatever the rate.
    WAL_MAX_BYTES = 16 * 1024 * 1024

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = None,
        sync: str | None = None,
    ) -> None:
        if timeout is None or sync is None:
            settings = current_settings()
            timeout = settings.busy_timeout if timeout is None else timeout
            sync = settings.sync if sync is None else sync
        if sync not in ("normal", "full"):
            raise ValueError(f"sync must be 'normal' or 'full', got {sync!r}")
        self.path = Path(path).expanduser() if path is not None else archive_path()
        self.timeout = float(timeout)
        self.sync = sync
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._wconn: sqlite3.Connection | None = None
        self._wid: tuple[int, int] | None = None
        _instances.add(self)
        self.writers_waiting = 0
        """Foreground writes waiting for the write lock (the background writer yields)."""
        self.wal_bound = self.WAL_MAX_BYTES
        """The write-ahead log's bound (the hook lowers it to a tenth of ``max_bytes``)."""
        self.held_vectors = HeldSessions()
        """The vectors recall by meaning holds in memory between recalls, per session."""

    def __repr__(self) -> str:
        return f"<Archive {str(self.path)!r}>"

    @property
    def location(self) -> str:
        """The archive file's path, for messages."""
        return str(self.path)

    def exists(self) -> bool:
        """Whether something is at the archive's path (a file, or a link that is refused)."""
        return os.path.lexists(self.path)

    def _file_id(self, refusal: str = _FOLLOW) -> tuple[int, int] | None:
        """``(device, inode)`` of the archive file (``None``: none there); see :func:`_regular`."""
        st = _regular(self.path, f"archive {str(self.path)!r}", refusal)
        return None if st is None else (st.st_dev, st.st_ino)

    def _failure(self, message: str) -> ArchiveError:
        return ArchiveError(f"archive {str(self.path)!r}: {message}")

    def _error(self, exc: BaseException, doing: str) -> ArchiveError:
        """``exc`` as the archive's error, saying what it was doing and, where it can, why."""
        text = str(exc) or type(exc).__name__
        name = getattr(exc, "sqlite_errorname", None)
        if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
            text += (
                f" (another writer held the lock for more than {self.timeout:g} s, the "
                "busy_timeout setting)"
            )
        elif isinstance(name, str) and name.startswith(("SQLITE_FULL", "SQLITE_IOERR")):
            text = f"{text} ({name})" + self._why_full()
        return self._failure(f"{doing}: {text}")

    def _why_full(self) -> str:
        """What filled the disk, when it can be told: a file-size limit or no space left."""
        with contextlib.suppress(ImportError, OSError, ValueError):
            import resource

            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            if limit != resource.RLIM_INFINITY:
                biggest = max(_size(self.path), _size(f"{self.path}-wal"))
                return (
                    ": database or disk is full: this process may not write a file past "
                    f"{limit:,} bytes (RLIMIT_FSIZE); the archive's largest file has {biggest:,}"
                )
        with contextlib.suppress(OSError, AttributeError):
            if os.statvfs(self.path.parent).f_bavail == 0:
                return ": database or disk is full: no space left on the file system"
        return ""

    # -- connections ------------------------------------------------------------------

    def _open_reader(self) -> tuple[sqlite3.Connection, int] | None:
        """A read-only connection, changing nothing, and the schema version (``None``: empty)."""
        uri = "file:" + urllib.parse.quote(str(self.path.absolute())) + "?mode=ro"
        # a read-only archive in a read-only directory, without the -wal and -shm a WAL
        # reader needs, is read as immutable
        immutable = not os.path.lexists(f"{self.path}-wal")
        while True:
            conn = sqlite3.connect(uri, uri=True, timeout=self.timeout, isolation_level=None)
            schema.register_functions(conn)  # the rows not indexed yet are matched by stems
            try:
                version = _archive_version(conn, self.path)
            except BaseException as exc:
                conn.close()
                text = str(exc) if isinstance(exc, sqlite3.OperationalError) else ""
                if not immutable or not ("readonly" in text or "unable to open" in text):
                    raise
                uri, immutable = uri + "&immutable=1", False
                continue
            if version == 0:
                conn.close()
                return None
            return conn, version

    def _read(self, work: Callable[[int, Run], T]) -> T | None:
        """``work`` on this thread's read connection (``None``: no archive yet), reopened
        when the file at the path changed; a failure is raised as the archive's error."""
        local = self._local
        fid = self._file_id()
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is not None and local.fid != fid:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            conn = local.conn = None
        if fid is None:
            return None
        if conn is None:
            try:
                opened = self._open_reader()
            except sqlite3.Error as exc:
                raise self._error(exc, "cannot read it") from exc
            if opened is None:
                return None
            conn, local.version = opened
            local.conn, local.fid = conn, fid
        try:
            return work(local.version, _runner(conn))
        except sqlite3.Error as exc:
            local.conn = None  # a connection that failed is not trusted again
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            if isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(_QUERY_ERRORS):
                raise ArchiveQueryError(f"bad full-text query: {exc}") from exc
            raise self._error(exc, "cannot read it") from exc

    def _writer(self) -> sqlite3.Connection:
        """The write connection, reopened when the file at the path is not the open one."""
        if self._wconn is not None:
            if self._file_id(_THROUGH) == self._wid:
                return self._wconn
            self._drop_writer(moved=True)  # deleted or rotated: a new archive at the path
        try:
            _secure_create(self.path)
            before = self._file_id(_THROUGH)
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            schema.register_functions(conn)
        except (OSError, sqlite3.Error) as exc:
            raise self._error(exc, "cannot open it for writing") from exc
        try:
            if before is None or self._file_id(_THROUGH) != before:
                raise self._failure("the file was replaced while it was opened")
            self._init_schema(conn)
            conn.execute(f"PRAGMA synchronous = {self.sync.upper()}")
            # checkpoints are the background writer's, or a write's past its bound; a
            # checkpointed log restarts, cut back to WAL_CHECKPOINT_BYTES
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute(f"PRAGMA journal_size_limit = {self.WAL_CHECKPOINT_BYTES}")
            _refuse_unless_ours(self.path)  # -wal and -shm exist now, created 0600
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (OSError, sqlite3.Error)):
                raise self._error(exc, "cannot open it for writing") from exc
            raise
        self._wconn, self._wid = conn, before
        legacy.move_left(conn, self.path)
        return conn

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        """Check the file is an archive (or empty), switch it to WAL, create or migrate."""
        version = _archive_version(conn, self.path)
        deadline = time.monotonic() + self.timeout
        while True:  # on a new file another process may be switching: "locked" at once
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.002)
        if str(mode).lower() != "wal":  # pragma: no cover - e.g. a network file system
            raise sqlite3.OperationalError(f"{self.path}: could not enable WAL (got {mode!r})")
        if version == SCHEMA_VERSION and schema.is_stemmed(_runner(conn)):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _archive_version(conn, self.path)  # another writer may have been first
            if version == 0:
                schema.create(conn)
            elif version != SCHEMA_VERSION:
                schema.migrate(conn, version)
            if schema.stem_index(conn):  # written before stemming: indexed again, once
                log.info("archive %s: full-text index rebuilt with word stems", self.location)
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise

    def _drop_writer(self, *, moved: bool = False) -> None:
        conn, self._wconn, self._wid = self._wconn, None, None
        if conn is None:
            return
        if moved:
            # SQLite does not checkpoint a moved file on close, and the new file at the
            # path would take its -wal: move the frames into the rotated file now
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    @contextlib.contextmanager
    def _writing(self, *, foreground: bool = False) -> Iterator[None]:
        """This process's turn to write; a waiting ``foreground`` one makes the index yield."""
        self.writers_waiting += foreground
        try:
            got = self._write_lock.acquire(timeout=max(self.timeout, 0.001))
        finally:
            self.writers_waiting -= foreground
        if not got:
            raise self._failure(
                f"another thread of this process held the write lock for more than "
                f"{self.timeout:g} s (the busy_timeout setting)"
            )
        try:
            yield
        finally:
            self._write_lock.release()

    def _transaction(
        self, work: Callable[[sqlite3.Connection], T], doing: str, *, background: bool = False
    ) -> T:
        """``work(conn)`` in one committed ``BEGIN IMMEDIATE`` transaction of the writer,
        done again in the file now at the path when it changed meanwhile."""
        with self._writing(foreground=not background):
            for _ in range(3):
                conn = self._writer()
                if background:  # never hold this process's writes up waiting for another's
                    conn.execute(f"PRAGMA busy_timeout = {_BACKGROUND_WAIT_MS}")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    result = work(conn)
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    rollback(conn)
                    if background and "locked" in str(exc):
                        raise ArchiveBusyError(f"archive {self.location!r}: busy") from exc
                    self._drop_writer()
                    raise self._error(exc, doing) from exc
                except BaseException:
                    rollback(conn)
                    raise
                finally:
                    if background:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
                if self._file_id(_THROUGH) == self._wid:
                    return result
                self._drop_writer(moved=True)
            raise self._failure(f"{doing}: the file kept being replaced while it was written")

    def close(self) -> None:
        """Close this thread's read connection and the write connection."""
        conn, self._local.conn = getattr(self._local, "conn", None), None
        if conn is not None:
            conn.close()
        with self._write_lock:
            self._drop_writer()

    # -- writing ----------------------------------------------------------------------

    def _write(
        self, rows: Sequence[Prepared], compaction: CompactionRecord, meta_json: str, *, index: bool
    ) -> int:
        """Commit the compaction (:func:`~normandy_archive.schema.store`), then bound the log."""
        stored: int = self._transaction(
            lambda conn: schema.store(conn, [r.row for r in rows], compaction, meta_json),
            f"could not record {len(rows)} entries",
        )
        if index:
            self.index()
        try:
            self.checkpoint(if_over=self.wal_bound, truncate=True)
        except ArchiveError as exc:  # committed all the same: the next write tries again
            log.warning("%s", exc)
        return stored

    def index(self, *, batch: int = 16, yield_to_writers: bool = False) -> int:
        """Index for full-text search what was committed and not indexed yet (a killed
        process's rows too), ``batch`` entries a transaction; how many it indexed. With
        ``yield_to_writers`` (the background writer), a waiting compaction goes first
        between two, and another process's lock is not waited for (:class:`ArchiveBusyError`).
        """
        total = 0
        while True:
            while yield_to_writers and self.writers_waiting:
                time.sleep(0.0005)
            done: int = self._transaction(
                lambda conn: schema.index_pending(conn, batch),
                "could not index",
                background=yield_to_writers,
            )
            total += done
            if done and self.wal_bound < self.WAL_MAX_BYTES:  # max_bytes: keep the log small
                self.checkpoint(if_over=self.wal_bound, truncate=True)
            if done < batch:
                return total

    def disk_bytes(self) -> int:
        """Bytes the archive takes on the disk: its file and its write-ahead log."""
        return _size(self.path) + _size(f"{self.path}-wal")

    def checkpoint(self, *, if_over: int = 0, truncate: bool = False) -> bool:
        """Copy the write-ahead log into the file when it holds more than ``if_over``
        bytes; whether it did. ``PASSIVE`` never waits; ``truncate`` waits for readers
        (at most the busy timeout) and cuts the log to nothing."""
        if _size(f"{self.path}-wal") <= if_over or self._file_id() is None:
            return False
        self._outside("PRAGMA wal_checkpoint(" + ("TRUNCATE)" if truncate else "PASSIVE)"))
        return True

    def _outside(self, *statements: str, doing: str = "could not checkpoint") -> None:
        """``statements`` on the writer, outside a transaction, under this process's write
        lock (the background writer's indexing yields)."""
        with self._writing(foreground=True):
            try:
                conn = self._writer()
                for statement in statements:
                    conn.execute(statement)
            except sqlite3.Error as exc:
                self._drop_writer()
                raise self._error(exc, doing) from exc

    # -- retention --------------------------------------------------------------------

    def _used_bytes(self, run: Run, rows: Sequence[Sequence[Any]]) -> int:
        """The file's bytes in use (its pages, less the free ones)."""
        size, pages, free = (
            run(f"PRAGMA {p}", ())[0][0] for p in ("page_size", "page_count", "freelist_count")
        )
        return int((pages - free) * size)

    def _remove(self, limits: Limits, *, vacuum: bool) -> int:
        if not os.path.lexists(self.path):
            return 0

        def work(conn: sqlite3.Connection) -> int:
            while schema.index_pending(conn, 500):  # every row with its seen, first
                pass
            plan = self._plan(_runner(conn), limits)
            if not plan.sessions:
                return 0
            schema.remove_sessions(conn, [s.session_id for s in plan.sessions])
            return plan.entries

        removed = self._transaction(work, "could not prune")
        if vacuum:  # the checkpoint shrinks the file now
            self._outside("VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)", doing="could not vacuum")
        return removed

    # -- vectors (recall by meaning) --------------------------------------------------

    def store_vectors(self, embedder: str, vectors: Mapping[int, Sequence[Sequence[float]]]) -> int:
        """Each entry's part vectors as one little-endian float32 BLOB, one after another
        (:func:`~normandy_archive.vectors.pack_parts`)."""
        if not vectors:
            return 0
        rows = [(embedder, int(seq), pack_parts(parts)) for seq, parts in vectors.items()]

        def work(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(
                "INSERT OR REPLACE INTO vectors (embedder, seq, vector) "
                "SELECT ?1, seq, ?3 FROM entries WHERE seq = ?2",
                rows,
            )
            return conn.total_changes - before

        return self._transaction(work, f"could not keep {len(rows)} vectors")

    def nearest(
        self, embedder: str, session_id: str | None, query: Sequence[float], limit: int
    ) -> builtins.list[tuple[int, int, float]]:
        """Ranked in NumPy over the session's vectors held in memory between recalls
        (:attr:`held_vectors`), read from the file once and then only those written since.

        :raises ArchiveError: NumPy is not installed.
        """
        mine = self.held_vectors.get(embedder, session_id, self.last_vector(embedder))
        mine.extend(self.vectors(embedder, session_id, after=mine.top), len(query))
        return mine.nearest(query, limit)

    def vectors(
        self, embedder: str, session_id: str | None = None, *, after: int = 0
    ) -> builtins.list[tuple[int, bytes]]:
        """The vectors of the embedder key ``embedder`` the archive holds (of
        ``session_id``, as :meth:`unembedded` takes it; past archive order ``after``):
        ``(seq, float32 BLOB)``, in archive order."""
        cond, params = self._in_session("1 = 1", [], session_id, seen=True)

        def select(version: int, run: Run) -> builtins.list[tuple[Any, ...]]:
            if not run(*self.dialect.has_vectors()):
                return []
            return run(
                f"SELECT e.seq, x.vector FROM vectors x JOIN entries e ON e.seq = x.seq "
                f"WHERE x.embedder = ? AND x.seq > ? AND {cond} ORDER BY e.seq",
                [embedder, after, *params],
            )

        return [(int(r[0]), bytes(r[1])) for r in self._read(select) or ()]

    def last_vector(self, embedder: str) -> int:
        """The highest archive order holding a vector of ``embedder`` (0: none)."""

        def select(version: int, run: Run) -> builtins.list[tuple[Any, ...]]:
            if not run(*self.dialect.has_vectors()):
                return []
            return run("SELECT max(seq) FROM vectors WHERE embedder = ?", [embedder])

        rows = self._read(select) or []
        return int(rows[0][0] or 0) if rows else 0

    # -- reading ----------------------------------------------------------------------

    def _search(self, search: Search) -> builtins.list[ArchivedEntry]:
        """FTS5 over word stems, ranked by ``bm25()``; then the rows not indexed yet, by a
        case-insensitive substring match of every term (any term with ``any_term``; not
        with ``raw``).

        The unindexed rows are read first: an entry indexed between the two reads is then
        found by both (and shown once), not by neither.
        """
        query, session_id, limit, offset, raw, any_term, seen = search
        terms = query.replace("\x00", " ").split()
        if not terms:
            return []
        wanted = min(offset + limit, MAX_ROWS)
        pending: builtins.list[ArchivedEntry] = []
        # an archive indexed before stemming is searched as written until a writer
        # indexes it again (a version-1 archive has no archive_state); the words as the
        # index holds them: each term's stems as a phrase (letters and digits), or as written
        stemmed = bool(self._read(lambda v, run: v != 1 and schema.is_stemmed(run)))
        words = [p for p in map(stem_text, terms) if p] if stemmed else terms
        if not raw and words:  # a row not indexed yet matches a term as the index would
            needles = [f" {w} " for w in words] if stemmed else words
            contains = _CONTAINS_STEMS if stemmed else _CONTAINS
            joined = (" OR " if any_term else " AND ").join([contains] * len(needles))
            cond, params = self._in_session(
                f"{_UNINDEXED}({joined})", needles, session_id, seen=seen
            )
            pending = self._select(  # none in a version-1 archive: all indexed at once
                cond, [*params, wanted], "ORDER BY e.seq LIMIT ?", v1=("0 = 1", [wanted])
            )
        if raw:  # each word of the query stemmed, not an operator
            stem = lambda m: m[0] if m[0] in _FTS5_OPERATORS else stem_text(m[0])  # noqa: E731
            text = WORD.sub(stem, query) if stemmed else query
        elif words:  # each term an FTS5 string: its punctuation literal
            quoted = ['"' + w.replace('"', '""') + '"' for w in words]
            text = (" OR " if any_term else " ").join(quoted)
        else:  # no word to search the index for
            return pending[offset : offset + limit]
        cond, params = self._in_session("entries_fts MATCH ?", [text], session_id, seen=seen)
        plain, plain_params = self._in_session("entries_fts MATCH ?", [text], session_id)
        found = self._select(  # a version-1 archive has no seen table
            cond,
            [*params, wanted],
            "ORDER BY bm25(entries_fts), e.seq LIMIT ?",
            source="entries_fts f JOIN main.entries e ON e.seq = f.rowid",
            v1=(plain, [*plain_params, wanted]),
        )
        indexed = {a.seq for a in found}
        found += [a for a in pending if a.seq not in indexed]
        return found[offset : offset + limit]

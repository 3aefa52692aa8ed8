"""The SQLite archive of dropped entries: one transaction per compaction, WAL, owner-only files.

Entries are stored once by content (the schema is described in
:mod:`normandy_archive.schema`): a compaction commits the entries whose content the
archive does not hold yet, with their session, the ids they had and the caller's ids
found in them, in one ``BEGIN IMMEDIATE`` transaction into the tables. A compaction's
data is then *committed*; the background writer indexes it for full-text search (and
its caller's ids), and it is *indexed*. Reads find committed rows not indexed yet by a
plain scan past the indexed-up-to mark, and never write (``mode=ro``). An archive an
earlier version left with a journal or spool files is moved into the tables once, by
the first writer that opens it (:mod:`normandy_archive.legacy`).
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from normandy_archive import legacy, schema
from normandy_archive.base import (
    MAX_ROWS,
    PREPARED_MAX_BYTES,
    ArchiveBackend,
    ArchivedEntry,
    CompactionRecord,
    Dialect,
    Limits,
    Prepared,
    PrunePlan,
    Recorded,
    Run,
    Search,
    SessionUsage,
    check_limits,
    choose_sessions,
    prepare,
    searchable_text,
)
from normandy_archive.errors import ArchiveError, ArchiveQueryError, NotAnArchiveError
from normandy_archive.schema import SCHEMA_VERSION
from normandy_archive.settings import archive_path, current_settings

__all__ = [
    "MAX_ROWS",
    "PREPARED_MAX_BYTES",
    "Archive",
    "ArchiveBusyError",
    "ArchivedEntry",
    "CompactionRecord",
    "PrunePlan",
    "Recorded",
    "SessionUsage",
    "check_limits",
    "choose_sessions",
    "prepare",
    "searchable_text",
]

# (the records, the preparation of entries and the rules both backends share are in
# normandy_archive.base, and importable from here as before)

T = TypeVar("T")
log = logging.getLogger("normandy_archive")


def _fts_query(query: str, any_term: bool = False) -> str:
    """Each whitespace-separated term as an FTS5 string (so punctuation is literal), ANDed
    (ORed with ``any_term``).

    NUL, which would end an FTS5 string early, separates terms like whitespace.
    """
    terms = query.replace("\x00", " ").split()
    return (" OR " if any_term else " ").join('"' + t.replace('"', '""') + '"' for t in terms)


#: Rows written but not indexed yet, and one term found in a row's searchable text.
_UNINDEXED = "e.seq > (SELECT value FROM archive_state WHERE key = 'indexed_seq') AND "
_CONTAINS = f"instr(lower({schema.TEXT_SQL}), lower(?)) > 0"

#: Errors SQLite gives for a full-text query it cannot parse (with ``raw``).
_QUERY_ERRORS = ("fts5:", "unterminated string", "no such column", "unknown special query")


def _refuse_unless_regular(st: os.stat_result, what: str, refusal: str) -> None:
    """Refuse a symbolic link at ``what`` (``refusing to`` ``refusal``), or anything else
    that is not a regular file, with :class:`ArchiveError`."""
    if stat.S_ISLNK(st.st_mode):
        raise ArchiveError(f"{what} is a symbolic link; refusing to {refusal}")
    if not stat.S_ISREG(st.st_mode):
        raise ArchiveError(f"{what} is not a regular file")


def _secure_create(path: Path) -> None:
    """Create the directory (0700) and the file (0600) before SQLite ever opens it.

    Whatever sits at the path must be a regular file only we may open (see
    :func:`_refuse_unless_ours`): a symbolic link (dangling or not) is refused, so SQLite
    never creates or writes a file elsewhere with its own mode.
    """
    parent = path.parent
    if not parent.exists():
        os.makedirs(parent, mode=0o700, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o700)
    _refuse_unless_ours(path)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o600)
    except FileExistsError:
        return  # there already, or another process created it first
    os.close(fd)
    # A -wal or -shm beside a database file just created belongs to a file that was
    # deleted or moved away: SQLite would replay its frames into the new one.
    for p in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _owner_name(uid: int) -> str:
    """``uid N (name)``, or ``uid N`` where the name cannot be looked up."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _refuse_unless_ours(path: Path) -> None:
    """Refuse the archive's database, ``-wal`` or ``-shm`` file when it is not a regular
    file, not owned by this user, or others may read or write it.

    Another user could have planted it (in a directory others may write to) and read
    what is written into it, through the mode or a descriptor opened beforehand, so it
    is refused rather than taken over with ``chmod``; the error names the file, its
    owner and its mode.
    """
    euid = _euid()
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        what = f"archive {str(path)!r}" + ("" if p == path else f": {str(p)!r}")
        _refuse_unless_regular(
            st, what, "write through it (point the archive path at a regular file)"
        )
        foreign = euid >= 0 and st.st_uid != euid
        if foreign or st.st_mode & 0o066:
            raise ArchiveError(
                f"{what}{'' if p == path else ','} is owned by {_owner_name(st.st_uid)}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}; refusing to write into a file "
                + ("another user owns" if foreign else "others may read or write")
                + " (remove it, or if it is yours and trusted, chmod 600 it)"
            )


def _euid() -> int:
    geteuid = getattr(os, "geteuid", None)
    return geteuid() if geteuid is not None else -1


def _file_id(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the regular file at ``path`` (not followed), else ``None``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


#: Milliseconds a background transaction waits for another process's write lock.
_BACKGROUND_WAIT_MS = 20


class ArchiveBusyError(ArchiveError):
    """Another process holds the archive's write lock (background work tries later)."""


#: The schema versions this code reads (a writer moves version 1 to version 2).
READABLE_VERSIONS = (1, SCHEMA_VERSION)


def _archive_version(conn: sqlite3.Connection, path: Path) -> int:
    """The archive's schema version (0: an empty file); refuse another application's file.

    Reads only: ``user_version`` and the table names, both from one snapshot (in one
    read transaction unless the caller's is open): read apart, a writer creating the
    schema in between made a new archive look like another application's file
    (``user_version`` 0 with tables).
    """
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
        if own and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")  # a read: nothing to keep
    if version == 0 and not tables:
        return 0
    if version not in READABLE_VERSIONS or not {"compactions", "entries"} <= tables:
        raise NotAnArchiveError(
            f"{str(path)!r} is not a Normandy archive (SQLite user_version {version}, tables: "
            f"{', '.join(sorted(tables)) or 'none'}); refusing to touch it"
        )
    return version


def _journal_mode_wal(conn: sqlite3.Connection, timeout: float) -> str:
    """Switch the file to WAL (a no-op once it is), waiting at most ``timeout`` seconds
    for the lock: on a new file another process is switching too, SQLite answers
    "database is locked" at once, without its busy wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.002)


def _check_path(path: Path) -> tuple[int, int] | None:
    """The file id of the archive at ``path`` to read; ``None`` when there is none.

    A symbolic link is refused (dangling or not), as is anything but a regular file.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArchiveError(f"archive {str(path)!r}: {exc.strerror or exc}") from exc
    _refuse_unless_regular(
        st, f"archive {str(path)!r}", "follow it (point the archive path at the file itself)"
    )
    return (st.st_dev, st.st_ino)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: Write connections inherited over ``fork``: never used or closed in the child.
_inherited: builtins.list[sqlite3.Connection] = []
#: Every Archive of the process, so a child made by ``fork`` gets fresh locks.
_instances: weakref.WeakSet[Archive] = weakref.WeakSet()

_COMPACTION_INSERT = (
    f"INSERT OR IGNORE INTO compactions ({schema.COMPACTION_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_ENTRY_INSERT = (
    "INSERT OR IGNORE INTO entries (entry_id, content_hash, turn_id, role, entry_json, "
    "source_ids, session_id, compaction_id, archived_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _after_fork() -> None:
    """In the child: a lock another thread held at the fork would stay held for ever."""
    for archive in list(_instances):
        archive._write_lock = threading.Lock()
        archive._checkpoint_lock = threading.Lock()
        archive.writers_waiting = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _compaction_values(c: CompactionRecord, meta_json: str, stored: int) -> tuple[Any, ...]:
    """The ``compactions`` row of ``c`` (:data:`~normandy_archive.schema.COMPACTION_COLUMNS`),
    which stored ``stored`` entries."""
    mid_round = None if c.mid_round is None else int(c.mid_round)
    return (
        c.compaction_id,
        c.session_id,
        c.compactor,
        c.strategy,
        c.model,
        mid_round,
        c.created_at,
        stored,
        c.tokens_before,
        c.tokens_after,
        meta_json,
        c.dropped_count,
    )


class _SQLite(Dialect):
    """The SQL of the queries both backends share, as SQLite writes it."""

    def by_source_id(self, source_id: str, version: int) -> tuple[str, builtins.list[Any]]:
        if version == 1:  # no index of the caller's ids in a version-1 archive: the JSON
            return "instr(e.entry_json, ?) > 0", [json.dumps(source_id)]
        # two indexed lookups (the indexed ids, and the rows past the index mark), not an
        # OR SQLite answers by scanning the session: 50 ms at 20,000 entries, now < 1 ms
        return (
            "e.seq IN (SELECT x.seq FROM entries x WHERE x.content_hash IN "
            "(SELECT content_hash FROM entry_sources WHERE source_id = ?) "
            "UNION ALL SELECT y.seq FROM entries y WHERE y.seq > "
            "(SELECT value FROM archive_state WHERE key = 'indexed_seq') "
            "AND instr(y.source_ids, ?) > 0)"
        ), [source_id, json.dumps(source_id)]


class Archive(ArchiveBackend):
    """The archive file at ``path`` (default: :func:`~normandy_archive.archive_path`).

    Writes go through one connection per process, kept open between calls (closing the
    last connection of a WAL database checkpoints it, which would cost every compaction
    a sync), reopened after ``fork`` and whenever the file at ``path`` is no longer the
    one it has open (deleted or rotated), so nothing is written into an unlinked file. A
    compaction is one ``BEGIN IMMEDIATE`` transaction into the tables
    (``record(index=False)``); :meth:`index` (the background writer's) indexes it for
    full-text search afterwards, and reads find what is not indexed yet by a plain scan.
    Reads use a connection per thread, so an ``Archive`` may be shared by threads.
    Reading never creates the file.

    ``timeout`` is the busy wait of a write, in seconds: how long it waits for another
    writer's lock before it fails with the archive's error (default: the
    ``busy_timeout`` setting, 5 s). ``sync`` is how a commit reaches the disk,
    ``"normal"`` or ``"full"`` (default: the ``sync`` setting, see
    :attr:`~normandy_archive.ArchiveSettings.sync`).
    """

    dialect = _SQLite()

    #: Size of the write-ahead log past which the background writer checkpoints it.
    WAL_CHECKPOINT_BYTES = 4 * 1024 * 1024
    #: The bound of the write-ahead log (by default; :attr:`wal_bound`): past it, the write
    #: that finds it so checkpoints it and truncates it to nothing
    #: (``wal_checkpoint(TRUNCATE)``), whatever the rate.
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
        self.path = Path(path).expanduser() if path is not None else archive_path()
        self.timeout = float(timeout)
        self.sync = sync
        if self.sync not in ("normal", "full"):
            raise ValueError(f"sync must be 'normal' or 'full', got {self.sync!r}")
        self._local = threading.local()
        self._write_lock = threading.Lock()
        _instances.add(self)
        self._wconn: sqlite3.Connection | None = None
        self._wpid = 0
        self._wid: tuple[int, int] | None = None
        self._checkpoint_lock = threading.Lock()
        self._ckpt: sqlite3.Connection | None = None
        self._ckpt_pid = 0
        self.writers_waiting = 0
        """Foreground writes waiting for the write lock (the background writer yields)."""
        self.last_write = 0.0
        """:func:`time.monotonic` of the last :meth:`record` (the background writer waits
        for a pause before it indexes)."""
        self.wal_bound = self.WAL_MAX_BYTES
        """The bound of the write-ahead log (:data:`WAL_MAX_BYTES`; the hook lowers it to
        a tenth of ``max_bytes``, so retention holds for the file and the log together)."""

    def __repr__(self) -> str:
        return f"<Archive {str(self.path)!r}>"

    @property
    def location(self) -> str:
        """The archive file's path, for messages."""
        return str(self.path)

    def _failure(self, message: str) -> ArchiveError:
        return ArchiveError(f"archive {str(self.path)!r}: {message}")

    def _error(self, exc: BaseException, doing: str = "") -> ArchiveError:
        text = str(exc) or type(exc).__name__
        name = getattr(exc, "sqlite_errorname", None)
        if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
            text += (
                f" (another writer held the lock for more than {self.timeout:g} s, the "
                "busy_timeout setting)"
            )
        elif isinstance(name, str) and name.startswith(("SQLITE_FULL", "SQLITE_IOERR")):
            text = f"{text} ({name})" + self._why_full()
        what = f"archive {str(self.path)!r}"
        return ArchiveError(f"{what}: {doing + ': ' if doing else ''}{text}")

    def _why_full(self) -> str:
        """What filled the disk, when it can be told: a file-size limit or no space left."""
        try:
            import resource

            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
            limit = -1
        if limit >= 0 and limit != getattr(resource, "RLIM_INFINITY", -1):
            sizes = []
            for p in (self.path, Path(f"{self.path}-wal")):
                with contextlib.suppress(OSError):
                    sizes.append(p.stat().st_size)
            return (
                ": database or disk is full: this process may not write a file past "
                f"{limit:,} bytes (RLIMIT_FSIZE); the archive's largest file has "
                f"{max(sizes, default=0):,}"
            )
        with contextlib.suppress(OSError, AttributeError):
            fs = os.statvfs(self.path.parent)
            if fs.f_bavail == 0:
                return ": database or disk is full: no space left on the file system"
        return ""

    # -- connections ------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether something is at the archive's path (a file, or a link that is refused)."""
        return os.path.lexists(self.path)

    def _open_reader(self) -> tuple[sqlite3.Connection, int] | None:
        """A read-only connection (``mode=ro``); ``None`` for an empty file.

        It never creates, migrates or changes anything: no schema, no journal mode. A
        read-only archive in a read-only directory, without the -wal and -shm files a
        WAL reader needs, is read as an immutable snapshot.
        """
        base = "file:" + urllib.parse.quote(str(self.path.absolute())) + "?mode=ro"
        uris = [base]
        if not os.path.lexists(f"{self.path}-wal"):
            uris.append(base + "&immutable=1")
        for n, uri in enumerate(uris):
            conn = sqlite3.connect(uri, uri=True, timeout=self.timeout, isolation_level=None)
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
                version = _archive_version(conn, self.path)
            except sqlite3.OperationalError as exc:
                conn.close()
                retry = "readonly" in str(exc) or "unable to open" in str(exc)
                if n + 1 < len(uris) and retry:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if version == 0:
                conn.close()
                return None
            return conn, version
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection | None]:
        """This thread's read-only connection; ``None`` when there is no archive yet.

        Reopened after ``fork`` and when the file at the path changed. A failure is
        raised as :class:`ArchiveError` naming the archive.
        """
        local = self._local
        fid = _check_path(self.path)
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is not None and (local.pid != os.getpid() or local.fid != fid):
            if local.pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            conn = local.conn = None
        if fid is None:
            yield None
            return
        if conn is None:
            try:
                opened = self._open_reader()
            except sqlite3.Error as exc:
                raise self._error(exc, "cannot read it") from exc
            if opened is None:
                yield None
                return
            conn, local.version = opened
            local.conn, local.pid, local.fid = conn, os.getpid(), fid
        try:
            yield conn
        except sqlite3.Error as exc:
            # a connection that failed is not trusted again; the next call reopens one
            local.conn = None
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            if isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(_QUERY_ERRORS):
                raise ArchiveQueryError(f"bad full-text query: {exc}") from exc
            raise self._error(exc, "cannot read it") from exc

    def _writer(self) -> sqlite3.Connection:
        """The write connection, reopened when the file at the path is not the open one."""
        conn = self._wconn
        if conn is not None and self._wpid != os.getpid():
            _inherited.append(conn)  # the parent's: never used nor closed here
            conn = self._wconn = None
        if conn is not None:
            if _file_id(self.path) == self._wid:
                return conn
            self._drop_writer(moved=True)  # deleted or rotated: a new archive at the path
        return self._open_writer()

    def _open_writer(self) -> sqlite3.Connection:
        try:
            _secure_create(self.path)
            before = _file_id(self.path)
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise self._error(exc, "cannot open it for writing") from exc
        try:
            if before is None or _file_id(self.path) != before:
                raise ArchiveError(
                    f"archive {str(self.path)!r}: the file was replaced while it was opened"
                )
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            self._init_schema(conn)
            conn.execute(f"PRAGMA synchronous = {self.sync.upper()}")
            # checkpoints are the background writer's, or a write's past WAL_MAX_BYTES;
            # once checkpointed, the log restarts and is cut back to WAL_CHECKPOINT_BYTES
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute(f"PRAGMA journal_size_limit = {self.WAL_CHECKPOINT_BYTES}")
            _refuse_unless_ours(self.path)  # -wal and -shm exist now, created 0600
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (OSError, sqlite3.Error)):
                raise self._error(exc, "cannot open it for writing") from exc
            raise
        self._wconn, self._wpid, self._wid = conn, os.getpid(), before
        legacy.move_left(conn, self.path)
        return conn

    def _drop_writer(self, *, moved: bool = False) -> None:
        conn, self._wconn, self._wid = self._wconn, None, None
        if conn is None:
            return
        if moved:
            # SQLite does not checkpoint a moved file on close, and its -wal keeps the
            # name the new file at the path will use: move the frames into the file
            # they belong to (the rotated one) and empty the -wal now.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    @contextlib.contextmanager
    def _writing(self, *, foreground: bool = False) -> Iterator[None]:
        """This process's turn to write, waited for at most the busy timeout.

        A ``foreground`` write (a compaction's) is counted while it waits, so the
        background writer lets it go first between two of its batches.
        """
        if foreground:
            self.writers_waiting += 1
        try:
            got = self._write_lock.acquire(timeout=max(self.timeout, 0.001))
        finally:
            if foreground:
                self.writers_waiting -= 1
        if not got:
            raise ArchiveError(
                f"archive {str(self.path)!r}: another thread of this process held the write "
                f"lock for more than {self.timeout:g} s (the busy_timeout setting)"
            )
        try:
            yield
        finally:
            self._write_lock.release()

    def _transaction(
        self, work: Callable[[sqlite3.Connection], T], doing: str, *, background: bool = False
    ) -> T:
        """``work(conn)`` in one committed ``BEGIN IMMEDIATE`` transaction of the writer.

        The real error is raised (as :class:`ArchiveError`), never one of the ROLLBACK
        after it (a failed COMMIT has often rolled back already); a ``background`` one
        does not wait for another process's lock (:class:`ArchiveBusyError`). When the
        file at the path changed while it was written (deleted or rotated), the work is
        done again in the file now there: nothing is left only in an unlinked file.
        """
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
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    if background and "locked" in str(exc):
                        raise ArchiveBusyError(f"archive {self.location!r}: busy") from exc
                    self._drop_writer()
                    raise self._error(exc, doing) from exc
                except BaseException:
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    raise
                finally:
                    if background:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
                if _file_id(self.path) == self._wid:
                    return result
                self._drop_writer(moved=True)
            raise ArchiveError(
                f"archive {str(self.path)!r}: {doing}: the file kept being replaced while "
                "it was written"
            )

    def close(self) -> None:
        """Close this thread's read connection and the write connection."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
        with self._write_lock:
            if self._wpid == os.getpid():
                self._drop_writer()
        with self._checkpoint_lock:
            ckpt, self._ckpt = self._ckpt, None
            if ckpt is not None and self._ckpt_pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    ckpt.close()

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        """Check the file is an archive (or empty), switch it to WAL, create or migrate."""
        version = _archive_version(conn, self.path)
        mode = _journal_mode_wal(conn, self.timeout)
        if str(mode).lower() != "wal":  # pragma: no cover - e.g. a network file system
            raise sqlite3.OperationalError(f"{self.path}: could not enable WAL (got {mode!r})")
        if version == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _archive_version(conn, self.path)  # another writer may have been first
            if version == 0:
                schema.create(conn)
            else:
                schema.migrate(conn, version)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    # -- writing ----------------------------------------------------------------------

    def _write(
        self, rows: Sequence[Prepared], compaction: CompactionRecord, meta_json: str, *, index: bool
    ) -> int:
        """Commit the compaction in one transaction: the content the archive does not
        hold yet into ``entries`` (with the compaction's row), and the ``seen`` of
        content dropped again. Its full-text index, caller ids and first ``seen`` follow
        in :meth:`index` (the background writer's; at once with ``index``); the write
        that finds the log past :data:`WAL_MAX_BYTES` checkpoints it."""
        c = compaction
        self.last_write = time.monotonic()

        def work(conn: sqlite3.Connection) -> int:
            have = self._have(conn, rows)
            fresh = [r.row for r in rows if r.content_hash not in have] if have else None
            if have:  # content dropped before: this session saw it last
                conn.executemany(schema.SEEN_SQL, [(c.session_id, c.created_at, h) for h in have])
            new = [r.row for r in rows] if fresh is None else fresh
            if new:
                values = _compaction_values(c, meta_json, len(new))
                conn.execute(_COMPACTION_INSERT, values)
                tail = (c.session_id, c.compaction_id, c.created_at)
                conn.executemany(_ENTRY_INSERT, [(*r, *tail) for r in new])
            return len(new)

        stored = self._transaction(work, f"could not record {len(rows)} entries")
        self.last_write = time.monotonic()
        if index:
            self.index()
        try:
            # under this process's write lock: the background writer's transactions do not
            # keep the checkpoint from cutting the log
            with self._writing(foreground=True):
                self.checkpoint(if_over=self.wal_bound, truncate=True)
        except ArchiveError as exc:  # committed all the same: the next write tries again
            log.warning("%s", exc)
        return stored

    @staticmethod
    def _have(conn: sqlite3.Connection, rows: Sequence[Prepared]) -> set[str]:
        """The hashes of ``rows`` whose content the archive's tables hold."""
        if not rows:
            return set()
        # hex digests: a JSON array without json.dumps
        hashes = '["' + '","'.join([r.content_hash for r in rows]) + '"]'
        return {
            h
            for (h,) in conn.execute(
                "SELECT content_hash FROM entries WHERE content_hash IN "
                "(SELECT value FROM json_each(?))",
                (hashes,),
            )
        }

    def index(self, *, batch: int = 16, yield_to_writers: bool = False) -> int:
        """Index for full-text search what was written and not indexed yet (rows a killed
        process left unindexed too); how many entries it indexed.

        In transactions of at most ``batch`` entries, so a writer waits for one batch at
        most; with ``yield_to_writers`` (the background writer), a compaction waiting to
        write goes first between two batches, and another process's lock is not waited
        for (:class:`ArchiveBusyError`).
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
                with self._writing():
                    self.checkpoint(if_over=self.wal_bound, truncate=True)
            if done < batch:
                return total

    def disk_bytes(self) -> int:
        """Bytes the archive takes on the disk: its file and its write-ahead log."""
        total = 0
        for p in (self.path, f"{self.path}-wal"):
            with contextlib.suppress(OSError):
                total += os.stat(p).st_size
        return total

    def checkpoint(self, *, if_over: int = 0, truncate: bool = False) -> bool:
        """Copy the write-ahead log into the database file (when it holds more than
        ``if_over`` bytes); whether it did. A ``PASSIVE`` checkpoint never waits for
        readers or writers; with ``truncate``, it waits for them (at most the busy
        timeout) and cuts the log to nothing, which bounds it whatever the rate."""
        try:
            size = os.stat(f"{self.path}-wal").st_size
        except OSError:
            return False
        if size <= if_over:
            return False
        # on a connection of its own: a passive checkpoint runs beside a write, so it
        # never holds a compaction up
        with self._checkpoint_lock:
            conn = self._ckpt
            if conn is None or self._ckpt_pid != os.getpid() or _check_path(self.path) is None:
                try:
                    conn = sqlite3.connect(self.path, timeout=0, check_same_thread=False)
                except sqlite3.Error as exc:
                    raise self._error(exc, "could not checkpoint") from exc
                self._ckpt, self._ckpt_pid = conn, os.getpid()
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000) if truncate else 0}")
                conn.execute(f"PRAGMA wal_checkpoint({'TRUNCATE' if truncate else 'PASSIVE'})")
            except sqlite3.Error as exc:
                self._ckpt = None
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                raise self._error(exc, "could not checkpoint") from exc
        return True

    # -- retention --------------------------------------------------------------------

    def _used_bytes(self, run: Run, rows: Sequence[Sequence[Any]]) -> int:
        """The file's bytes in use (its pages, less the free ones)."""
        page_size = run("PRAGMA page_size", ())[0][0]
        pages = run("PRAGMA page_count", ())[0][0]
        free = run("PRAGMA freelist_count", ())[0][0]
        return int((pages - free) * page_size)

    def _remove(self, limits: Limits, *, vacuum: bool) -> int:
        if not os.path.lexists(self.path):
            return 0

        def work(conn: sqlite3.Connection) -> int:
            while schema.index_pending(conn, 500):  # every row with its seen, first
                pass
            plan = self._plan(lambda q, p: conn.execute(q, p).fetchall(), limits)
            row = conn.execute(
                "SELECT value FROM archive_state WHERE key = 'indexed_seq'"
            ).fetchone()
            indexed = int(row[0]) if row else 0
            if not plan.sessions:
                return 0
            doomed = json.dumps([s.session_id for s in plan.sessions])
            sessions = "SELECT value FROM json_each(?)"
            mine = f"SELECT seq FROM seen WHERE session_id IN ({sessions})"
            conn.execute(
                "INSERT INTO entries_fts (entries_fts, rowid, text) SELECT 'delete', e.seq, "
                f"{schema.TEXT_SQL} FROM entries e WHERE e.seq IN ({mine}) AND e.seq <= ?",
                (doomed, indexed),
            )
            conn.execute(
                "DELETE FROM entry_sources WHERE content_hash IN "
                f"(SELECT content_hash FROM entries WHERE seq IN ({mine}))",
                (doomed,),
            )
            conn.execute(f"DELETE FROM entries WHERE seq IN ({mine})", (doomed,))
            conn.execute(f"DELETE FROM seen WHERE session_id IN ({sessions})", (doomed,))
            # what a removed session archived first and a kept one dropped since stays,
            # under the kept session (its compaction_id still names the removed
            # compaction that archived it first); compactions with nothing left go
            conn.execute(
                "UPDATE entries SET session_id = "
                "(SELECT s.session_id FROM seen s WHERE s.seq = entries.seq) "
                f"WHERE session_id IN ({sessions})",
                (doomed,),
            )
            conn.execute(f"DELETE FROM compactions WHERE session_id IN ({sessions})", (doomed,))
            conn.execute(
                "DELETE FROM compactions WHERE compaction_id NOT IN "
                "(SELECT compaction_id FROM entries)"
            )
            return plan.entries

        removed = self._transaction(work, "could not prune")
        if vacuum:
            with self._writing():
                try:
                    conn = self._writer()
                    conn.execute("VACUUM")
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the file shrinks now
                except sqlite3.Error as exc:
                    self._drop_writer()
                    raise self._error(exc, "could not vacuum") from exc
        return removed

    # -- reading ----------------------------------------------------------------------

    def _read(self, work: Callable[[int, Run], T]) -> T | None:
        """``work`` on this thread's read connection (``None``: no archive yet)."""
        with self._connect() as conn:
            if conn is None:
                return None

            def run(q: str, p: Sequence[Any]) -> builtins.list[tuple[Any, ...]]:
                return conn.execute(q, p).fetchall()

            return work(self._local.version, run)

    def _search(self, search: Search) -> builtins.list[ArchivedEntry]:
        """FTS5, ranked. Entries written but not indexed yet (the background writer
        indexes them shortly after each compaction) are found too, after the indexed
        ones, by a plain case-insensitive substring match of every term (of any term
        with ``any_term``; not with ``raw``).

        The rows not indexed yet are read first: the two reads are two snapshots, and an
        entry the background writer indexes between them is then found by both (and
        shown once), where read the other way round it was found by neither (a recall
        right after a compaction missed what it had just dropped).
        """
        query, session_id, limit, offset, raw, any_term, seen = search
        terms = query.replace("\x00", " ").split()
        if not terms:
            return []
        wanted = min(offset + limit, MAX_ROWS)
        pending: builtins.list[ArchivedEntry] = []
        if not raw:
            joined = (" OR " if any_term else " AND ").join(_CONTAINS for _ in terms)
            unindexed = f"{_UNINDEXED}({joined})"
            if seen and session_id is not None:
                cond, params = self._in_session_or_seen(unindexed, terms, session_id)
            else:
                cond, params = self._in_session(unindexed, terms, session_id)
            pending = self._select(  # none in a version-1 archive: all indexed at once
                cond, [*params, wanted], "ORDER BY e.seq LIMIT ?", v1=("0 = 1", [wanted])
            )
        text = query if raw else _fts_query(query, any_term)
        match = "entries_fts MATCH ?"
        cond, params = self._in_session(match, [text], session_id)
        plain = None
        if seen and session_id is not None:  # a version-1 archive has no seen table
            plain = (cond, [*params, wanted])
            cond, params = self._in_session_or_seen(match, [text], session_id)
        found = self._select(
            cond,
            [*params, wanted],
            "ORDER BY f.rank, e.seq LIMIT ?",
            source="entries_fts f JOIN main.entries e ON e.seq = f.rowid",
            v1=plain,
        )
        indexed = {a.seq for a in found}
        found += [a for a in pending if a.seq not in indexed]
        return found[offset : offset + limit]

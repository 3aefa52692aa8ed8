"""The SQLite archive of dropped entries: one commit per compaction, WAL, owner-only files.

Entries are stored once by content (the schema is described in
:mod:`normandy_archive.schema`): a compaction commits the entries whose content the
archive does not hold yet, with their session, the ids they had and the caller's ids
found in them, as one frame appended to its process's spool file
(:mod:`normandy_archive.spool`), or as one journal row in one transaction; the
background writer moves frames into the journal, then journal rows into the indexed
tables, and indexes them for full-text search. Reads see the spooled frames and the
journal's rows as if moved, and never write (``mode=ro``).
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import errno
import functools
import json
import logging
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from normandy_archive import schema
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
from normandy_archive.paths import archive_path
from normandy_archive.schema import SCHEMA_VERSION
from normandy_archive.settings import current_settings
from normandy_archive.spool import (
    CAN_SPOOL as _CAN_SPOOL,
    EntryRow,
    Frame,
    Spool,
    encode,
    in_order,
    orphans,
    read_frames,
    spool_files,
)

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


class _NotMoved(Exception):
    """Spool files whose frames could not be moved: they are kept."""


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


def _journal_rows_of(jid: int, rows: Sequence[Prepared]) -> builtins.list[tuple[Any, ...]]:
    """The ``journal_entries`` rows of journal row ``jid`` holding ``rows``."""
    return [(jid, *r.row) for r in rows]


_JOURNAL_INSERT = (
    "INSERT INTO journal (compaction_id, session_id, compactor, strategy, model, mid_round, "
    "created_at, tokens_before, tokens_after, meta_json, dropped_count, entry_count, seen) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_ENTRIES_INSERT = (
    "INSERT INTO journal_entries (jid, entry_id, content_hash, turn_id, role, entry_json, "
    "source_ids) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _journal_values(c: CompactionRecord, meta_json: str) -> tuple[Any, ...]:
    """A compaction's ``journal`` row up to ``dropped_count`` (entry count and ``seen``
    follow)."""
    return (
        c.compaction_id,
        c.session_id,
        c.compactor,
        c.strategy,
        c.model,
        None if c.mid_round is None else int(c.mid_round),
        c.created_at,
        c.tokens_before,
        c.tokens_after,
        meta_json,
        c.dropped_count,
    )


def _probe_write(conn: sqlite3.Connection, timeout: float) -> None:
    """Raise when the archive cannot be written (SQLite opens a file it may not write
    read-only, and says so at the first write), so a compaction is not spooled for an
    archive that can never take it. A lock another writer holds is not waited for: the
    file is writable then, and the write tells."""
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE archive_state SET value = value WHERE key = 'indexed_seq'")
        conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if "locked" not in str(exc) and "busy" not in str(exc):
            raise
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")


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


def _journal_rows(conn: sqlite3.Connection) -> bool:
    """Whether the archive's journal holds rows (``False``: it has no journal table)."""
    try:
        return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM journal)").fetchone()[0])
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return False
        raise


#: What a read statement is prefixed with while spooled compactions are loaded
#: (:func:`_load_spool`): the journal with the spool's frames after its rows.
_SPOOL_READ_WITH = schema.read_with(
    "journal_all",
    "journal_entries_all",
    "r.k",
    first=(
        # the frames the archive does not hold yet, read in the statement's snapshot (a
        # frame moved meanwhile is read from the journal, or the tables, not twice)
        "spooled AS (SELECT * FROM temp.spool_journal s WHERE NOT EXISTS (SELECT 1 FROM "
        "main.journal x WHERE x.compaction_id = s.compaction_id) AND NOT EXISTS (SELECT 1 "
        "FROM main.compactions y WHERE y.compaction_id = s.compaction_id)), "
        "journal_all AS (SELECT * FROM main.journal UNION ALL SELECT * FROM spooled), "
        "journal_entries_all AS (SELECT rowid AS k, * FROM main.journal_entries UNION ALL "
        "SELECT * FROM temp.spool_journal_entries WHERE jid IN (SELECT id FROM spooled)), "
    ),
)
#: Where the spool's frames are numbered from, after any journal row id.
_SPOOL_IDS = 1 << 40


def _load_spool(conn: sqlite3.Connection, path: Path) -> str | None:
    """Load the frames of the archive's spool files into temporary tables of the read
    connection ``conn``; the prefix of read statements that then see those the archive
    does not hold yet, or ``None`` when there are none."""
    frames = [f for f in read_frames(path) if f.entries or f.journal[11]]
    if not frames:
        return None
    conn.execute("DROP TABLE IF EXISTS temp.spool_journal")
    conn.execute("DROP TABLE IF EXISTS temp.spool_journal_entries")
    conn.execute("CREATE TEMP TABLE spool_journal AS SELECT * FROM main.journal WHERE 0")
    conn.execute(
        "CREATE TEMP TABLE spool_journal_entries AS SELECT rowid AS k, * FROM "
        "main.journal_entries WHERE 0"
    )
    rows: builtins.list[tuple[Any, ...]] = []
    for n, f in enumerate(frames):
        jid = _SPOOL_IDS + n
        j = f.journal
        conn.execute(
            "INSERT INTO temp.spool_journal VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (jid, *j[:11], len(f.entries), j[11]),
        )
        rows += [(_SPOOL_IDS + len(rows) + k, jid, *e) for k, e in enumerate(f.entries)]
    conn.executemany("INSERT INTO temp.spool_journal_entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return _SPOOL_READ_WITH


def _has_journal(conn: sqlite3.Connection) -> bool:
    """Whether the archive has its journal table (version-2 archives written before it
    have not: the next writer adds it)."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'journal'"
    ).fetchone()
    return row is not None


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
#: Per archive path, the content hashes this process committed (``Archive._committed``).
_committed: dict[str, set[str]] = {}


def _after_fork() -> None:
    """In the child: a lock another thread held at the fork would stay held for ever."""
    for archive in list(_instances):
        archive._write_lock = threading.Lock()
        archive._checkpoint_lock = threading.Lock()
        archive._yield_lock = threading.Lock()
        archive._background_running = False
        archive._interrupt_sent = False
        archive.writers_waiting = 0
        archive._spool = None  # the parent's file and frames: the parent moves them
        archive._spooled = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def close_spools() -> None:
    """Move what every ``Archive`` of this process spooled and its background writer did
    not move (it gives up on a lock another process holds), waiting at most the busy
    timeout for the lock, then close the spool files, which removes those left empty (at
    the interpreter's exit, after the background writer's drain; a file with frames left
    is moved by the next writer)."""
    for archive in list(_instances):
        archive._move_left()
        if not archive._write_lock.acquire(timeout=1.0):  # a writer still at work
            continue
        try:
            archive._close_spool()
        finally:
            archive._write_lock.release()


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
    one it has open (deleted or rotated), so nothing is written into an unlinked file
    (what was spooled before is moved into the file it was committed for first). A
    compaction's write (``record(index=False)``) is spooled; :meth:`index` (the
    background writer's), :meth:`prune` and :meth:`close` move what this process spooled
    first. Reads use a connection per thread, so an ``Archive`` may be shared by threads.
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
    #: Size past which a write checkpoints it itself (no background writer keeping up).
    WAL_MAX_BYTES = 64 * 1024 * 1024
    #: Journal rows (and spooled compactions) the background writer moves per transaction.
    MOVE_BATCH = 2
    #: Bytes of spooled compactions not moved yet past which compactions are written to
    #: the archive directly (waiting for its lock, at most the busy timeout).
    SPOOL_MAX_BYTES = 16 * 1024 * 1024
    #: Content hashes of what it committed this process keeps per archive, to count what
    #: a spooled compaction drops again (about 11 MB at most).
    COMMITTED_MAX = 100_000
    #: Entries past which a spooled compaction looks up in the archive what it holds
    #: already, to count it (a re-compaction of a long history, say).
    LOOKUP_MIN = 64

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
        # content hash -> id of the journal row this process wrote it in (not moved yet),
        # and those rows in journal order with their hashes (to forget them once moved)
        self._journaled: dict[str, int] = {}
        self._journal_order: collections.deque[tuple[int, builtins.list[str]]] = collections.deque()
        _instances.add(self)
        self._wconn: sqlite3.Connection | None = None
        self._wpid = 0
        self._wid: tuple[int, int] | None = None
        self._checkpoint_lock = threading.Lock()
        self._ckpt: sqlite3.Connection | None = None
        self._ckpt_pid = 0
        self.writers_waiting = 0
        """Foreground writes waiting for the write lock (the background writer yields)."""
        # a background transaction in progress on the write connection (guarded by
        # _yield_lock): a foreground write interrupts it rather than wait for it
        self._yield_lock = threading.Lock()
        self._background_running = False
        # whether the running background transaction was sent an interrupt (guarded by
        # _yield_lock): SQLite does not always report it as "interrupted"
        self._interrupt_sent = False
        self.interrupted = 0
        """Background transactions a foreground write interrupted (they are retried)."""
        self.last_write = 0.0
        """:func:`time.monotonic` of the last :meth:`record` (the background writer waits
        for a pause before it indexes)."""
        self._spool: Spool | None = None
        # content hash -> the spooled frame holding it (not moved into the journal yet)
        self._spooled: dict[str, Frame] = {}
        # content hashes this process committed to the archive at this path, at most
        # COMMITTED_MAX (then forgotten), shared by its Archive objects
        self._committed = _committed.setdefault(str(self.path), set())
        self.move_failure: str | None = None
        """Why the last move of the spool into the archive failed (``None``: it did not).
        While it failed, compactions are written to the archive directly, so a failing
        archive refuses them with its own error."""

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
            # Deleted or rotated: what is left goes into the old file (the compactions
            # spooled before, too), then a new archive is opened at the path.
            self._spool_into(conn)
            self._drop_writer(moved=True)
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
            _probe_write(conn, self.timeout)
            conn.execute(f"PRAGMA synchronous = {self.sync.upper()}")
            # checkpoints are the background writer's (or a write's past WAL_MAX_BYTES);
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
        self._journaled.clear()
        self._journal_order.clear()
        self._replay(conn)
        return conn

    def _replay(self, conn: sqlite3.Connection) -> None:
        """Move what a process that ended before its background writer did (killed,
        crashed) left in its spool file and in the journal, at open. Readers see both
        meanwhile, so a failure here loses nothing: it is logged, and the next writer to
        open the archive tries again."""
        try:
            with contextlib.suppress(_NotMoved), orphans(self.path) as found:
                frames = in_order([fs for _, fs in found])
                moving = functools.partial(self._insert_frames, frames=frames, check=True)
                if frames and self._try(conn, moving, "spool files are moved later") is None:
                    raise _NotMoved  # the files stay
        except OSError as exc:  # reading or removing them
            log.warning("archive %s: spool files are moved later: %s", self.location, exc)
        try:
            pending = conn.execute("SELECT EXISTS (SELECT 1 FROM journal)").fetchone()[0]
        except sqlite3.Error as exc:
            log.warning("archive %s: the journal is moved later: %s", self.location, exc)
            return
        if pending:
            self._try(conn, schema.move_journal, "the journal is moved later")

    def _try(
        self, conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T], then: str
    ) -> T | None:
        """``work(conn)`` in one ``BEGIN IMMEDIATE`` transaction; on failure rolled back
        and logged (``then``: what happens to it), and ``None``."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = work(conn)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            log.warning("archive %s: %s: %s", self.location, then, exc)
            return None
        return result

    def _spool_into(self, conn: sqlite3.Connection) -> None:
        """Move the spooled frames into the archive open on ``conn`` (the file they were
        committed for, before it was rotated); on failure they go into the next one."""
        frames = self._pending_frames(0)
        moving = functools.partial(self._insert_frames, frames=frames)
        jids = self._try(conn, moving, "spooled compactions go to the new file") if frames else None
        if jids is not None:
            self._frames_moved(frames, jids)

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
            got = self._write_lock.acquire(blocking=False)
            if not got and foreground:
                got = self._interrupt_background()
            if not got:
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

    def _interrupt_background(self) -> bool:
        """Stop the background transaction holding the write lock, if one does (it is
        rolled back, and tried again later); whether the lock was then taken.

        The write connection is interrupted only while a background transaction holds
        the lock and runs on it (``_yield_lock``), so no foreground statement is ever
        interrupted; between two of its statements the interrupt may come too late, and
        the lock is then waited for as before (the background writer's transactions are
        small).
        """
        for _ in range(4):
            with self._yield_lock:
                conn = self._wconn
                if not self._background_running or conn is None:
                    return False
                self._interrupt_sent = True
                conn.interrupt()
            if self._write_lock.acquire(timeout=0.002):
                return True
        return False

    def _transaction(
        self,
        work: Any,
        doing: str,
        *,
        foreground: bool = False,
        background: bool = False,
        committed: Callable[[Any], None] | None = None,
    ) -> Any:
        """``work(conn)`` in one committed ``BEGIN IMMEDIATE`` transaction of the writer;
        ``committed(result)`` then, still holding this process's write lock.

        The real error is raised (as :class:`ArchiveError`), never one of the ROLLBACK
        after it (a failed COMMIT has often rolled back already). When the file at the
        path changed while it was written (deleted or rotated), the work is done again
        in the file now there: nothing is left only in an unlinked file.
        """
        with self._writing(foreground=foreground):
            for _ in range(3):
                conn = self._writer()
                if background:  # never hold this process's writes up waiting for another's
                    conn.execute(f"PRAGMA busy_timeout = {_BACKGROUND_WAIT_MS}")
                try:
                    if background:
                        with self._yield_lock:
                            self._background_running = True
                            self._interrupt_sent = False
                    conn.execute("BEGIN IMMEDIATE")
                    result = work(conn)
                    conn.execute("COMMIT")
                except BaseException as exc:
                    sent = False
                    if background:
                        with self._yield_lock:
                            self._background_running = False
                            sent, self._interrupt_sent = self._interrupt_sent, False
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    if isinstance(exc, sqlite3.Error):
                        # an interrupt reaching SQLite while it builds a virtual table
                        # (json_each) is reported as "vtable constructor failed"
                        if background and ("interrupted" in str(exc) or sent):
                            self.interrupted += 1
                            raise ArchiveBusyError(
                                f"archive {self.location!r}: a compaction's write went first"
                            ) from exc
                        if background and "locked" in str(exc):
                            raise ArchiveBusyError(f"archive {self.location!r}: busy") from exc
                        self._drop_writer()
                        raise self._error(exc, doing) from exc
                    raise
                finally:
                    if background:
                        with self._yield_lock:
                            self._background_running = False
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
                if _file_id(self.path) == self._wid:
                    if committed is not None:
                        committed(result)
                    return result
                self._drop_writer(moved=True)
            raise ArchiveError(
                f"archive {str(self.path)!r}: {doing}: the file kept being replaced while "
                "it was written"
            )

    def close(self) -> None:
        """Move what this process spooled (when the archive takes it), then close this
        thread's read connection, the write connection and the spool file."""
        self._move_left()
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
        with self._write_lock:
            if self._wpid == os.getpid():
                self._drop_writer()
            self._close_spool()
        with self._checkpoint_lock:
            ckpt, self._ckpt = self._ckpt, None
            if ckpt is not None and self._ckpt_pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    ckpt.close()

    def _close_spool(self) -> None:
        """Close the spool file (under the write lock): removed once empty, else moved
        by the next writer; a parent's, inherited over ``fork``, is left to the parent."""
        spool, self._spool = self._spool, None
        self._spooled = {}
        if spool is not None:
            spool.close()

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        """Check the file is an archive (or empty), switch it to WAL, create or migrate."""
        version = _archive_version(conn, self.path)
        mode = _journal_mode_wal(conn, self.timeout)
        if str(mode).lower() != "wal":  # pragma: no cover - e.g. a network file system
            raise sqlite3.OperationalError(f"{self.path}: could not enable WAL (got {mode!r})")
        if version == SCHEMA_VERSION and _has_journal(conn):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _archive_version(conn, self.path)  # another writer may have been first
            if version == 0:
                schema.create(conn)
            else:
                schema.migrate(conn, version)
                conn.execute(schema.JOURNAL_TABLE)  # a version-2 archive written before it
                conn.execute(schema.JOURNAL_ENTRIES_TABLE)
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
        """Commit the compaction: the content the archive does not hold yet (in its
        tables, in a journal row or spooled frame of this process not moved yet), and the
        ``seen`` of content dropped again.

        A compaction's write (``index`` false) is one frame appended to this process's
        spool (:mod:`normandy_archive.spool`), moved into the journal by :meth:`index`
        (the background writer's); readers see it meanwhile. Otherwise (or while the
        spool holds more than :data:`SPOOL_MAX_BYTES`, or its last move failed) it is
        one journal row in one transaction, after the spooled frames; with ``index`` it
        is then moved into the indexed tables at once.
        """
        if not index and self._spool_usable():
            return self._spool_write(rows, compaction, meta_json)
        spooled = self._spooled  # what this process spooled, as the write starts
        self.last_write = time.monotonic()
        stored: int = self._transaction(
            lambda conn: self._journal_write(conn, rows, compaction, meta_json, spooled),
            f"could not record {len(rows)} entries",
            foreground=not index,
            committed=lambda result: self._journal_written(rows, result),
        )[0]
        self.last_write = time.monotonic()
        if index:
            self.index()
        self.checkpoint(if_over=self.WAL_CHECKPOINT_BYTES if index else self.WAL_MAX_BYTES)
        return stored

    def _journal_write(
        self,
        conn: sqlite3.Connection,
        rows: Sequence[Prepared],
        compaction: CompactionRecord,
        meta_json: str,
        spooled: Mapping[str, Frame],
    ) -> tuple[int, int, builtins.list[str], Any]:
        """:meth:`_write`'s transaction: move the frames spooled before it, then one
        journal row of the content of ``rows`` that neither the tables, a journal row nor
        a frame of ``spooled`` holds, and of the content dropped again. Returns how many
        contents are new, the journal row's id, the hashes it holds, and the frames moved
        with their journal rows (for :meth:`_journal_written`)."""
        c = compaction
        frames = self._pending_frames(0)
        moved = self._insert_frames(conn, frames) if frames else []
        have = self._have(conn, rows)
        self._forget_moved_journal_rows(conn)
        journaled = self._journaled
        known = journaled.keys() | spooled.keys() if spooled else journaled.keys()
        fresh = [r for r in rows if r.content_hash not in have and r.content_hash not in known]
        again = [r.content_hash for r in rows if r.content_hash in known]
        if frames:
            # the frames before it refresh their content's seen when moved: so does
            # this one, after them (content the tables hold is written again, so a
            # prune before the move loses nothing)
            new = [r for r in rows if r.content_hash not in known]
        else:
            new = fresh
            if have:  # content dropped before: this session saw it last
                conn.executemany(schema.SEEN_SQL, [(c.session_id, c.created_at, h) for h in have])
        if not new and not again:
            return 0, 0, [], (frames, moved)
        cur = conn.execute(
            _JOURNAL_INSERT,
            (*_journal_values(c, meta_json), len(new), json.dumps(again) if again else None),
        )
        jid = int(cur.lastrowid or 0)
        if new:
            conn.executemany(_ENTRIES_INSERT, _journal_rows_of(jid, new))
        return len(fresh), jid, [r.content_hash for r in new], (frames, moved)

    def _forget_moved_journal_rows(self, conn: sqlite3.Connection) -> None:
        """Forget the journal rows this process wrote that were moved into the tables
        since (by any process)."""
        journaled, order = self._journaled, self._journal_order
        if not journaled:
            return
        first = conn.execute("SELECT min(id) FROM journal").fetchone()[0]
        while order and (first is None or order[0][0] < first):
            jid, gone = order.popleft()
            for h in gone:
                if journaled.get(h) == jid:
                    del journaled[h]

    def _journal_written(
        self, rows: Sequence[Prepared], result: tuple[int, int, builtins.list[str], Any]
    ) -> None:
        """Committed (under the write lock): the content of :meth:`_journal_write`'s
        journal row is in the journal now, its frames moved."""
        _, jid, written, done = result
        if done[0]:
            self._frames_moved(*done)
        if written:
            for h in written:
                self._journaled[h] = jid
            self._journal_order.append((jid, written))
        self._remember(r.content_hash for r in rows)  # written, or there already
        self.move_failure = None

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

    # -- the spool --------------------------------------------------------------------

    def _spool_usable(self) -> bool:
        spool = self._spool
        return (
            _CAN_SPOOL
            and self.move_failure is None
            and (spool.pending_bytes if spool is not None else 0) < self.SPOOL_MAX_BYTES
        )

    def _spool_write(
        self, rows: Sequence[Prepared], compaction: CompactionRecord, meta_json: str
    ) -> int:
        """Commit the compaction as one frame appended to this process's spool: every
        content it dropped but what this process's frames not moved yet hold (those are
        named in its ``seen``). Content the archive holds already is written again and
        left out by the move, which also refreshes its ``seen``: so what a prune removes
        meanwhile is not lost. Returns how many entries hold content new to the archive
        (``Recorded.entries``): looked up in it for a compaction of more than
        :data:`LOOKUP_MIN` entries; for fewer, new to what this process archived (the
        boundary does not read the archive)."""
        c = compaction
        doing = f"could not record {len(rows)} entries"
        self.last_write = time.monotonic()
        with self._writing(foreground=True):
            conn = self._writer()  # opened (checked, created, moved to), or reopened
            spooled, committed = self._spooled, self._committed
            have: Container[str] = ()
            if len(rows) > self.LOOKUP_MIN:
                try:
                    have = self._have(conn, rows)
                except sqlite3.Error as exc:
                    self._drop_writer()
                    raise self._error(exc, doing) from exc
            entries: builtins.list[EntryRow] = []
            new: builtins.list[str] = []
            again: builtins.list[str] = []
            known = 0
            for r in rows:
                h = r.content_hash
                if h in committed or h in have:
                    known += 1
                if h in spooled:
                    again.append(h)
                else:
                    new.append(h)
                    entries.append(r.row)
            if not new and not again:  # nothing dropped
                return 0
            frame = Frame(
                (*_journal_values(c, meta_json), json.dumps(again) if again else None),
                tuple(entries),
            )
            spool = self._spool
            try:
                if spool is None or spool.pid != os.getpid():
                    spool = self._spool = Spool(self.path, full_sync=self.sync == "full")
                spool.append(frame, encode(frame))
            except OSError as exc:
                raise self._spool_error(exc, doing) from exc
            spooled.update(dict.fromkeys(new, frame))
            self._remember(new)
        self.last_write = time.monotonic()
        return len(rows) - known

    def _remember(self, hashes: Iterable[str]) -> None:
        """Note content this process committed (to count what a spooled compaction
        finds there already; never to leave it out of a frame)."""
        committed = self._committed
        if len(committed) > self.COMMITTED_MAX:
            committed.clear()
        committed.update(hashes)

    def _spool_error(self, exc: OSError, doing: str) -> ArchiveError:
        where = self._spool.path if self._spool is not None else self.path.parent
        text = f"{exc.strerror or exc} (writing the spool file {str(where)!r})"
        if exc.errno in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", -1)):
            text += self._why_full() or ": database or disk is full"
        return ArchiveError(f"archive {str(self.path)!r}: {doing}: {text}")

    def _pending_frames(self, limit: int) -> builtins.list[Frame]:
        """The oldest spooled frames not moved yet (at most ``limit``; 0: all), under the
        write lock."""
        spool = self._spool
        if spool is None or spool.pid != os.getpid() or not spool.pending:
            return []
        pending = spool.pending
        count = len(pending) if limit <= 0 else min(limit, len(pending))
        return [pending[n][0] for n in range(count)]

    def _insert_frames(
        self, conn: sqlite3.Connection, frames: Sequence[Frame], *, check: bool = False
    ) -> builtins.list[int]:
        """Write ``frames`` into the journal (inside the caller's transaction): each a
        journal row with its entries; the journal row ids (0: none). With ``check``, a
        frame whose compaction the archive already holds (moved before its file was
        emptied) is skipped."""
        jids: builtins.list[int] = []
        for f in frames:
            j = f.journal
            if (
                check
                and conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM journal WHERE compaction_id = ?1) OR EXISTS "
                    "(SELECT 1 FROM compactions WHERE compaction_id = ?1)",
                    (j[0],),
                ).fetchone()[0]
            ):
                jids.append(0)
                continue
            if not f.entries and j[11] is None:
                jids.append(0)
                continue
            cur = conn.execute(_JOURNAL_INSERT, (*j[:11], len(f.entries), j[11]))
            jid = int(cur.lastrowid or 0)
            if f.entries:
                conn.executemany(_ENTRIES_INSERT, [(jid, *e) for e in f.entries])
            jids.append(jid)
        return jids

    def _frames_moved(self, frames: Sequence[Frame], jids: Sequence[int]) -> None:
        """Committed: ``frames`` are journal rows ``jids`` now (under the write lock)."""
        assert self._spool is not None
        self._spool.moved(len(frames))
        spooled, journaled = self._spooled, self._journaled
        for f, jid in zip(frames, jids, strict=True):
            written = [e[1] for e in f.entries]
            for h in written:
                if spooled.get(h) is f:
                    del spooled[h]
                if jid:
                    journaled[h] = jid
            if jid and written:
                self._journal_order.append((jid, written))

    def _move_spools(self, *, yield_to_writers: bool) -> None:
        """Move what this process spooled for this archive, through this ``Archive`` and
        any other of the same path."""
        self._move_spool(yield_to_writers=yield_to_writers)
        for other in list(_instances):
            if other is not self and other.path == self.path and other._pending_frames(1):
                other._move_spool(yield_to_writers=yield_to_writers)
        own = self._spool.path if self._spool is not None else None
        if any(p != own for p in spool_files(self.path)):
            self._move_orphans(background=yield_to_writers)

    def _move_orphans(self, *, background: bool) -> None:
        """Move what spool files no live ``Archive`` holds (their process ended, or their
        ``Archive`` was dropped unclosed) hold, and remove the files."""
        try:
            with orphans(self.path) as found:
                frames = in_order([fs for _, fs in found])
                if frames:
                    self._transaction(
                        lambda conn: self._insert_frames(conn, frames, check=True),
                        "could not move the compactions an ended process spooled",
                        background=background,
                    )
        except OSError as exc:  # reading or removing them: readers see them meanwhile
            log.warning("archive %s: spool files are moved later: %s", self.location, exc)

    def _move_left(self) -> None:
        """Move what this process spooled and has not moved yet, waiting at most the busy
        timeout for the lock; on failure it stays in the spool file (logged), read by
        readers and moved by the next writer."""
        spool = self._spool
        if spool is not None and spool.pid == os.getpid() and spool.pending:
            try:
                self._move_spool(yield_to_writers=False)
            except ArchiveError as exc:
                log.warning("archive %s: spooled compactions moved later: %s", self.location, exc)

    def _move_spool(self, *, yield_to_writers: bool) -> int:
        """Move the spooled frames into the journal; how many it moved."""
        step = self.MOVE_BATCH if yield_to_writers else 0
        done = 0
        while True:
            while yield_to_writers and self.writers_waiting:
                time.sleep(0.0005)

            def work(conn: sqlite3.Connection) -> tuple[builtins.list[Frame], builtins.list[int]]:
                frames = self._pending_frames(step)
                return frames, self._insert_frames(conn, frames) if frames else []

            def moved(result: tuple[builtins.list[Frame], builtins.list[int]]) -> None:
                if result[0]:
                    self._frames_moved(*result)
                self.move_failure = None

            if not self._pending_frames(1):
                return done
            try:
                frames, _ = self._transaction(
                    work,
                    "could not move the spooled compactions",
                    background=yield_to_writers,
                    committed=moved,
                )
            except ArchiveBusyError:
                raise
            except ArchiveError as exc:
                self.move_failure = str(exc)
                raise
            done += len(frames)
            if not frames:
                return done

    def index(self, *, batch: int = 16, yield_to_writers: bool = False) -> int:
        """Move this process's spooled compactions into the journal and the journal into
        the indexed tables, then index for full-text search what was written and not
        indexed yet; how many entries it indexed.

        In transactions of at most ``batch`` entries, so a writer waits for one batch at
        most; with ``yield_to_writers`` (the background writer), a compaction waiting to
        write goes first between two batches. Rows a killed process left unindexed are
        indexed too.
        """
        self._move_spools(yield_to_writers=yield_to_writers)
        step = self.MOVE_BATCH if yield_to_writers else 0  # 0: the whole journal at once
        self._in_batches(
            lambda conn: schema.move_journal(conn, step),
            "could not move the journal",
            step,
            yield_to_writers=yield_to_writers,
        )
        return self._in_batches(
            lambda conn: schema.index_pending(conn, batch),
            "could not index",
            batch,
            yield_to_writers=yield_to_writers,
        )

    def _in_batches(
        self,
        work: Callable[[sqlite3.Connection], int],
        doing: str,
        size: int,
        *,
        yield_to_writers: bool,
    ) -> int:
        """``work`` (which handles at most ``size`` rows, all with 0) in one transaction
        after another until it handles fewer; how many rows in all. With
        ``yield_to_writers``, a compaction waiting to write goes first between two."""
        total = 0
        while True:
            while yield_to_writers and self.writers_waiting:
                time.sleep(0.0005)
            done: int = self._transaction(work, doing, background=yield_to_writers)
            total += done
            if not size or done < size:
                return total

    def checkpoint(self, *, if_over: int = 0) -> bool:
        """Copy the write-ahead log into the database file (when it holds more than
        ``if_over`` bytes); whether it did. Readers are never waited for."""
        try:
            size = os.stat(f"{self.path}-wal").st_size
        except OSError:
            return False
        if size <= if_over:
            return False
        # on a connection of its own: a checkpoint runs beside a write, so it never holds
        # a compaction up
        with self._checkpoint_lock:
            conn = self._ckpt
            if conn is None or self._ckpt_pid != os.getpid() or _check_path(self.path) is None:
                try:
                    conn = sqlite3.connect(self.path, timeout=0, check_same_thread=False)
                except sqlite3.Error as exc:
                    raise self._error(exc, "could not checkpoint") from exc
                self._ckpt, self._ckpt_pid = conn, os.getpid()
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
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
        self._move_spools(yield_to_writers=False)  # pruned with the rest

        def work(conn: sqlite3.Connection) -> int:
            schema.move_journal(conn)
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

        removed: int = self._transaction(work, "could not prune")
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
        """``work`` with a ``run`` that, while the journal holds compactions not moved
        yet, reads ``entries`` and ``compactions`` with the journal's rows in them
        (:data:`~normandy_archive.schema.READ_WITH`)."""
        with self._connect() as conn:
            if conn is None:
                return None
            version = self._local.version

            def run(q: str, p: Sequence[Any]) -> builtins.list[tuple[Any, ...]]:
                return conn.execute(q, p).fetchall()

            if version != 1 and spool_files(self.path):
                with_spool = _load_spool(conn, self.path)
                if with_spool is not None:

                    def run(q: str, p: Sequence[Any]) -> builtins.list[tuple[Any, ...]]:
                        if q.startswith("SELECT"):
                            q = with_spool + q
                        return conn.execute(q, p).fetchall()

                    return work(version, run)
            if version != 1 and _journal_rows(conn):

                def run(q: str, p: Sequence[Any]) -> builtins.list[tuple[Any, ...]]:
                    if q.startswith("SELECT"):
                        q = schema.READ_WITH + q
                    return conn.execute(q, p).fetchall()

            return work(version, run)

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

"""The PostgreSQL archive of dropped entries, for fleets of agents sharing one database.

:class:`PostgresArchive` has the public API of the SQLite :class:`~normandy_archive.Archive`
(``record``, ``recall``, ``versions``, ``list``, ``search``, ``compactions``, ``count``,
``close``, and ``prune``) and stores the same records, so the same commands read it.
It needs psycopg 3: ``pip install 'normandy-archive[postgres]'``.

Schema (version 2), in a PostgreSQL schema of its own (``normandy`` by default), with the
records and semantics of the SQLite archive's (:mod:`normandy_archive.schema`):

* ``schema_version``: the versions applied.
* ``compactions``: one row per compaction that stored something, as in SQLite, plus
  ``seq`` (archive order among compactions of the same time).
* ``entries``: one row per distinct *content*, unique on ``content_hash`` (SHA-256 of the
  entry's role and content, :func:`~normandy_archive.schema.content_hash`) across
  sessions, so content dropped again (a re-compaction of the same history, another
  session, another agent of the fleet) is stored once. ``entry_json`` holds the entry
  exactly as first dropped, so a recalled entry is equal byte for byte; ``source_ids``
  the caller's ids found in it (a GIN index); ``text`` is the searchable text with ASCII
  punctuation made blanks (a separator, as for SQLite's ``unicode61`` tokenizer; done here
  rather than in SQL, where it would double the cost of indexing); ``tsv`` is a generated
  ``tsvector`` column over it (configuration ``simple``: no stemming, no stop words, any
  language), searched through a GIN index.
* ``seen``: for each content, the session that dropped it last and when; retention goes
  by it, as in SQLite.

A version-1 schema (one row per version of an entry in a session) is read as it is and
moved to version 2 by the first write.

Writes are safe from many processes on many machines at once: one transaction per
compaction, every insert ``ON CONFLICT`` (writing the same content again changes nothing,
whoever wrote it first, so a write whose commit was not acknowledged is retried),
deadlocks and serialization failures retried. The schema is created by the
first write (``CREATE ... IF NOT EXISTS`` in one transaction under an advisory lock, so
concurrent first writers do not collide); reads never create it, and a missing schema is
a :class:`PostgresArchiveError` that says so.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from normandy_archive.errors import ArchiveError
from normandy_archive.schema import SEEN_REFRESH, content_hash, source_ids
from normandy_archive.store import (
    ArchivedEntry,
    CompactionRecord,
    PrunePlan,
    Recorded,
    _page,
    _serialized,
    check_limits,
    choose_sessions,
    searchable_text,
)
from normandy_core import Entry

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the PostgreSQL archive needs psycopg 3: pip install 'normandy-archive[postgres]'"
    ) from exc

__all__ = ["SCHEMA_VERSION", "PostgresArchive", "PostgresArchiveError", "is_postgres_url"]

SCHEMA_VERSION = 2
#: The schema versions this code reads (a writer moves version 1 to version 2).
READABLE_VERSIONS = (1, SCHEMA_VERSION)

#: How much of an entry's searchable text is indexed: a ``tsvector`` holds at most 1 MiB,
#: and 100,000 characters of words stay far below that in any script.
INDEXED_CHARS = 100_000

_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_PUNCT_TABLE = str.maketrans(_PUNCT, " " * len(_PUNCT))
_RAW_TABLE = str.maketrans({ord(c): " " for c in _PUNCT if c not in '"-'})
_TSV = f"to_tsvector('simple'::regconfig, left(text, {INDEXED_CHARS}))"

# {s} is the schema (an identifier); each statement is idempotent.
_SEEN_DDL = (
    """CREATE TABLE IF NOT EXISTS {s}.seen (
        seq        bigint PRIMARY KEY REFERENCES {s}.entries (seq) ON DELETE CASCADE,
        session_id text NOT NULL,
        at         double precision NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS seen_by_session ON {s}.seen (session_id)",
    "CREATE INDEX IF NOT EXISTS entries_by_source ON {s}.entries USING gin (source_ids)",
)
_DDL = (
    """CREATE TABLE IF NOT EXISTS {s}.schema_version (
        version    integer PRIMARY KEY,
        applied_at timestamptz NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE IF NOT EXISTS {s}.compactions (
        compaction_id text PRIMARY KEY,
        seq           bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        session_id    text NOT NULL,
        compactor     text,
        strategy      text,
        model         text,
        mid_round     boolean,
        created_at    double precision NOT NULL,
        entry_count   integer NOT NULL,
        tokens_before bigint,
        tokens_after  bigint,
        meta_json     text NOT NULL,
        dropped_count integer
    )""",
    "CREATE INDEX IF NOT EXISTS compactions_by_session ON {s}.compactions (session_id, created_at)",
    "CREATE INDEX IF NOT EXISTS compactions_by_time ON {s}.compactions (created_at, seq)",
    # compaction_id names the compaction that first stored the content; retention may
    # remove that compaction while a more recent session keeps the content (as in SQLite)
    f"""CREATE TABLE IF NOT EXISTS {{s}}.entries (
        seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id    text NOT NULL,
        entry_id      text NOT NULL,
        content_hash  text NOT NULL UNIQUE,
        turn_id       text,
        role          text NOT NULL,
        entry_json    text NOT NULL,
        source_ids    text[],
        text          text NOT NULL,
        compaction_id text NOT NULL,
        archived_at   double precision NOT NULL,
        tsv           tsvector GENERATED ALWAYS AS ({_TSV}) STORED
    )""",
    "CREATE INDEX IF NOT EXISTS entries_by_id ON {s}.entries (entry_id, seq)",
    "CREATE INDEX IF NOT EXISTS entries_by_session ON {s}.entries (session_id, seq)",
    "CREATE INDEX IF NOT EXISTS entries_by_compaction ON {s}.entries (compaction_id)",
    "CREATE INDEX IF NOT EXISTS entries_tsv ON {s}.entries USING gin (tsv)",
    *_SEEN_DDL,
)

#: Records one compaction (one statement): its new contents, in the order dropped, each
#: with its first ``seen``; the compaction row when it stored something; the count stored.
_RECORD = """WITH t AS (
    SELECT * FROM unnest(%(ids)s::text[], %(hashes)s::text[], %(turns)s::text[],
        %(roles)s::text[], %(jsons)s::text[], %(sources)s::text[], %(texts)s::text[])
        WITH ORDINALITY AS t(entry_id, content_hash, turn_id, role, entry_json, source_ids,
        text, n)
), ins AS (
    INSERT INTO {s}.entries (session_id, entry_id, content_hash, turn_id, role, entry_json,
        source_ids, text, compaction_id, archived_at)
    SELECT %(session)s, t.entry_id, t.content_hash, t.turn_id, t.role, t.entry_json,
        CASE WHEN t.source_ids IS NOT NULL
            THEN ARRAY(SELECT json_array_elements_text(t.source_ids::json)) END,
        t.text, %(cid)s, %(at)s
    FROM t ORDER BY t.n
    ON CONFLICT (content_hash) DO NOTHING
    RETURNING seq
), compaction AS (
    INSERT INTO {s}.compactions (compaction_id, session_id, compactor, strategy, model,
        mid_round, created_at, entry_count, tokens_before, tokens_after, meta_json,
        dropped_count)
    SELECT %(cid)s, %(session)s, %(compactor)s, %(strategy)s, %(model)s, %(mid_round)s,
        %(at)s, stored.n, %(tokens_before)s, %(tokens_after)s, %(meta)s, %(dropped)s
    FROM (SELECT count(*) AS n FROM ins) AS stored WHERE stored.n > 0
    ON CONFLICT (compaction_id) DO NOTHING
), first_seen AS (
    INSERT INTO {s}.seen (seq, session_id, at) SELECT seq, %(session)s, %(at)s FROM ins
)
SELECT count(*) FROM ins"""

#: Content this compaction dropped that was there before: its ``seen`` moves to this
#: session unless the same session saw it recently (a statement of its own, so it sees
#: content another writer committed while this one waited for it).
_SEEN = f"""INSERT INTO {{s}}.seen AS s (seq, session_id, at)
SELECT e.seq, %(session)s, %(at)s FROM {{s}}.entries e
WHERE e.content_hash = ANY(%(hashes)s::text[]) AND e.compaction_id <> %(cid)s
ORDER BY e.seq
ON CONFLICT (seq) DO UPDATE SET session_id = excluded.session_id, at = excluded.at
WHERE s.at <= excluded.at
    AND (s.session_id <> excluded.session_id OR s.at < excluded.at - {SEEN_REFRESH})"""

_COLUMNS = (
    "e.seq, e.session_id, e.entry_json, e.content_hash, e.compaction_id, e.archived_at, "
    "c.compactor, c.strategy"
)

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_MAX_BIGINT = 2**63 - 1
_ATTEMPTS = 5


class PostgresArchiveError(ArchiveError, RuntimeError):
    """The PostgreSQL archive cannot be used: no schema, a newer schema, or a database error.

    The message names the archive (its URL without the password); the driver's
    exception, if any, is chained.
    """


def is_postgres_url(target: object) -> bool:
    """Whether ``target`` is a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def _display(url: str) -> str:
    """The URL without its password (for messages and ``repr``)."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.Error:
        return "postgresql://?"
    user = f"{info['user']}@" if info.get("user") else ""
    host = str(info.get("host") or "")
    port = f":{info['port']}" if info.get("port") else ""
    db = str(info.get("dbname") or "")
    if host.startswith("/"):  # a Unix socket directory
        return f"postgresql://{user}{port}/{db}?host={host}"
    return f"postgresql://{user}{host}{port}/{db}"


def _clean(text: str) -> str:
    """PostgreSQL text cannot hold NUL; lone surrogates cannot be encoded."""
    if "\x00" in text:
        text = text.replace("\x00", " ")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _words(text: str) -> str:
    """``text`` with ASCII punctuation as blanks: what the index sees."""
    return text.translate(_PUNCT_TABLE)


def _websearch(query: str, raw: bool) -> str:
    """The ``websearch_to_tsquery`` input for ``query``.

    By default each whitespace-separated term must occur, its punctuation taken as a
    separator (``src/utils.py`` is the phrase ``src utils py``): every term is quoted, so
    nothing in it is syntax. With ``raw``, the web-search syntax stays: ``"exact
    phrase"``, ``OR``, ``-excluded``.
    """
    if not raw:
        terms = (" ".join(_words(t).split()) for t in query.split())
        return " ".join(f'"{t}"' for t in terms if t)
    # keep the syntax's quotes and a leading minus; other punctuation separates words
    kept = re.sub(r"(?<=\w)-", " ", query)
    return kept.translate(_RAW_TABLE)


def _int_or_none(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _MAX_BIGINT
    return value if ok else None


def _lock_key(schema: str) -> int:
    digest = hashlib.sha256(f"normandy_archive.schema:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _retryable(exc: BaseException, conn: psycopg.Connection[Any] | None) -> bool:
    """A deadlock, a serialization failure, or a connection lost after it was made."""
    if isinstance(exc, (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)):
        return True
    return isinstance(exc, psycopg.OperationalError) and conn is not None and conn.broken


def _pipeline(conn: psycopg.Connection[Any]) -> contextlib.AbstractContextManager[Any]:
    """Pipeline mode where libpq has it (14 and later), else statements one by one."""
    return conn.pipeline() if psycopg.Pipeline.is_supported() else contextlib.nullcontext()


def _disown(conn: psycopg.Connection[Any]) -> None:
    """Drop a connection inherited through ``fork`` without ending the parent's session.

    Closing it (or letting it be collected) would send the server a Terminate message
    on the socket the parent still uses; the child's copy of the socket is pointed at
    ``/dev/null`` first, so that message goes nowhere.
    """
    with contextlib.suppress(OSError, psycopg.Error):
        fd = conn.fileno()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        conn.close()


class PostgresArchive:
    """The archive in the PostgreSQL database at ``url`` (``postgresql://user@host/db``).

    Tables live in the PostgreSQL schema ``schema`` (default ``normandy``). Each thread
    uses a connection of its own (autocommit, explicit transactions), kept open between
    calls and opened anew after ``fork`` or after a failure, so a ``PostgresArchive`` may
    be shared by threads. ``timeout`` bounds the wait for a connection and for a lock
    (``lock_timeout``). Reading never creates the schema.
    """

    def __init__(self, url: str, *, schema: str = "normandy", timeout: float = 30.0) -> None:
        if not is_postgres_url(url):
            raise ValueError(f"not a postgresql:// URL: {_display(url)!r}")
        if not _SCHEMA_NAME.match(schema):
            raise ValueError(f"schema must be a plain identifier, got {schema!r}")
        self.url = url
        self.schema = schema
        self.timeout = timeout
        self._lock_timeout = f"{max(1, int(timeout * 1000))}"
        self.location = _display(url)
        """The URL without its password, for messages."""
        self._ready = False  # the schema is known to exist at our version (writes)
        self._checked = False  # the schema is known to exist (reads)
        self._read_version = SCHEMA_VERSION  # its version, once checked
        self._local = threading.local()
        self._sql: dict[str, sql.Composed] = {}

    def __repr__(self) -> str:
        return f"<PostgresArchive {self.location!r} schema={self.schema!r}>"

    def _q(self, text: str) -> sql.Composed:
        """``text`` with ``{s}`` bound to the schema identifier (cached)."""
        hit = self._sql.get(text)
        if hit is None:
            hit = self._sql[text] = sql.SQL(text).format(s=sql.Identifier(self.schema))
        return hit

    def _error(self, message: str) -> PostgresArchiveError:
        return PostgresArchiveError(f"PostgreSQL archive {self.location}: {message}")

    # -- connections ------------------------------------------------------------------

    def _open(self) -> psycopg.Connection[Any]:
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(self.timeout)),
            # no server-side prepared statements: safe behind PgBouncer in any pool mode
            "prepare_threshold": None,
        }
        if "application_name" not in conninfo_to_dict(self.url) and not os.environ.get("PGAPPNAME"):
            kwargs["application_name"] = "normandy-archive"
        return psycopg.connect(self.url, **kwargs)

    def _begin(self, conn: psycopg.Connection[Any]) -> None:
        """First statement of a write transaction: bound lock waits (this transaction only,
        so nothing leaks to other clients of a pooled server connection)."""
        conn.execute("SELECT set_config('lock_timeout', %s, true)", [self._lock_timeout])

    @contextlib.contextmanager
    def _connect(self) -> Iterator[psycopg.Connection[Any]]:
        """This thread's connection; a failure drops it and is raised as is."""
        local = self._local
        conn: psycopg.Connection[Any] | None = getattr(local, "conn", None)
        if conn is not None and local.pid != os.getpid():
            _disown(conn)
            conn = None
        if conn is None or conn.closed:
            conn = self._open()
            local.conn, local.pid = conn, os.getpid()
        try:
            yield conn
        except psycopg.Error:
            if conn.broken or conn.closed:
                local.conn = None
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            raise

    def close(self) -> None:
        """Close this thread's connection (another is opened on the next call)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            if self._local.pid == os.getpid():
                conn.close()
            else:
                _disown(conn)

    # -- schema -----------------------------------------------------------------------

    def _version(self, conn: psycopg.Connection[Any]) -> int | None:
        """The schema version, or ``None`` when there is no archive schema."""
        found = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s "
            "AND tablename = 'schema_version'",
            [self.schema],
        ).fetchone()
        if found is None:
            return None
        row = conn.execute(self._q("SELECT max(version) FROM {s}.schema_version")).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _check_version(self, version: int | None) -> None:
        if version is not None and version > SCHEMA_VERSION:
            raise self._error(
                f"schema {self.schema!r} is at version {version}; this normandy-archive "
                f"reads versions up to {SCHEMA_VERSION}: upgrade normandy-archive"
            )

    def create_schema(self) -> None:
        """Create the schema, tables and indexes if they are missing, or move a version-1
        schema to version 2 (idempotent).

        The first write does this by itself; call it once as the database owner when
        the agents' role may not create schemas.
        """
        with self._wrapped(), self._connect() as conn:
            self._create(conn)

    def _create(self, conn: psycopg.Connection[Any]) -> None:
        version = self._version(conn)
        self._check_version(version)
        if version != SCHEMA_VERSION:
            with conn.transaction():
                self._begin(conn)
                # concurrent CREATE ... IF NOT EXISTS can still collide: one creator at a time
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_key(self.schema)])
                version = self._version(conn)
                self._check_version(version)
                if version is None:
                    # a schema made by the database owner for the agents' role is used as
                    # it is: CREATE SCHEMA would need CREATE on the database even then
                    if not conn.execute(
                        "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", [self.schema]
                    ).fetchone():
                        conn.execute(self._q("CREATE SCHEMA IF NOT EXISTS {s}"))
                    for stmt in _DDL:
                        conn.execute(self._q(stmt))
                elif version == 1:
                    self._migrate(conn)
                conn.execute(
                    self._q(
                        "INSERT INTO {s}.schema_version (version) VALUES (%s) "
                        "ON CONFLICT DO NOTHING"
                    ),
                    [SCHEMA_VERSION],
                )
        self._ready = self._checked = True
        self._read_version = SCHEMA_VERSION

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Move a version-1 schema to version 2 (in the caller's transaction).

        Version 1 stored one row per ``(session, entry id, hash of the whole entry)``: the
        rows are kept in archive order, the first of each content (what later readers
        recall), with the caller's ids found in it; its ``seen`` is the session that
        dropped that content last, as SQLite's move to version 2 does.
        """
        conn.execute(
            self._q("ALTER TABLE {s}.compactions ADD COLUMN IF NOT EXISTS dropped_count integer")
        )
        conn.execute(self._q("UPDATE {s}.compactions SET dropped_count = entry_count"))
        names = conn.execute(
            "SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid = %s::regclass "
            "AND contype IN ('u', 'f')",
            [f'"{self.schema}".entries'],
        ).fetchall()
        for (name,) in names:  # unique per session and id; the reference to compactions
            conn.execute(
                sql.SQL("ALTER TABLE {s}.entries DROP CONSTRAINT {c}").format(
                    s=sql.Identifier(self.schema), c=sql.Identifier(name)
                )
            )
        conn.execute(self._q("ALTER TABLE {s}.entries ADD COLUMN source_ids text[]"))
        first: dict[str, int] = {}  # content -> the row kept
        owner: dict[str, tuple[str, float]] = {}  # content -> (last session, when)
        ids: dict[int, builtins.list[str]] = {}
        rows = conn.execute(
            self._q("SELECT seq, session_id, entry_json, archived_at FROM {s}.entries ORDER BY seq")
        )
        for seq, session, data, at in rows:
            entry = Entry.model_validate_json(data)
            digest = content_hash(entry, data)
            first.setdefault(digest, seq)
            if first[digest] == seq and (found := source_ids(entry)):
                ids[seq] = found
            last = owner.get(digest)
            if last is None or (
                last[1] <= at and (last[0] != session or last[1] < at - SEEN_REFRESH)
            ):
                owner[digest] = (session, at)
        keep = {seq: digest for digest, seq in first.items()}
        conn.execute(
            self._q("DELETE FROM {s}.entries WHERE NOT (seq = ANY(%s::bigint[]))"), [list(keep)]
        )
        conn.execute(
            self._q(
                "UPDATE {s}.entries e SET content_hash = t.h, source_ids = CASE WHEN t.src "
                "IS NOT NULL THEN ARRAY(SELECT json_array_elements_text(t.src::json)) END "
                "FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS t(seq, h, src) "
                "WHERE e.seq = t.seq"
            ),
            [
                list(keep),
                list(keep.values()),
                [json.dumps(ids[q]) if q in ids else None for q in keep],
            ],
        )
        conn.execute(
            self._q(
                "ALTER TABLE {s}.entries ADD CONSTRAINT entries_content_hash_key "
                "UNIQUE (content_hash)"
            )
        )
        for stmt in _SEEN_DDL:
            conn.execute(self._q(stmt))
        conn.execute(
            self._q(
                "INSERT INTO {s}.seen (seq, session_id, at) "
                "SELECT * FROM unnest(%s::bigint[], %s::text[], %s::float8[])"
            ),
            [
                list(keep),
                [owner[d][0] for d in keep.values()],
                [owner[d][1] for d in keep.values()],
            ],
        )
        conn.execute(
            self._q(
                "UPDATE {s}.compactions c SET entry_count = (SELECT count(*) FROM "
                "{s}.entries e WHERE e.compaction_id = c.compaction_id)"
            )
        )

    def _require(self, conn: psycopg.Connection[Any]) -> int:
        """The schema version to read; refuse a database without the archive schema
        (never create it)."""
        if self._checked:
            return self._read_version
        version = self._version(conn)
        if version is None:
            raise self._error(
                f"no Normandy archive here (schema {self.schema!r} has no archive tables); "
                "the first archived compaction creates it"
            )
        self._check_version(version)
        self._checked, self._read_version = True, version
        return version

    @contextlib.contextmanager
    def _wrapped(self) -> Iterator[None]:
        """Database errors as :class:`PostgresArchiveError` naming the archive."""
        try:
            yield
        except (pg_errors.UndefinedTable, pg_errors.UndefinedColumn) as exc:
            self._checked = self._ready = False
            raise self._error(f"the archive tables are gone or changed ({exc})") from exc
        except psycopg.Error as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            raise self._error("; ".join(lines) or type(exc).__name__) from exc

    # -- writing ----------------------------------------------------------------------

    def record(
        self,
        dropped: Sequence[Entry],
        *,
        session_id: str,
        compactor: str | None = None,
        strategy: str | None = None,
        model: str | None = None,
        mid_round: bool | None = None,
        meta: Mapping[str, Any] | None = None,
        compaction_id: str | None = None,
        at: float | None = None,
    ) -> Recorded:
        """Archive one compaction's dropped entries in one committed transaction.

        Content the archive already holds (dropped before by this session or another,
        by this agent or another) is not stored again; the compaction is recorded only
        when it stored something. All or nothing: a crash leaves either every entry it
        stored or none. Writers of the same content at the same moment wait for each
        other's commit, and the one that commits first stores it. Returns the compaction
        id with the counts (:class:`~normandy_archive.Recorded`).
        """
        cid = compaction_id or uuid.uuid4().hex
        now = time.time() if at is None else at
        info = {k: v for k, v in (meta or {}).items() if k != "dropped"}
        rows: dict[str, tuple[Any, ...]] = {}
        for e in dropped:
            data, digest = _serialized(e)
            if digest not in rows:
                ids = source_ids(e)
                text = _words(_clean(searchable_text(e)))
                rows[digest] = (e.id, digest, e.turn_id, e.role, data, ids, text)
        cols = builtins.list(zip(*rows.values(), strict=True)) or [()] * 7
        params = {
            "ids": builtins.list(cols[0]),
            "hashes": builtins.list(cols[1]),
            "turns": builtins.list(cols[2]),
            "roles": builtins.list(cols[3]),
            "jsons": builtins.list(cols[4]),
            "sources": [json.dumps(i) if i else None for i in cols[5]],
            "texts": builtins.list(cols[6]),
            "session": session_id,
            "cid": cid,
            "at": now,
            "compactor": compactor,
            "strategy": strategy,
            "model": model,
            "mid_round": mid_round,
            "tokens_before": _int_or_none(info.get("tokens_before")),
            "tokens_after": _int_or_none(info.get("tokens_after")),
            "meta": _clean(json.dumps(info, ensure_ascii=False, default=str)),
            "dropped": len(dropped),
        }
        stored = 0
        with self._wrapped():
            for attempt in range(1, _ATTEMPTS + 1):
                conn: psycopg.Connection[Any] | None = None
                try:
                    with self._connect() as conn:
                        if not self._ready:
                            self._create(conn)
                        if not rows:
                            break
                        # two round trips (BEGIN and the statements together, then COMMIT)
                        # where one at a time would take four
                        with _pipeline(conn), conn.transaction():
                            self._begin(conn)
                            cur = conn.execute(self._q(_RECORD), params)
                            conn.execute(self._q(_SEEN), params)
                        row = cur.fetchone()
                        stored = int(row[0]) if row else 0
                    break
                except psycopg.Error as exc:
                    if attempt == _ATTEMPTS or not _retryable(exc, conn):
                        raise
                    time.sleep(random.uniform(0.01, 0.05) * attempt)
        return Recorded(cid, stored, len(rows) - stored)

    # -- retention --------------------------------------------------------------------

    def _plan(
        self,
        conn: psycopg.Connection[Any],
        *,
        max_bytes: int | None,
        max_age_seconds: float | None,
        max_sessions: int | None,
        now: float | None,
    ) -> PrunePlan:
        rows = conn.execute(
            self._q(
                "SELECT coalesce(s.session_id, e.session_id) AS sid, "
                "max(coalesce(s.at, e.archived_at)) AS last, count(*), "
                "coalesce(sum(octet_length(e.entry_json)), 0) FROM {s}.entries e "
                "LEFT JOIN {s}.seen s ON s.seq = e.seq GROUP BY sid ORDER BY last, sid"
            )
        ).fetchall()
        return choose_sessions(
            rows,
            sum(int(r[3]) for r in rows),
            max_bytes=max_bytes,
            max_age_seconds=max_age_seconds,
            max_sessions=max_sessions,
            now=now,
        )

    def prune_plan(
        self,
        *,
        max_bytes: int | None = None,
        max_age_seconds: float | None = None,
        max_sessions: int | None = None,
        now: float | None = None,
    ) -> PrunePlan:
        """What :meth:`prune` would remove with these limits (read-only), as in SQLite;
        the bytes are those of the stored JSON."""
        check_limits(max_bytes, max_age_seconds, max_sessions)
        with self._wrapped(), self._connect() as conn:
            if self._require(conn) == 1:
                raise self._error(
                    f"schema {self.schema!r} is of version 1: it is moved to version 2 by the "
                    "next write (prune it, or archive a compaction, first)"
                )
            return self._plan(
                conn,
                max_bytes=max_bytes,
                max_age_seconds=max_age_seconds,
                max_sessions=max_sessions,
                now=now,
            )

    def prune(
        self,
        *,
        max_age_seconds: float | None = None,
        max_sessions: int | None = None,
        max_bytes: int | None = None,
        dry_run: bool = False,
        now: float | None = None,
    ) -> int:
        """Remove whole sessions, oldest first; how many entries went (or would go).

        As in SQLite: a session's age is that of the last content it dropped, and a
        content belongs to the session that dropped it last, so content a removed
        session shares with a kept one stays, listed under the kept session. The
        sessions are those of :meth:`prune_plan`, chosen and removed in one transaction
        that holds writers back meanwhile (they wait, as for any lock, at most
        ``timeout``), so no compaction is half removed and no content a writer found
        already archived goes while it commits. With no limit nothing goes.
        """
        check_limits(max_bytes, max_age_seconds, max_sessions)
        if max_age_seconds is None and max_sessions is None and max_bytes is None:
            return 0
        limits: dict[str, Any] = {
            "max_bytes": max_bytes,
            "max_age_seconds": max_age_seconds,
            "max_sessions": max_sessions,
            "now": now,
        }
        if dry_run:
            return self.prune_plan(**limits).entries
        with self._wrapped(), self._connect() as conn:
            if not self._ready:
                self._create(conn)
            with conn.transaction():
                self._begin(conn)
                conn.execute(self._q("LOCK TABLE {s}.entries IN SHARE ROW EXCLUSIVE MODE"))
                plan = self._plan(conn, **limits)
                if not plan.sessions:
                    return 0
                doomed = [[s.session_id for s in plan.sessions]]
                gone = conn.execute(
                    self._q(
                        "WITH gone AS (DELETE FROM {s}.entries WHERE seq IN (SELECT seq FROM "
                        "{s}.seen WHERE session_id = ANY(%s)) RETURNING compaction_id) "
                        "SELECT DISTINCT compaction_id FROM gone"
                    ),
                    doomed,
                ).fetchall()
                # (their seen rows went with them) what a removed session archived first
                # and a kept one dropped since stays, under the kept session (its
                # compaction_id still names the removed compaction that archived it first);
                # compactions with nothing left go
                conn.execute(
                    self._q(
                        "UPDATE {s}.entries e SET session_id = s.session_id FROM {s}.seen s "
                        "WHERE s.seq = e.seq AND e.session_id = ANY(%s)"
                    ),
                    doomed,
                )
                conn.execute(
                    self._q(
                        "DELETE FROM {s}.compactions c WHERE c.session_id = ANY(%s) OR "
                        "(c.compaction_id = ANY(%s) AND NOT EXISTS (SELECT 1 FROM "
                        "{s}.entries e WHERE e.compaction_id = c.compaction_id))"
                    ),
                    [doomed[0], [r[0] for r in gone]],
                )
                return plan.entries

    # -- reading ----------------------------------------------------------------------

    def _rows(
        self, query: str | Callable[[int], str], params: Sequence[Any]
    ) -> builtins.list[tuple[Any, ...]]:
        with self._wrapped(), self._connect() as conn:
            version = self._require(conn)
            text = query(version) if callable(query) else query
            return conn.execute(self._q(text), params).fetchall()

    def _select(
        self,
        where: str | Callable[[int], str],
        params: Sequence[Any],
        tail: str,
        source: str = "{s}.entries e",
    ) -> builtins.list[ArchivedEntry]:
        def query(version: int) -> str:
            ids = "NULL" if version == 1 else "e.source_ids"
            return (
                f"SELECT {_COLUMNS}, {ids} FROM {source} "
                "LEFT JOIN {s}.compactions c ON c.compaction_id = e.compaction_id "
                f"WHERE {where(version) if callable(where) else where} {tail}"
            )

        return [
            ArchivedEntry(
                seq=r[0],
                session_id=r[1],
                entry=Entry.model_validate_json(r[2]),
                entry_json=r[2],
                content_hash=r[3],
                compaction_id=r[4],
                archived_at=r[5],
                compactor=r[6],
                strategy=r[7],
                source_ids=tuple(r[8] or ()),
            )
            for r in self._rows(query, params)
        ]

    def versions(
        self, entry_id: str, session_id: str | None = None
    ) -> builtins.list[ArchivedEntry]:
        """Every archived version of ``entry_id``, oldest first."""
        where, params = "e.entry_id = %s", [entry_id]
        if session_id is not None:
            where, params = where + " AND e.session_id = %s", [*params, session_id]
        return self._select(where, params, "ORDER BY e.seq")

    def recall(self, entry_id: str, session_id: str | None = None) -> Entry | None:
        """The entry as it was first dropped (its original content), or ``None``.

        Content is stored once: an entry whose content was archived before under another
        id is found under that first id, by its caller's ids (:meth:`by_source_id`) or
        by :meth:`search`.
        """
        found = self.versions(entry_id, session_id)
        return found[0].entry if found else None

    def by_source_id(
        self, source_id: str, session_id: str | None = None
    ) -> builtins.list[ArchivedEntry]:
        """The archived entries holding the caller's id ``source_id`` (a tool-use id: the
        call and its result), oldest first."""

        def where(version: int) -> str:
            if version == 1:  # no caller ids in a version-1 schema: look in the JSON
                return "strpos(e.entry_json, to_json(%s::text)::text) > 0"
            return "e.source_ids @> ARRAY[%s]::text[]"

        if session_id is not None:
            return self._select(
                lambda v: where(v) + " AND e.session_id = %s",
                [source_id, session_id],
                "ORDER BY e.seq",
            )
        return self._select(where, [source_id], "ORDER BY e.seq")

    def list(
        self, session_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> builtins.list[ArchivedEntry]:
        """Archived versions in archive order (oldest first), a page at a time."""
        where, params = "true", []
        if session_id is not None:
            where, params = "e.session_id = %s", [session_id]
        return self._select(
            where, [*params, *_page(limit, offset)], "ORDER BY e.seq LIMIT %s OFFSET %s"
        )

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
        raw: bool = False,
    ) -> builtins.list[ArchivedEntry]:
        """Full-text search (``tsvector``, ranked by ``ts_rank``), best match first.

        Each whitespace-separated term must occur (its punctuation separates words, as
        the index does); with ``raw`` the query is web-search syntax (``"exact phrase"``,
        ``OR``, ``-word``). No input is an error: ``websearch_to_tsquery`` parses any.
        """
        page = _page(limit, offset)
        text = _websearch(_clean(query), raw)
        if not text.strip():
            return []
        where, params = "e.tsv @@ q.q", [text]
        if session_id is not None:
            where, params = where + " AND e.session_id = %s", [*params, session_id]
        return self._select(
            where,
            [*params, *page],
            "ORDER BY ts_rank(e.tsv, q.q, 1) DESC, e.seq LIMIT %s OFFSET %s",
            source="websearch_to_tsquery('simple', %s) AS q(q) JOIN {s}.entries e ON e.tsv @@ q.q",
        )

    def compactions(
        self, session_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> builtins.list[CompactionRecord]:
        """Archived compactions, oldest first."""
        where, params = "true", []
        if session_id is not None:
            where, params = "session_id = %s", [session_id]
        rows = self._rows(
            lambda version: (
                "SELECT compaction_id, session_id, compactor, strategy, model, mid_round, "
                "created_at, entry_count, tokens_before, tokens_after, "
                f"{'entry_count' if version == 1 else 'dropped_count'} FROM {{s}}.compactions "
                f"WHERE {where} ORDER BY created_at, seq LIMIT %s OFFSET %s"
            ),
            [*params, *_page(limit, offset)],
        )
        return [
            CompactionRecord(
                compaction_id=r[0],
                session_id=r[1],
                compactor=r[2],
                strategy=r[3],
                model=r[4],
                mid_round=r[5],
                created_at=r[6],
                entry_count=r[7],
                tokens_before=r[8],
                tokens_after=r[9],
                dropped_count=r[10],
            )
            for r in rows
        ]

    def count(self, session_id: str | None = None) -> int:
        """How many entries are archived (in ``session_id``, or in all sessions)."""
        if session_id is None:
            rows = self._rows("SELECT count(*) FROM {s}.entries", [])
        else:
            rows = self._rows(
                "SELECT count(*) FROM {s}.entries WHERE session_id = %s", [session_id]
            )
        return int(rows[0][0])

"""The PostgreSQL archive of dropped entries, for fleets of agents sharing one database.

:class:`PostgresArchive` has the public API of the SQLite :class:`~normandy_archive.Archive`
(``record``, ``recall``, ``versions``, ``list``, ``search``, ``compactions``, ``count``,
``close``, and ``prune``) and stores the same records, so the same commands read it.
It needs psycopg 3: ``pip install 'normandy-archive[postgres]'``.

Schema (version 1), in a PostgreSQL schema of its own (``normandy`` by default):

* ``schema_version``: the versions applied (one row, ``1``).
* ``compactions``: one row per archived compaction, as in SQLite, plus ``seq`` (archive
  order among compactions of the same time).
* ``entries``: one row per distinct version of a dropped entry, unique on
  ``(session_id, entry_id, content_hash)``; ``entry_json`` holds the JSON exactly as
  pydantic wrote it, so a recalled entry is equal byte for byte. ``text`` is the
  searchable text with ASCII punctuation made blanks (a separator, as for SQLite's
  ``unicode61`` tokenizer; done here rather than in SQL, where it would double the cost
  of indexing); ``tsv`` is a generated ``tsvector`` column over it (configuration
  ``simple``: no stemming, no stop words, any language), searched through a GIN index.

Writes are safe from many processes on many machines at once: one transaction per
compaction, every insert ``ON CONFLICT DO NOTHING`` (writing the same compaction or the
same entry version again changes nothing, so a write whose commit was not acknowledged
is retried), deadlocks and serialization failures retried. The schema is created by the
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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from normandy_archive.errors import ArchiveError
from normandy_archive.store import ArchivedEntry, CompactionRecord, searchable_text
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

SCHEMA_VERSION = 1

#: How much of an entry's searchable text is indexed: a ``tsvector`` holds at most 1 MiB,
#: and 100,000 characters of words stay far below that in any script.
INDEXED_CHARS = 100_000

_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_PUNCT_TABLE = str.maketrans(_PUNCT, " " * len(_PUNCT))
_RAW_TABLE = str.maketrans({ord(c): " " for c in _PUNCT if c not in '"-'})
_TSV = f"to_tsvector('simple'::regconfig, left(text, {INDEXED_CHARS}))"

# {s} is the schema (an identifier); each statement is idempotent.
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
        meta_json     text NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS compactions_by_session ON {s}.compactions (session_id, created_at)",
    "CREATE INDEX IF NOT EXISTS compactions_by_time ON {s}.compactions (created_at, seq)",
    f"""CREATE TABLE IF NOT EXISTS {{s}}.entries (
        seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id    text NOT NULL,
        entry_id      text NOT NULL,
        content_hash  text NOT NULL,
        turn_id       text,
        role          text NOT NULL,
        entry_json    text NOT NULL,
        text          text NOT NULL,
        compaction_id text NOT NULL REFERENCES {{s}}.compactions (compaction_id),
        archived_at   double precision NOT NULL,
        tsv           tsvector GENERATED ALWAYS AS ({_TSV}) STORED,
        UNIQUE (session_id, entry_id, content_hash)
    )""",
    "CREATE INDEX IF NOT EXISTS entries_by_id ON {s}.entries (entry_id, seq)",
    "CREATE INDEX IF NOT EXISTS entries_by_session ON {s}.entries (session_id, seq)",
    "CREATE INDEX IF NOT EXISTS entries_by_compaction ON {s}.entries (compaction_id)",
    "CREATE INDEX IF NOT EXISTS entries_tsv ON {s}.entries USING gin (tsv)",
)

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


def _page(limit: int, offset: int) -> tuple[int | None, int]:
    """SQLite's paging, in PostgreSQL: a negative limit is no limit, a negative offset 0."""
    lim = None if limit < 0 else min(limit, _MAX_BIGINT)
    return lim, max(0, min(offset, _MAX_BIGINT))


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
                f"reads version {SCHEMA_VERSION}: upgrade normandy-archive"
            )

    def create_schema(self) -> None:
        """Create the schema, tables and indexes if they are missing (idempotent).

        The first write does this by itself; call it once as the database owner when
        the agents' role may not create schemas.
        """
        with self._wrapped(), self._connect() as conn:
            self._create(conn)

    def _create(self, conn: psycopg.Connection[Any]) -> None:
        version = self._version(conn)
        if version is None:
            with conn.transaction():
                self._begin(conn)
                # concurrent CREATE ... IF NOT EXISTS can still collide: one creator at a time
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_key(self.schema)])
                version = self._version(conn)
                if version is None:
                    # a schema made by the database owner for the agents' role is used as
                    # it is: CREATE SCHEMA would need CREATE on the database even then
                    if not conn.execute(
                        "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", [self.schema]
                    ).fetchone():
                        conn.execute(self._q("CREATE SCHEMA IF NOT EXISTS {s}"))
                    for stmt in _DDL:
                        conn.execute(self._q(stmt))
                    conn.execute(
                        self._q(
                            "INSERT INTO {s}.schema_version (version) VALUES (%s) "
                            "ON CONFLICT DO NOTHING"
                        ),
                        [SCHEMA_VERSION],
                    )
                    version = SCHEMA_VERSION
        self._check_version(version)
        self._ready = self._checked = True

    def _require(self, conn: psycopg.Connection[Any]) -> None:
        """Refuse to read a database without the archive schema (never create it)."""
        if self._checked:
            return
        version = self._version(conn)
        if version is None:
            raise self._error(
                f"no Normandy archive here (schema {self.schema!r} has no archive tables); "
                "the first archived compaction creates it"
            )
        self._check_version(version)
        self._checked = True

    @contextlib.contextmanager
    def _wrapped(self) -> Iterator[None]:
        """Database errors as :class:`PostgresArchiveError` naming the archive."""
        try:
            yield
        except pg_errors.UndefinedTable as exc:
            self._checked = self._ready = False
            raise self._error(f"the archive tables are gone ({exc})") from exc
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
    ) -> str:
        """Archive one compaction's dropped entries in one transaction; return its id.

        All or nothing: a crash leaves either every entry of the compaction or none.
        Versions already archived for the session are skipped, and so is a compaction
        id already archived (a retried write changes nothing).
        """
        cid = compaction_id or uuid.uuid4().hex
        now = time.time() if at is None else at
        info = {k: v for k, v in (meta or {}).items() if k != "dropped"}
        meta_json = _clean(json.dumps(info, ensure_ascii=False, default=str))
        seen: set[tuple[str, str]] = set()
        cols: tuple[list[Any], ...] = ([], [], [], [], [], [])
        for e in dropped:
            data = e.model_dump_json()
            digest = hashlib.sha256(data.encode("utf-8")).hexdigest()
            if (e.id, digest) in seen:
                continue
            seen.add((e.id, digest))
            values = (e.id, digest, e.turn_id, e.role, data, _words(_clean(searchable_text(e))))
            for col, value in zip(cols, values, strict=True):
                col.append(value)
        compaction = (
            cid,
            session_id,
            compactor,
            strategy,
            model,
            mid_round,
            now,
            len(dropped),
            _int_or_none(info.get("tokens_before")),
            _int_or_none(info.get("tokens_after")),
            meta_json,
        )
        insert_compaction = self._q(
            "INSERT INTO {s}.compactions (compaction_id, session_id, compactor, strategy, "
            "model, mid_round, created_at, entry_count, tokens_before, tokens_after, "
            "meta_json) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (compaction_id) DO NOTHING"
        )
        insert_entries = self._q(
            "INSERT INTO {s}.entries (session_id, entry_id, content_hash, turn_id, role, "
            "entry_json, text, compaction_id, archived_at) "
            "SELECT %s, t.entry_id, t.content_hash, t.turn_id, t.role, t.entry_json, t.text, "
            "%s, %s FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], "
            "%s::text[]) WITH ORDINALITY "
            "AS t(entry_id, content_hash, turn_id, role, entry_json, text, n) "
            "ORDER BY t.n ON CONFLICT (session_id, entry_id, content_hash) DO NOTHING"
        )
        with self._wrapped():
            for attempt in range(1, _ATTEMPTS + 1):
                conn: psycopg.Connection[Any] | None = None
                try:
                    with self._connect() as conn:
                        if not self._ready:
                            self._create(conn)
                        # two round trips (BEGIN and the statements together, then COMMIT)
                        # where one at a time would take five
                        with _pipeline(conn), conn.transaction():
                            self._begin(conn)
                            conn.execute(insert_compaction, compaction)
                            if cols[0]:
                                conn.execute(insert_entries, [session_id, cid, now, *cols])
                    break
                except psycopg.Error as exc:
                    if attempt == _ATTEMPTS or not _retryable(exc, conn):
                        raise
                    time.sleep(random.uniform(0.01, 0.05) * attempt)
        return cid

    def prune(
        self,
        *,
        max_age_seconds: float | None = None,
        max_sessions: int | None = None,
        max_bytes: int | None = None,
        dry_run: bool = False,
    ) -> int:
        """Remove whole sessions, oldest first; return how many entry versions went.

        A session's age is that of its latest archived compaction. Sessions older than
        ``max_age_seconds`` go, and so do all but the ``max_sessions`` most recent ones,
        and the oldest ones whose entries' JSON takes the total past ``max_bytes`` (the
        newest session always stays); with no limit nothing goes. A compaction archived
        into a chosen session while this runs is kept, with the entry versions it added.
        With ``dry_run`` nothing is removed and the count is what would go. One
        transaction.
        """
        if max_sessions is not None and max_sessions < 0:
            raise ValueError(f"max_sessions must be >= 0, got {max_sessions}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if max_age_seconds is None and max_sessions is None and max_bytes is None:
            return 0
        cutoff = None if max_age_seconds is None else time.time() - max_age_seconds
        with self._wrapped(), self._connect() as conn:
            self._require(conn)
            with conn.transaction():
                self._begin(conn)
                rows = conn.execute(
                    self._q(
                        "SELECT session_id, max(created_at) AS last, max(seq) FROM "
                        "{s}.compactions GROUP BY session_id ORDER BY last DESC, session_id"
                    )
                ).fetchall()
                sizes: dict[str, int] = {}
                if max_bytes is not None:
                    sizes = {
                        str(sid): int(n or 0)
                        for sid, n in conn.execute(
                            self._q(
                                "SELECT c.session_id, sum(octet_length(e.entry_json)) FROM "
                                "{s}.entries e JOIN {s}.compactions c "
                                "ON e.compaction_id = c.compaction_id GROUP BY c.session_id"
                            )
                        ).fetchall()
                    }
                held = 0
                doomed = []
                for rank, (sid, last, top) in enumerate(rows):
                    held += sizes.get(sid, 0)
                    if (
                        (max_sessions is not None and rank >= max_sessions)
                        or (cutoff is not None and last < cutoff)
                        or (max_bytes is not None and rank > 0 and held > max_bytes)
                    ):
                        doomed.append((sid, top))
                if not doomed:
                    return 0
                # what the chosen sessions held when they were chosen (by archive order,
                # not by the writers' clocks): a compaction archived since stays
                chosen = (
                    "WITH s(session_id, top) AS (SELECT * FROM unnest(%s::text[], "
                    "%s::bigint[])), d AS (SELECT c.compaction_id FROM {s}.compactions c "
                    "JOIN s ON c.session_id = s.session_id AND c.seq <= s.top) "
                )
                params = [[d[0] for d in doomed], [d[1] for d in doomed]]
                if dry_run:
                    row = conn.execute(
                        self._q(
                            chosen + "SELECT count(*) FROM {s}.entries e "
                            "JOIN d ON e.compaction_id = d.compaction_id"
                        ),
                        params,
                    ).fetchone()
                    return int(row[0]) if row else 0
                row = conn.execute(
                    self._q(
                        chosen + ", gone AS (DELETE FROM {s}.entries e USING d "
                        "WHERE e.compaction_id = d.compaction_id RETURNING 1) "
                        "SELECT count(*) FROM gone"
                    ),
                    params,
                ).fetchone()
                conn.execute(
                    self._q(
                        "DELETE FROM {s}.compactions c USING unnest(%s::text[], %s::bigint[]) "
                        "AS s(session_id, top) WHERE c.session_id = s.session_id "
                        "AND c.seq <= s.top"
                    ),
                    params,
                )
                return int(row[0]) if row else 0

    # -- reading ----------------------------------------------------------------------

    def _rows(self, query: sql.Composed, params: Sequence[Any]) -> builtins.list[tuple[Any, ...]]:
        with self._wrapped(), self._connect() as conn:
            self._require(conn)
            return conn.execute(query, params).fetchall()

    def _select(
        self, where: str, params: Sequence[Any], tail: str, source: str = "{s}.entries e"
    ) -> builtins.list[ArchivedEntry]:
        query = self._q(
            f"SELECT {_COLUMNS} FROM {source} "
            "JOIN {s}.compactions c ON c.compaction_id = e.compaction_id "
            f"WHERE {where} {tail}"
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
        """The entry as it was first dropped (its original content), or ``None``."""
        found = self.versions(entry_id, session_id)
        return found[0].entry if found else None

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
        text = _websearch(_clean(query), raw)
        if not text.strip():
            return []
        where, params = "e.tsv @@ q.q", [text]
        if session_id is not None:
            where, params = where + " AND e.session_id = %s", [*params, session_id]
        return self._select(
            where,
            [*params, *_page(limit, offset)],
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
            self._q(
                "SELECT compaction_id, session_id, compactor, strategy, model, mid_round, "
                "created_at, entry_count, tokens_before, tokens_after FROM {s}.compactions "
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
            )
            for r in rows
        ]

    def count(self, session_id: str | None = None) -> int:
        """How many entry versions are archived (in ``session_id``, or in all sessions)."""
        if session_id is None:
            rows = self._rows(self._q("SELECT count(*) FROM {s}.entries"), [])
        else:
            rows = self._rows(
                self._q("SELECT count(*) FROM {s}.entries WHERE session_id = %s"), [session_id]
            )
        return int(rows[0][0])

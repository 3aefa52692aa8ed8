"""The PostgreSQL archive of dropped entries, for fleets of agents sharing one database.

:class:`PostgresArchive` has the public API of the SQLite :class:`~normandy_archive.Archive`
(``record``, ``recall``, ``versions``, ``list``, ``search``, ``compactions``, ``count``,
``close``, and ``prune``) and stores the same records, so the same commands read it.
It comes with the ``normandy-archive-postgres`` distribution (psycopg 3 included), which
registers it under the archive's backends (entry point ``postgresql`` in the group
``normandy_archive.backends``), so ``NORMANDY_ARCHIVE_URL`` chooses it.

Schema (version 3), in a PostgreSQL schema of its own (``normandy`` by default), with the
records and semantics of the SQLite archive's (``normandy_archive.schema``):

* ``schema_version``: the versions applied.
* ``compactions``: one row per compaction that stored something, as in SQLite, plus
  ``seq`` (archive order among compactions of the same time).
* ``entries``: one row per distinct *content*, unique on ``content_hash`` (SHA-256 of the
  entry's role and content, :func:`~normandy_archive.schema.content_hash`) across
  sessions, so content dropped again (a re-compaction of the same history, another
  session, another agent of the fleet) is stored once. ``entry_json`` holds the entry
  exactly as first dropped, so a recalled entry is equal byte for byte; ``source_ids``
  the caller's ids found in it (a GIN index); ``text`` is the word stems of the
  searchable text (:func:`normandy_core.conversation.stems.stem_text`, the stems SQLite's
  index holds; made here rather than in SQL); ``tsv`` is a generated ``tsvector`` column
  over it (configuration ``simple``: the stems as they are, no stop words), searched
  through a GIN index and ranked by ``ts_rank``.
* ``seen``: for each content, the session that dropped it last and when; retention goes
  by it, as in SQLite.
* ``vectors``: recall by meaning's vectors, one row per part of an entry's searchable
  text (:func:`~normandy_core.contract.recall_parts.parts`): ``embedder`` (the key of the
  model and how texts are cut), ``seq`` (the entry; removed with it), ``part`` and
  ``vec`` (pgvector's ``vector``), primary key ``(embedder, seq, part)``. It needs the
  server's ``vector`` extension (pgvector), created with the schema where the role may,
  else by the first vector written; without it the archive and keyword recall work, and
  recall by meaning is a :class:`PostgresArchiveError` saying what to install. It is
  optional, so it leaves the schema's version as it is.

A version-1 schema (one row per version of an entry in a session) is read as it is and
moved to version 3 by the first write; so is a version-2 one (``text`` the words as
written, punctuation made blanks), whose readers search the words as written until then.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from normandy_archive import base
from normandy_archive.errors import ArchiveError
from normandy_archive.schema import SEEN_REFRESH, content_hash, source_ids
from normandy_core import Entry
from normandy_core.conversation.stems import WORD, stem_text

try:
    import psycopg
    from psycopg import errors as pg_errors, sql
    from psycopg.conninfo import conninfo_to_dict
except ImportError as exc:  # pragma: no cover - psycopg is a dependency of this one
    raise ImportError(
        "the PostgreSQL archive needs psycopg 3: pip install normandy-archive-postgres"
    ) from exc

__all__ = ["SCHEMA_VERSION", "PostgresArchive", "PostgresArchiveError", "is_postgres_url"]

#: The version of the schema this code writes (it reads versions 1 and 2 too, and moves
#: them): version 3 indexes word stems.
SCHEMA_VERSION = 3
#: The schema versions this code reads (a writer moves versions 1 and 2 to version 3).
READABLE_VERSIONS = (1, 2, SCHEMA_VERSION)
#: Rows whose text is made again per statement when a version-2 schema moves to 3.
_RESTEM_BATCH = 1000

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

#: Recall by meaning's vectors (pgvector). No approximate (HNSW or IVFFlat) index: one
#: table holds the vectors of every embedder, of any width, and such an index needs one
#: width; and a recall ranks one session's parts, which an index over every session's
#: would filter after its search, returning fewer than asked. A session's parts are
#: compared exactly, as SQLite does.
_VECTOR_DDL = (
    """CREATE TABLE IF NOT EXISTS {s}.vectors (
        embedder text NOT NULL,
        seq      bigint NOT NULL REFERENCES {s}.entries (seq) ON DELETE CASCADE,
        part     integer NOT NULL,
        vec      vector NOT NULL,
        PRIMARY KEY (embedder, seq, part)
    )""",
    # pruning deletes entries by seq: the cascade finds their vectors by it
    "CREATE INDEX IF NOT EXISTS vectors_by_seq ON {s}.vectors (seq)",
)

#: Keeps the vectors of some entries' parts, replacing those they had (one statement):
#: the parts given, then those past them left from before go; an entry removed
#: meanwhile is skipped. How many entries it kept.
_STORE_VECTORS = """WITH t AS (
    SELECT * FROM unnest(%(seqs)s::bigint[], %(parts)s::integer[], %(vecs)s::text[])
        AS t(seq, part, vec)
), ins AS (
    INSERT INTO {s}.vectors (embedder, seq, part, vec)
    SELECT %(embedder)s, t.seq, t.part, t.vec::vector FROM t JOIN {s}.entries e ON e.seq = t.seq
    ON CONFLICT (embedder, seq, part) DO UPDATE SET vec = excluded.vec
    RETURNING seq
), stale AS (
    DELETE FROM {s}.vectors v USING (SELECT seq, max(part) AS top FROM t GROUP BY seq) AS k
    WHERE v.embedder = %(embedder)s AND v.seq = k.seq AND v.part > k.top
)
SELECT count(DISTINCT seq) FROM ins"""

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

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_MAX_BIGINT = 2**63 - 1
#: Attempts at a write that meets a deadlock or serialization failure (writers of the same
#: content in crossing orders wait on each other's unique keys; PostgreSQL aborts one),
#: with jittered exponential backoff between them (50 ms doubling, at most 1 s).
_ATTEMPTS = 10


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


def _indexed(text: str) -> str:
    """What a version-3 row's ``text`` holds of searchable ``text``: its word stems."""
    return stem_text(_clean(text))


def _stem_raw_word(m: re.Match[str]) -> str:
    word = m.group(0)
    return word if word.lower() == "or" else stem_text(word)


def _websearch(query: str, raw: bool, any_term: bool = False, stemmed: bool = True) -> str:
    """The ``websearch_to_tsquery`` input for ``query``.

    By default each whitespace-separated term must occur, its punctuation taken as a
    separator (``src/utils.py`` is the phrase ``src utils py``): every term is quoted, so
    nothing in it is syntax. With ``raw``, the web-search syntax stays: ``"exact
    phrase"``, ``OR``, ``-excluded``. With ``any_term`` the quoted terms are ORed. With
    ``stemmed`` (a version-3 schema) the words are their stems, as the index holds them.
    """
    if not raw:
        words = stem_text if stemmed else _words
        terms = (" ".join(words(t).split()) for t in query.split())
        return (" or " if any_term else " ").join(f'"{t}"' for t in terms if t)
    # keep the syntax's quotes and a leading minus; other punctuation separates words
    kept = re.sub(r"(?<=\w)-", " ", query).translate(_RAW_TABLE)
    return WORD.sub(_stem_raw_word, kept) if stemmed else kept


def _vector_text(vector: Sequence[float]) -> str:
    """``vector`` as pgvector's text form (``[1.0,2.5]``)."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


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


class _Postgres(base.Dialect):
    """The SQL of the queries both backends share, as PostgreSQL writes it."""

    param = "%s"
    json_size = "octet_length"
    source_ids = "array_to_json(e.source_ids)::text"
    compaction_order = "seq"

    def __init__(self, schema: str) -> None:
        self.schema = schema  # a plain identifier (checked), quoted as one

    def table(self, name: str) -> str:
        return f'"{self.schema}".{name}'

    def by_source_id(self, source_id: str, version: int) -> tuple[str, builtins.list[Any]]:
        if version == 1:  # no caller ids in a version-1 schema: look in the JSON
            return "strpos(e.entry_json, to_json(%s::text)::text) > 0", [source_id]
        return "e.source_ids @> ARRAY[%s]::text[]", [source_id]

    def seq_in(self, seqs: Sequence[int]) -> tuple[str, builtins.list[Any]]:
        return "e.seq = ANY(%s::bigint[])", [builtins.list(seqs)]

    def has_vectors(self) -> tuple[str, builtins.list[Any]]:
        return "SELECT 1 WHERE to_regclass(%s) IS NOT NULL", [self.table("vectors")]


T = TypeVar("T")


class _V1Contents(NamedTuple):
    """What the entries of a version-1 schema become in version 2."""

    #: Per row kept (the first of its content, in archive order): the content's hash.
    keep: dict[int, str]
    #: Per row kept: the caller's ids found in its entry, when it holds any.
    ids: dict[int, builtins.list[str]]
    #: Per content: the session that dropped it last, and when.
    owner: dict[str, tuple[str, float]]


def _v1_contents(rows: Iterable[tuple[int, str, str, float]]) -> _V1Contents:
    """The version-2 contents of version 1's rows ``(seq, session, entry JSON, archived
    at)``, read in archive order; a content's owner moves to a later session that drops
    it, or to the same session after :data:`SEEN_REFRESH` seconds."""
    first: dict[str, int] = {}
    owner: dict[str, tuple[str, float]] = {}
    ids: dict[int, builtins.list[str]] = {}
    for seq, session, data, at in rows:
        entry = Entry.model_validate_json(data)
        digest = content_hash(entry, data)
        first.setdefault(digest, seq)
        if first[digest] == seq and (found := source_ids(entry)):
            ids[seq] = found
        last = owner.get(digest)
        if last is None or (last[1] <= at and (last[0] != session or last[1] < at - SEEN_REFRESH)):
            owner[digest] = (session, at)
    return _V1Contents({seq: digest for digest, seq in first.items()}, ids, owner)


class PostgresArchive(base.ArchiveBackend):
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
        self._location = _display(url)
        self.dialect = _Postgres(schema)
        self._ready = False  # the schema is known to exist at our version (writes)
        self._checked = False  # the schema is known to exist (reads)
        self._read_version = SCHEMA_VERSION  # its version, once checked
        self._local = threading.local()
        self._sql: dict[str, sql.Composed] = {}
        self._vectors_ready = False  # the vectors table is known to exist

    def __repr__(self) -> str:
        return f"<PostgresArchive {self.location!r} schema={self.schema!r}>"

    def _q(self, text: str) -> sql.Composed:
        """``text`` with ``{s}`` bound to the schema identifier (cached)."""
        hit = self._sql.get(text)
        if hit is None:
            hit = self._sql[text] = sql.SQL(text).format(s=sql.Identifier(self.schema))
        return hit

    @property
    def location(self) -> str:
        """The URL without its password, for messages."""
        return self._location

    def _failure(self, message: str) -> PostgresArchiveError:
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
            raise self._failure(
                f"schema {self.schema!r} is at version {version}; this normandy-archive "
                f"reads versions up to {SCHEMA_VERSION}: upgrade normandy-archive"
            )

    def create_schema(self) -> None:
        """Create the schema, tables and indexes if they are missing, or move a version-1
        or version-2 schema to version 3 (idempotent).

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
                    # where the server has pgvector and the role may create it; else the
                    # first vector written says what is missing (keywords need none)
                    with contextlib.suppress(psycopg.Error), conn.transaction():
                        self._create_vectors(conn)
                elif version == 1:
                    self._migrate(conn)
                if version in (1, 2):
                    self._restem(conn)
                conn.execute(
                    self._q(
                        "INSERT INTO {s}.schema_version (version) VALUES (%s) "
                        "ON CONFLICT DO NOTHING"
                    ),
                    [SCHEMA_VERSION],
                )
        self._ready = self._checked = True
        self._read_version = SCHEMA_VERSION

    def _create_vectors(self, conn: psycopg.Connection[Any]) -> None:
        """The ``vector`` extension (unless the database has it) and the vectors table."""
        if not conn.execute(
            "SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'vector'"
        ).fetchone():
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for stmt in _VECTOR_DDL:
            conn.execute(self._q(stmt))

    def _vectors(self, conn: psycopg.Connection[Any]) -> None:
        """Make sure the vectors table exists, creating it (and the extension) if not.

        :raises PostgresArchiveError: the server has no pgvector, or the role may not
            create its extension: the message says what to install.
        """
        if self._vectors_ready:
            return
        self._require(conn)
        try:
            with conn.transaction():
                self._begin(conn)
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_key(self.schema)])
                self._create_vectors(conn)
        except psycopg.Error as exc:
            if isinstance(exc, pg_errors.UndefinedFile):
                why = "the server has no pgvector (its extension 'vector' is not installed)"
            elif isinstance(exc, pg_errors.InsufficientPrivilege):
                why = "this role may not create the extension 'vector'"
            else:
                why = "its vectors table could not be created"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise self._failure(
                f"recall by meaning keeps its vectors with pgvector, and {why} ({first}): "
                "install pgvector on the server (https://github.com/pgvector/pgvector) and "
                "run CREATE EXTENSION vector in this database as a role allowed to (a "
                "superuser); recall by keywords works without it"
            ) from exc
        self._vectors_ready = True

    def _restem(self, conn: psycopg.Connection[Any]) -> None:
        """Make every row's ``text`` its word stems (in the caller's transaction): the
        move to version 3. Rows are only updated, a batch a statement (``tsv`` follows)."""
        after = 0
        while True:
            rows = conn.execute(
                self._q(
                    "SELECT seq, entry_json FROM {s}.entries WHERE seq > %s ORDER BY seq LIMIT %s"
                ),
                [after, _RESTEM_BATCH],
            ).fetchall()
            if not rows:
                return
            seqs = [seq for seq, _ in rows]
            texts = [_indexed(base.searchable_text(Entry.model_validate_json(d))) for _, d in rows]
            conn.execute(
                self._q(
                    "UPDATE {s}.entries e SET text = t.text FROM unnest(%s::bigint[], "
                    "%s::text[]) AS t(seq, text) WHERE e.seq = t.seq"
                ),
                [seqs, texts],
            )
            after = seqs[-1]

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Move a version-1 schema to version 2 (in the caller's transaction).

        Version 1 stored one row per ``(session, entry id, hash of the whole entry)``: the
        rows are kept in archive order, the first of each content (what later readers
        recall), with the caller's ids found in it; its ``seen`` is the session that
        dropped that content last, as SQLite's move to version 2 does.
        """
        self._migrate_columns(conn)
        rows = conn.execute(
            self._q("SELECT seq, session_id, entry_json, archived_at FROM {s}.entries ORDER BY seq")
        )
        self._migrate_rows(conn, _v1_contents(rows))

    def _migrate_columns(self, conn: psycopg.Connection[Any]) -> None:
        """Version 2's columns, and version 1's constraints on entries dropped (unique per
        session and id; the reference to compactions)."""
        conn.execute(
            self._q("ALTER TABLE {s}.compactions ADD COLUMN IF NOT EXISTS dropped_count integer")
        )
        conn.execute(self._q("UPDATE {s}.compactions SET dropped_count = entry_count"))
        names = conn.execute(
            "SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid = %s::regclass "
            "AND contype IN ('u', 'f')",
            [f'"{self.schema}".entries'],
        ).fetchall()
        for (name,) in names:
            conn.execute(
                sql.SQL("ALTER TABLE {s}.entries DROP CONSTRAINT {c}").format(
                    s=sql.Identifier(self.schema), c=sql.Identifier(name)
                )
            )
        conn.execute(self._q("ALTER TABLE {s}.entries ADD COLUMN source_ids text[]"))

    def _migrate_rows(self, conn: psycopg.Connection[Any], contents: _V1Contents) -> None:
        """Keep the rows of ``contents`` with their hashes and caller ids, one per content
        from now on, each seen by the session that dropped it last; recount compactions."""
        keep, ids, owner = contents
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
            raise self._failure(
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
            raise self._failure(f"the archive tables are gone or changed ({exc})") from exc
        except psycopg.Error as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            raise self._failure("; ".join(lines) or type(exc).__name__) from exc

    # -- writing ----------------------------------------------------------------------

    def _write(
        self,
        rows: Sequence[base.Prepared],
        compaction: base.CompactionRecord,
        meta_json: str,
        *,
        index: bool,
    ) -> int:
        """One statement stores the new contents with their first ``seen`` and the
        compaction row; a second moves ``seen`` for the content that was there before.
        Writers of the same content at the same moment wait for each other's commit, and
        the one that commits first stores it."""
        c = compaction
        params = {
            "ids": [r.entry.id for r in rows],
            "hashes": [r.content_hash for r in rows],
            "turns": [r.entry.turn_id for r in rows],
            "roles": [r.entry.role for r in rows],
            "jsons": [r.entry_json for r in rows],
            "sources": [json.dumps(r.source_ids) if r.source_ids else None for r in rows],
            "texts": [_indexed(base.searchable_text(r.entry)) for r in rows],
            "session": c.session_id,
            "cid": c.compaction_id,
            "at": c.created_at,
            "compactor": c.compactor,
            "strategy": c.strategy,
            "model": c.model,
            "mid_round": c.mid_round,
            "tokens_before": c.tokens_before,
            "tokens_after": c.tokens_after,
            "meta": _clean(meta_json),
            "dropped": c.dropped_count,
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
                    time.sleep(min(1.0, 0.05 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5))
        return stored

    # -- vectors (recall by meaning) --------------------------------------------------

    def unembedded(
        self, embedder: str, session_id: str | None = None, *, after: int = 0
    ) -> builtins.list[base.ArchivedEntry]:
        """The vectors table is created first (with the extension): they are asked for to
        be embedded and kept, and a server without pgvector is named before any is made."""
        with self._wrapped(), self._connect() as conn:
            self._vectors(conn)
        return super().unembedded(embedder, session_id, after=after)

    def store_vectors(self, embedder: str, vectors: Mapping[int, Sequence[Sequence[float]]]) -> int:
        """One row per part (:data:`_STORE_VECTORS`); the table is created first if need be."""
        if not vectors:
            return 0
        rows = [
            (int(seq), n, _vector_text(v)) for seq, vs in vectors.items() for n, v in enumerate(vs)
        ]
        params = {
            "seqs": [r[0] for r in rows],
            "parts": [r[1] for r in rows],
            "vecs": [r[2] for r in rows],
            "embedder": embedder,
        }
        with self._wrapped(), self._connect() as conn:
            self._vectors(conn)
            with conn.transaction():
                self._begin(conn)
                row = conn.execute(self._q(_STORE_VECTORS), params).fetchone()
        return int(row[0]) if row else 0

    def nearest(
        self, embedder: str, session_id: str | None, query: Sequence[float], limit: int
    ) -> builtins.list[tuple[int, int, float]]:
        """In SQL: pgvector's cosine distance (``<=>``) of each part, the closest part of
        each entry (``DISTINCT ON``), the closest entries first; the cosine is one less
        the distance."""
        if limit <= 0:
            return []
        d = self.dialect
        where, params = self._in_session(
            "v.embedder = %s AND vector_dims(v.vec) = %s",
            [embedder, len(query)],
            session_id,
            seen=True,
        )
        statement = (
            "SELECT seq, part, d FROM (SELECT DISTINCT ON (v.seq) v.seq, v.part, "
            f"v.vec <=> %s::vector AS d FROM {d.table('vectors')} v "
            f"JOIN {d.table('entries')} e ON e.seq = v.seq WHERE {where} "
            "ORDER BY v.seq, d, v.part) AS best ORDER BY d, seq LIMIT %s"
        )
        values = [_vector_text(query), *params, limit]

        def select(version: int, run: base.Run) -> builtins.list[tuple[Any, ...]]:
            return run(statement, values) if run(*d.has_vectors()) else []

        return [(int(r[0]), int(r[1]), 1.0 - float(r[2])) for r in self._read(select) or ()]

    # -- retention --------------------------------------------------------------------

    def _remove(self, limits: base.Limits, *, vacuum: bool) -> int:
        """Chosen and removed in one transaction that holds the writers back meanwhile
        (they wait, as for any lock, at most ``timeout``), so no content a writer just
        found already archived goes while it commits. ``vacuum`` is left to PostgreSQL's
        autovacuum."""
        with self._wrapped(), self._connect() as conn:
            if self._require(conn) != SCHEMA_VERSION:
                self._create(conn)  # a version-1 schema is moved first
            with conn.transaction():
                self._begin(conn)
                conn.execute(self._q("LOCK TABLE {s}.entries IN SHARE ROW EXCLUSIVE MODE"))
                plan = self._plan(lambda q, p: conn.execute(q, p).fetchall(), limits)
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

    def _read(self, work: Callable[[int, base.Run], T]) -> T | None:
        with self._wrapped(), self._connect() as conn:
            version = self._require(conn)
            return work(version, lambda q, p: conn.execute(q, p).fetchall())

    def _search(self, search: base.Search) -> builtins.list[base.ArchivedEntry]:
        """``tsvector``, ranked by ``ts_rank``: each term's punctuation separates words,
        as the index does. No input is an error: ``websearch_to_tsquery`` parses any."""
        query, session_id, limit, offset, raw, any_term, seen = search
        version = self._read(lambda v, run: v)  # a version-2 schema indexed the words
        text = _websearch(_clean(query), raw, any_term, stemmed=version == SCHEMA_VERSION)
        if not text.strip():
            return []
        where, params = self._in_session("e.tsv @@ q.q", [text], session_id, seen=seen)
        plain, plain_params = self._in_session("e.tsv @@ q.q", [text], session_id)
        return self._select(  # a version-1 schema has no seen table
            where,
            [*params, limit, offset],
            "ORDER BY ts_rank(e.tsv, q.q, 1) DESC, e.seq LIMIT %s OFFSET %s",
            source="websearch_to_tsquery('simple', %s) AS q(q) "
            f"JOIN {self.dialect.table('entries')} e ON e.tsv @@ q.q",
            v1=(plain, [*plain_params, limit, offset]),
        )

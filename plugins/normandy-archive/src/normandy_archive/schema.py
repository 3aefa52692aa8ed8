"""The SQLite archive's schema (version 3), its full-text index, the moves from 1 and 2.

* ``compactions``: one row per compaction that stored something.
* ``entries``: one row per distinct *content* (``content_hash``, :func:`content_hash`,
  unique across sessions), keeping the entry exactly as first dropped (``entry_json``),
  its session and compaction, and the caller's ids found in it (``source_ids``).
* ``entry_sources``: ``source_id -> content_hash``, to find an entry by a caller's id.
* ``seen``: for each row, the session that last dropped its content and when; retention
  goes by it.
* ``vectors``: an embedder's vector of a row (``seq``), for recall by meaning: keyed by
  the embedder's ``key`` (its model and the settings that change its vectors) and the
  row, a little-endian float32 BLOB; written at recall time for the rows that lack one
  (version 3; an archive of version 2 gains the table when a writer opens it).
* ``entries_fts``: a contentless FTS5 index of the word stems of each row's text
  (:data:`INDEXED_SQL`: :data:`TEXT_SQL` through
  :func:`normandy_core.conversation.stems.stem_text`), ranked by ``bm25()``.

``archive_state.indexed_seq`` is the last row whose full text, caller ids and first
``seen`` are written (:func:`index_pending`, after the compaction's own transaction);
readers scan the rows past it directly. ``archive_state.stemmed`` marks an index of
stems: an archive written before stemming has none, and its first writer indexes it
again (:func:`stem_index`); until then readers search it with the words as written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from normandy_core import Entry, ToolResultBlock, ToolUseBlock
from normandy_core.conversation.stems import stem_text

__all__ = [
    "INDEXED_SQL",
    "SCHEMA_VERSION",
    "SEEN_REFRESH",
    "SEEN_SQL",
    "TEXT_SQL",
    "content_hash",
    "create",
    "index_pending",
    "is_stemmed",
    "migrate",
    "register_functions",
    "remove_sessions",
    "rollback",
    "source_ids",
    "stem_index",
    "store",
]

SCHEMA_VERSION = 3
#: Seconds after which the same session dropping a content again refreshes its ``seen``.
SEEN_REFRESH = 3600.0

#: Version 3: one vector per row and embedder key (a float32 BLOB).
_VECTORS = (
    "CREATE TABLE IF NOT EXISTS vectors (embedder TEXT NOT NULL, seq INTEGER NOT NULL, "
    "vector BLOB NOT NULL, PRIMARY KEY (embedder, seq)) WITHOUT ROWID"
)

_TABLES = (
    """CREATE TABLE IF NOT EXISTS compactions (
        compaction_id TEXT PRIMARY KEY,
        session_id    TEXT NOT NULL,
        compactor     TEXT,
        strategy      TEXT,
        model         TEXT,
        mid_round     INTEGER,
        created_at    REAL NOT NULL,
        entry_count   INTEGER NOT NULL,
        tokens_before INTEGER,
        tokens_after  INTEGER,
        meta_json     TEXT NOT NULL,
        dropped_count INTEGER
    )""",
    """CREATE TABLE IF NOT EXISTS entries (
        seq           INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id    TEXT NOT NULL,
        entry_id      TEXT NOT NULL,
        content_hash  TEXT NOT NULL UNIQUE,
        turn_id       TEXT,
        role          TEXT NOT NULL,
        entry_json    TEXT NOT NULL,
        source_ids    TEXT,
        compaction_id TEXT NOT NULL REFERENCES compactions (compaction_id),
        archived_at   REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS entry_sources (
        source_id    TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        PRIMARY KEY (source_id, content_hash)
    ) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS archive_state (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS seen (seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL, "
    "at REAL NOT NULL)",
    _VECTORS,
    "CREATE INDEX IF NOT EXISTS entries_by_id ON entries (entry_id, seq)",
    "CREATE INDEX IF NOT EXISTS entries_by_session ON entries (session_id, seq)",
    "CREATE INDEX IF NOT EXISTS compactions_by_session ON compactions (session_id, created_at)",
    "CREATE INDEX IF NOT EXISTS compactions_by_time ON compactions (created_at)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS entries_fts USING fts5(text, content='')",
    "INSERT OR IGNORE INTO archive_state VALUES ('indexed_seq', 0)",
    "INSERT OR IGNORE INTO archive_state VALUES ('stemmed', 1)",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)

#: Records that session ``?1`` dropped the content of hash ``?3`` at time ``?2``: the row's
#: ``seen`` moves to it unless the same session saw it recently.
SEEN_SQL = (
    "INSERT INTO seen (seq, session_id, at) SELECT seq, ?1, ?2 FROM entries "
    "WHERE content_hash = ?3 ON CONFLICT (seq) DO UPDATE SET session_id = excluded.session_id, "
    f"at = excluded.at WHERE seen.at <= excluded.at AND (seen.session_id != excluded.session_id "
    f"OR seen.at < excluded.at - {SEEN_REFRESH})"
)

#: The searchable text of the row ``e``, from its JSON (as
#: :func:`~normandy_archive.searchable_text`); the same expression indexes a row and
#: takes it out of the contentless index again, so the two always agree.
TEXT_SQL = """CASE json_type(e.entry_json, '$.content')
    WHEN 'text' THEN json_extract(e.entry_json, '$.content')
    ELSE (SELECT group_concat(CASE json_extract(b.value, '$.type')
        WHEN 'text' THEN json_extract(b.value, '$.text')
        WHEN 'thinking' THEN json_extract(b.value, '$.thinking')
        WHEN 'tool_use' THEN
            json_extract(b.value, '$.name') || ' ' || json_extract(b.value, '$.input')
        WHEN 'tool_result' THEN CASE json_type(b.value, '$.content')
            WHEN 'text' THEN json_extract(b.value, '$.content')
            ELSE (SELECT group_concat(json_extract(p.value, '$.text'), char(10))
                  FROM json_each(b.value, '$.content') AS p
                  WHERE json_extract(p.value, '$.type') = 'text') END
        END, char(10)) FROM json_each(e.entry_json, '$.content') AS b)
END"""
#: The SQL function that turns a row's text into its stems (:func:`register_functions`).
_STEM_FUNCTION = "normandy_stem"
#: What the full-text index holds of the row ``e``: the stems of its text. The same
#: expression indexes a row and takes it out again (a contentless index needs the text
#: it was given), and stemming is deterministic, so the two always agree.
INDEXED_SQL = f"{_STEM_FUNCTION}({TEXT_SQL})"

#: Which content hashes of a JSON array the archive holds.
_HAVE = "SELECT content_hash FROM entries WHERE content_hash IN (SELECT value FROM json_each(?))"
#: A compaction's row: its record's fields, in their order, then its meta.
_COMPACTION_INSERT = (
    "INSERT OR IGNORE INTO compactions (compaction_id, session_id, compactor, strategy, model, "
    "mid_round, created_at, entry_count, tokens_before, tokens_after, dropped_count, meta_json) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_ENTRY_INSERT = (
    "INSERT OR IGNORE INTO entries (entry_id, content_hash, turn_id, role, entry_json, "
    "source_ids, session_id, compaction_id, archived_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_TAILS = {False: ',"pinned":false,"metadata":{}}', True: ',"pinned":true,"metadata":{}}'}


def content_hash(entry: Entry, data: str | None = None) -> str:
    """SHA-256 of the entry's role and content (not its id, parent, turn or metadata).

    ``data``, ``entry.model_dump_json()`` when the caller has it, spares serializing the
    content again (it is most of the cost): it is cut out of it (pydantic writes the
    fields in declared order).
    """
    tail = _TAILS[entry.pinned]
    if data is not None and not entry.metadata and data.endswith(tail):
        content = data[data.index(',"content":') + 11 : -len(tail)]
    else:
        content = entry.model_dump_json(include={"content"})[11:-1]
    return hashlib.sha256(f"{entry.role}\n{content}".encode()).hexdigest()


def source_ids(entry: Entry) -> list[str]:
    """The caller's ids in ``entry``: its tool-use ids and those its tool results answer
    (OpenAI tool-call ids, Anthropic tool-use ids), in order, once each."""
    if isinstance(entry.content, str):
        return []
    found: dict[str, None] = {}
    for b in entry.content:
        if isinstance(b, ToolUseBlock):
            found[b.id] = None
        elif isinstance(b, ToolResultBlock):
            found[b.tool_use_id] = None
    return list(found)


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is open; an error here would only hide the one that caused it."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def register_functions(conn: sqlite3.Connection) -> None:
    """Give the write connection ``conn`` the function :data:`INDEXED_SQL` calls."""
    stem = lambda text: None if text is None else stem_text(text)  # noqa: E731
    conn.create_function(_STEM_FUNCTION, 1, stem, deterministic=True)


def is_stemmed(run: Any) -> bool:
    """Whether the archive's index holds stems (``run(sql, params)`` returns rows)."""
    return bool(run("SELECT 1 FROM archive_state WHERE key = 'stemmed'", ()))


def stem_index(conn: sqlite3.Connection) -> bool:
    """Index the stems of every indexed row again, in an archive indexed before stemming
    (in the caller's transaction, on a connection with :func:`register_functions`);
    whether it had to. Rows are only read: none is lost, and the rows past the indexed
    mark are indexed later as usual."""
    if is_stemmed(lambda q, p: conn.execute(q, p).fetchall()):
        return False
    conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('delete-all')")
    conn.execute(
        f"INSERT INTO entries_fts (rowid, text) SELECT e.seq, {INDEXED_SQL} FROM entries e "
        "WHERE e.seq <= (SELECT value FROM archive_state WHERE key = 'indexed_seq')"
    )
    conn.execute("INSERT INTO archive_state VALUES ('stemmed', 1)")
    return True


def create(conn: sqlite3.Connection) -> None:
    """Create the version-2 schema in an empty database (in the caller's transaction)."""
    for stmt in _TABLES:
        conn.execute(stmt)


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Move a version-1 or version-2 archive to version 3 (in the caller's transaction).

    Version 2 lacks only the ``vectors`` table: it is created. Version 1 kept a row per
    ``(session, entry id, hash of the whole entry)`` with an FTS index kept by a trigger:
    its rows move in archive order, the first of each content kept (it is what later
    readers recall), and are indexed again from scratch.
    """
    if version == 2:
        conn.execute(_VECTORS)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    _migrate_v1(conn)


def _migrate_v1(conn: sqlite3.Connection) -> None:
    conn.execute("DROP TRIGGER IF EXISTS entries_fts_insert")
    conn.execute("DROP TABLE IF EXISTS entries_fts")
    conn.execute("ALTER TABLE entries RENAME TO entries_v1")
    for index in ("entries_by_id", "entries_by_session"):
        conn.execute(f"DROP INDEX IF EXISTS {index}")
    conn.execute("ALTER TABLE compactions ADD COLUMN dropped_count INTEGER")
    conn.execute("UPDATE compactions SET dropped_count = entry_count")
    create(conn)
    rows = conn.execute(
        "SELECT seq, session_id, entry_id, turn_id, role, entry_json, compaction_id, "
        "archived_at FROM entries_v1 ORDER BY seq"
    )
    for seq, session, entry_id, turn_id, role, data, cid, at in rows:
        entry = Entry.model_validate_json(data)
        ids = source_ids(entry)
        digest = content_hash(entry, data)
        values = (seq, session, entry_id, digest, turn_id, role, data)
        conn.execute(
            f"INSERT OR IGNORE INTO entries VALUES ({', '.join('?' * 10)})",
            (*values, json.dumps(ids) if ids else None, cid, at),
        )
        conn.executemany(
            "INSERT OR IGNORE INTO entry_sources VALUES (?, ?)", [(i, digest) for i in ids]
        )
        conn.execute(SEEN_SQL, (session, at, digest))
    conn.execute("DROP TABLE entries_v1")
    conn.execute("CREATE TEMP TABLE moved (compaction_id TEXT PRIMARY KEY, n INTEGER)")
    conn.execute("INSERT INTO moved SELECT compaction_id, count(*) FROM entries GROUP BY 1")
    conn.execute(
        "UPDATE compactions SET entry_count = coalesce((SELECT n FROM moved m "
        "WHERE m.compaction_id = compactions.compaction_id), 0)"
    )
    conn.execute("DROP TABLE moved")


def store(
    conn: sqlite3.Connection,
    rows: Sequence[Sequence[Any]],
    compaction: Any,
    meta_json: str,
    seen: Iterable[str] = (),
) -> int:
    """Write one compaction (in the caller's transaction): of ``rows`` (entry id, content
    hash, turn id, role, JSON, caller ids) the content the archive lacks, with the
    ``compaction`` (a :class:`~normandy_archive.CompactionRecord`) when it stored some;
    the ``seen`` of content held already (and of the hashes ``seen``); how many it stored."""
    c = compaction
    hashes = '["' + '","'.join([r[1] for r in rows]) + '"]'  # hex: no escapes
    have = {h for (h,) in conn.execute(_HAVE, (hashes,))} if rows else set()
    again = [*seen, *have]
    if again:  # content dropped before: this session saw it last
        conn.executemany(SEEN_SQL, [(c.session_id, c.created_at, h) for h in again])
    new = [r for r in rows if r[1] not in have]
    if new:
        record = dataclasses.replace(c, entry_count=len(new))
        conn.execute(_COMPACTION_INSERT, (*vars(record).values(), meta_json))
        tail = (c.session_id, c.compaction_id, c.created_at)
        conn.executemany(_ENTRY_INSERT, [(*r, *tail) for r in new])
    return len(new)


#: What :func:`remove_sessions` runs, for the sessions of the JSON array ``?1``.
_IN = "IN (SELECT value FROM json_each(?1))"
_MINE = f"SELECT seq FROM seen WHERE session_id {_IN}"
_REMOVE = (
    "INSERT INTO entries_fts (entries_fts, rowid, text) SELECT 'delete', e.seq, "
    f"{INDEXED_SQL} FROM entries e WHERE e.seq IN ({_MINE}) AND e.seq <= "
    "(SELECT value FROM archive_state WHERE key = 'indexed_seq')",
    "DELETE FROM entry_sources WHERE content_hash IN (SELECT content_hash FROM entries "
    f"WHERE seq IN ({_MINE}))",
    f"DELETE FROM vectors WHERE seq IN ({_MINE})",
    f"DELETE FROM entries WHERE seq IN ({_MINE})",
    f"DELETE FROM seen WHERE session_id {_IN}",
    # what a removed session archived first and a kept one dropped since stays, under it
    "UPDATE entries SET session_id = (SELECT s.session_id FROM seen s WHERE s.seq = "
    f"entries.seq) WHERE session_id {_IN}",
    f"DELETE FROM compactions WHERE session_id {_IN}",
)


def remove_sessions(conn: sqlite3.Connection, sessions: list[str]) -> None:
    """Remove the rows ``sessions`` were the last to drop, with their index, ids and
    ``seen``, and the compactions left empty (in the caller's transaction)."""
    for statement in _REMOVE:
        conn.execute(statement, (json.dumps(sessions),))
    conn.execute(
        "DELETE FROM compactions WHERE compaction_id NOT IN (SELECT compaction_id FROM entries)"
    )


def index_pending(conn: sqlite3.Connection, batch: int = 500) -> int:
    """Index up to ``batch`` rows written since the last indexing (in the caller's
    transaction): their full text, caller ids, and ``seen`` unless a later drop wrote
    one; how many were indexed."""
    row = conn.execute("SELECT value FROM archive_state WHERE key = 'indexed_seq'").fetchone()
    done = int(row[0]) if row else 0
    top, count = conn.execute(
        "SELECT max(seq), count(*) FROM "
        "(SELECT seq FROM entries WHERE seq > ? ORDER BY seq LIMIT ?)",
        (done, batch),
    ).fetchone()
    if not count:
        return 0
    rng = (done, top)
    conn.execute(
        f"INSERT INTO entries_fts (rowid, text) SELECT e.seq, {INDEXED_SQL} "
        "FROM entries e WHERE e.seq > ? AND e.seq <= ?",
        rng,
    )
    conn.execute(
        "INSERT OR IGNORE INTO entry_sources SELECT j.value, e.content_hash "
        "FROM entries e, json_each(e.source_ids) j "
        "WHERE e.seq > ? AND e.seq <= ? AND e.source_ids IS NOT NULL",
        rng,
    )
    conn.execute(
        "INSERT OR IGNORE INTO seen SELECT seq, session_id, archived_at FROM entries "
        "WHERE seq > ? AND seq <= ?",
        rng,
    )
    conn.execute("UPDATE archive_state SET value = ? WHERE key = 'indexed_seq'", (top,))
    return int(count)

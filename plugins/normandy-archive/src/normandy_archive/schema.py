"""The SQLite archive's schema (version 2), its full-text index, and the move from version 1.

* ``compactions``: one row per compaction that stored something (its id, session,
  compactor, strategy, model, mid-round flag, time, ``entry_count`` = entries it stored,
  ``dropped_count`` = entries it dropped, token figures, the meta without ``dropped``).
* ``entries``: one row per distinct *content*: ``content_hash`` is the SHA-256 of the
  entry's role and content (:func:`content_hash`), unique across sessions, so content
  dropped again (a re-compaction of the same history, another session replaying it) is
  stored once. A row keeps the entry exactly as first dropped (``entry_json``, byte for
  byte as pydantic wrote it: id, turn, metadata), its session and compaction, and the
  caller's ids found in it (``source_ids``: tool-use and tool-result ids). A different
  version of the same entry id (a tool result cleared, then dropped) is another content,
  kept beside the first.
* ``entry_sources``: ``source_id -> content_hash``, to find an entry by a caller's id.
* ``seen``: for each row, the session that last dropped its content and when (refreshed
  when another session drops it, or the same one after :data:`SEEN_REFRESH` seconds).
  Retention goes by it: pruning a session removes the content no more recent session
  dropped; content it shares with a kept session stays, under that session.
* ``entries_fts``: a contentless FTS5 index of each row's searchable text, computed in SQL
  from ``entry_json`` (:data:`TEXT_SQL`).

* ``journal``: one row per compaction committed in the boundary and not moved into the
  tables above yet: its fields, and ``seen``: the hashes of content it dropped again
  while still in the journal. Its new content is in ``journal_entries``, one row per
  entry (rowid order, no other index: cheap to insert).
  The background writer moves
  it (:func:`move_journal`); readers see its rows through :func:`pending_sql`, numbered with
  the ``seq`` the move gives them.

``archive_state.indexed_seq`` is the last row whose index entries (full text, caller ids,
first ``seen``) are written: :func:`index_pending` writes them after the durable write,
in a transaction of its own; readers look at the rows past the mark directly.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from normandy_core import Entry, ToolResultBlock, ToolUseBlock

__all__ = [
    "SCHEMA_VERSION",
    "SEEN_REFRESH",
    "JOURNAL_TABLE",
    "SEEN_SQL",
    "TEXT_SQL",
    "content_hash",
    "create",
    "index_pending",
    "migrate",
    "move_journal",
    "pending_sql",
    "read_with",
    "source_ids",
]

SCHEMA_VERSION = 2
#: Seconds after which the same session dropping a content again refreshes its ``seen``.
SEEN_REFRESH = 3600.0

#: The columns that describe a compaction, in its row of ``compactions`` and of the
#: ``journal`` alike (each table adds its own around them).
_COMPACTION_COLUMNS = """session_id    TEXT NOT NULL,
        compactor     TEXT,
        strategy      TEXT,
        model         TEXT,
        mid_round     INTEGER,
        created_at    REAL NOT NULL,"""
#: The columns of a compaction's outcome, likewise.
_OUTCOME_COLUMNS = """tokens_before INTEGER,
        tokens_after  INTEGER,
        meta_json     TEXT NOT NULL,
        dropped_count INTEGER"""

_TABLES = (
    f"""CREATE TABLE IF NOT EXISTS compactions (
        compaction_id TEXT PRIMARY KEY,
        {_COMPACTION_COLUMNS}
        entry_count   INTEGER NOT NULL,
        {_OUTCOME_COLUMNS}
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
    """CREATE TABLE IF NOT EXISTS seen (
        seq        INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        at         REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS entries_by_id ON entries (entry_id, seq)",
    "CREATE INDEX IF NOT EXISTS entries_by_session ON entries (session_id, seq)",
    "CREATE INDEX IF NOT EXISTS compactions_by_session ON compactions (session_id, created_at)",
    "CREATE INDEX IF NOT EXISTS compactions_by_time ON compactions (created_at)",
)

JOURNAL_TABLE = f"""CREATE TABLE IF NOT EXISTS journal (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        compaction_id TEXT NOT NULL,
        {_COMPACTION_COLUMNS}
        {_OUTCOME_COLUMNS},
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

_FTS = "CREATE VIRTUAL TABLE IF NOT EXISTS entries_fts USING fts5(text, content='')"

#: Records that ``session`` (first parameter) dropped the content of hash ``?3`` at time
#: ``?2``: the row's ``seen`` moves to it unless the same session saw it recently.
SEEN_SQL = (
    "INSERT INTO seen (seq, session_id, at) SELECT seq, ?1, ?2 FROM entries "
    "WHERE content_hash = ?3 ON CONFLICT (seq) DO UPDATE SET session_id = excluded.session_id, "
    f"at = excluded.at WHERE seen.at <= excluded.at AND (seen.session_id != excluded.session_id "
    f"OR seen.at < excluded.at - {SEEN_REFRESH})"
)

#: The searchable text of the row ``e`` (texts, thinking, tool names and inputs, tool
#: result texts), computed from its JSON. The same expression indexes a row and takes it
#: out of the contentless index again, so the two always agree.
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


def content_hash(entry: Entry, data: str | None = None) -> str:
    """SHA-256 of the entry's role and content (not its id, parent, turn or metadata).

    ``data`` is ``entry.model_dump_json()`` when the caller has it: the content's JSON
    is then cut out of it (pydantic writes the fields in their declared order, and the
    strings before the content cannot hold an unescaped quote) instead of serialized
    again. Both ways hash the same bytes.
    """
    tail = _TAILS[entry.pinned]
    if data is not None and not entry.metadata and data.endswith(tail):
        content = data[data.index(',"content":') + 11 : -len(tail)]
    else:
        content = entry.model_dump_json(include={"content"})[11:-1]
    return hashlib.sha256(f"{entry.role}\n{content}".encode()).hexdigest()


_TAILS = {False: ',"pinned":false,"metadata":{}}', True: ',"pinned":true,"metadata":{}}'}


def source_ids(entry: Entry) -> list[str]:
    """The caller's ids found in ``entry``: its tool-use ids and the ids its tool results
    answer (OpenAI tool-call ids, Anthropic tool-use ids), in order, once each."""
    if isinstance(entry.content, str):
        return []
    found: dict[str, None] = {}
    for b in entry.content:
        if isinstance(b, ToolUseBlock):
            found[b.id] = None
        elif isinstance(b, ToolResultBlock):
            found[b.tool_use_id] = None
    return list(found)


def create(conn: sqlite3.Connection) -> None:
    """Create the version-2 schema in an empty database (inside the caller's transaction)."""
    for stmt in _TABLES:
        conn.execute(stmt)
    conn.execute(_FTS)
    conn.execute(JOURNAL_TABLE)
    conn.execute(JOURNAL_ENTRIES_TABLE)
    conn.execute("INSERT OR IGNORE INTO archive_state VALUES ('indexed_seq', 0)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring an archive of ``version`` to :data:`SCHEMA_VERSION` (in the caller's transaction).

    Version 1 stored one row per ``(session, entry id, hash of the whole entry)`` with an
    external-content FTS index kept by a trigger: its rows are moved to the version-2
    table in archive order, the first of each content kept (it is what later readers
    recall), and indexed again from scratch.
    """
    if version == SCHEMA_VERSION:
        return
    if version != 1:  # pragma: no cover - _archive_version refuses others first
        raise sqlite3.DatabaseError(f"cannot migrate an archive of version {version}")
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
    _copy(conn, rows)
    conn.execute("DROP TABLE entries_v1")
    conn.execute(
        "CREATE TEMP TABLE moved (compaction_id TEXT PRIMARY KEY, n INTEGER) WITHOUT ROWID"
    )
    conn.execute(
        "INSERT INTO moved SELECT compaction_id, count(*) FROM entries GROUP BY compaction_id"
    )
    conn.execute(
        "UPDATE compactions SET entry_count = coalesce((SELECT n FROM moved m "
        "WHERE m.compaction_id = compactions.compaction_id), 0)"
    )
    conn.execute("DROP TABLE moved")


def _copy(conn: sqlite3.Connection, rows: Iterable[tuple[Any, ...]]) -> None:
    insert = (
        "INSERT OR IGNORE INTO entries (seq, session_id, entry_id, content_hash, turn_id, "
        "role, entry_json, source_ids, compaction_id, archived_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    for seq, session, entry_id, turn_id, role, data, cid, at in rows:
        entry = Entry.model_validate_json(data)
        ids = source_ids(entry)
        digest = content_hash(entry, data)
        values = (seq, session, entry_id, digest, turn_id, role, data)
        conn.execute(insert, (*values, json.dumps(ids) if ids else None, cid, at))
        conn.executemany(
            "INSERT OR IGNORE INTO entry_sources VALUES (?, ?)", [(i, digest) for i in ids]
        )
        conn.execute(SEEN_SQL, (session, at, digest))


def index_pending(conn: sqlite3.Connection, batch: int = 500) -> int:
    """Index up to ``batch`` rows written since the last indexing (inside the caller's
    transaction): their full text, their caller ids, and their ``seen`` row when no later
    drop wrote one; how many were indexed."""
    row = conn.execute("SELECT value FROM archive_state WHERE key = 'indexed_seq'").fetchone()
    done = int(row[0]) if row else 0
    top, count = conn.execute(
        "SELECT max(seq), count(*) FROM "
        "(SELECT seq FROM entries WHERE seq > ? ORDER BY seq LIMIT ?)",
        (done, batch),
    ).fetchone()
    if not count:
        return 0
    conn.execute(
        f"INSERT INTO entries_fts (rowid, text) SELECT e.seq, {TEXT_SQL} "
        "FROM entries e WHERE e.seq > ? AND e.seq <= ?",
        (done, top),
    )
    conn.execute(
        "INSERT OR IGNORE INTO entry_sources SELECT j.value, e.content_hash "
        "FROM entries e, json_each(e.source_ids) j "
        "WHERE e.seq > ? AND e.seq <= ? AND e.source_ids IS NOT NULL",
        (done, top),
    )
    conn.execute(
        "INSERT OR IGNORE INTO seen SELECT seq, session_id, archived_at FROM entries "
        "WHERE seq > ? AND seq <= ?",
        (done, top),
    )
    conn.execute("UPDATE archive_state SET value = ? WHERE key = 'indexed_seq'", (top,))
    return int(count)


#: The columns of ``entries``, in order.
ENTRY_COLUMNS = (
    "seq, session_id, entry_id, content_hash, turn_id, role, entry_json, source_ids, "
    "compaction_id, archived_at"
)
#: The columns of ``compactions``, in order.
COMPACTION_COLUMNS = (
    "compaction_id, session_id, compactor, strategy, model, mid_round, created_at, "
    "entry_count, tokens_before, tokens_after, meta_json, dropped_count"
)


def pending_sql(
    upto: bool = False,
    journal: str = "main.journal",
    journal_entries: str = "main.journal_entries",
    k: str = "r.rowid",
) -> str:
    """The rows of the journal as rows of ``entries`` (:data:`ENTRY_COLUMNS`): content
    neither in ``entries`` nor in an earlier journal row, in journal order, each with the
    ``seq`` :func:`move_journal` gives it. With ``upto``, only the journal rows of id up to
    the statement's first parameter (the move of a prefix of the journal numbers them
    alike). ``journal``, ``journal_entries`` and ``k`` (a journal entry's order in its
    row) name where the journal is read from (a reader adds the spool's rows to it)."""
    where = "WHERE j.id <= ?1" if upto else ""
    return f"""SELECT coalesce((SELECT seq FROM main.sqlite_sequence WHERE name = 'entries'), 0)
            + row_number() OVER (ORDER BY p.jid, p.k) AS seq,
        p.session_id, p.entry_id, p.content_hash, p.turn_id, p.role, p.entry_json,
        p.source_ids, p.compaction_id, p.archived_at
    FROM (SELECT j.id AS jid, {k} AS k, j.session_id, r.entry_id, r.content_hash,
            r.turn_id, r.role, r.entry_json, r.source_ids, j.compaction_id,
            j.created_at AS archived_at,
            row_number() OVER (PARTITION BY r.content_hash ORDER BY j.id, {k}) AS nth
        FROM {journal_entries} r JOIN {journal} j ON j.id = r.jid {where}) p
    WHERE p.nth = 1
        AND NOT EXISTS (SELECT 1 FROM main.entries x WHERE x.content_hash = p.content_hash)"""


def read_with(
    journal: str = "main.journal",
    journal_entries: str = "main.journal_entries",
    k: str = "r.rowid",
    first: str = "",
) -> str:
    """What a read statement is prefixed with while the journal holds rows: ``entries``,
    ``compactions`` and ``seen`` then also hold the journal's (``main.entries`` is the
    table alone). The journal is read from the tables named as :func:`pending_sql`'s;
    ``first``: common table expressions before the others (ending with a comma)."""
    return (
        f"WITH {first}entries ({ENTRY_COLUMNS}) AS (SELECT {ENTRY_COLUMNS} FROM main.entries "
        f"UNION ALL {pending_sql(False, journal, journal_entries, k)}), "
        f"compactions ({COMPACTION_COLUMNS}, rowid) AS "
        f"(SELECT {COMPACTION_COLUMNS}, rowid FROM main.compactions UNION ALL "
        "SELECT *, (1 << 62) + row_number() OVER (ORDER BY created_at) FROM "
        # each with the entries the move will store for it (none: not listed): content
        # another journal row or spooled frame held first, or the tables, is not its
        "(SELECT j.compaction_id, j.session_id, j.compactor, j.strategy, j.model, "
        "j.mid_round, j.created_at, p.n, j.tokens_before, j.tokens_after, j.meta_json, "
        f"j.dropped_count FROM {journal} j JOIN (SELECT compaction_id AS cid, count(*) AS n "
        "FROM entries WHERE seq > coalesce((SELECT seq FROM main.sqlite_sequence WHERE "
        "name = 'entries'), 0) GROUP BY compaction_id) p ON p.cid = j.compaction_id)), "
        # the content a journal row dropped again: the last such row's session saw it last
        "seen (seq, session_id, at) AS (SELECT seq, session_id, at FROM main.seen UNION ALL "
        "SELECT e.seq, s.session_id, s.at FROM entries e JOIN (SELECT h.value AS hash, "
        "j.session_id, j.created_at AS at, "
        "row_number() OVER (PARTITION BY h.value ORDER BY j.id DESC) AS n "
        f"FROM {journal} j, json_each(j.seen) h WHERE j.seen IS NOT NULL) s "
        "ON s.hash = e.content_hash AND s.n = 1 "
        "WHERE e.seq > coalesce((SELECT seq FROM main.sqlite_sequence WHERE name = 'entries'), 0)) "
    )


#: :func:`read_with` of the journal alone.
READ_WITH = read_with()


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
    conn.execute(f"INSERT INTO entries ({ENTRY_COLUMNS}) {pending_sql(upto=True)}", (top,))
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

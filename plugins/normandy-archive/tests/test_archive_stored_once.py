"""Stored once: content deduplicated across sessions and repeated compact() calls, rows
traceable to their source (the caller's tool ids, a session key the caller sets), and a
version-1 archive read as it is and moved to version 2 by the first write.

The same tests run against both backends: the SQLite file and PostgreSQL (a real server,
see conftest.py); several processes writing the same content into PostgreSQL at once
are in test_pg.py.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from normandy_archive import Archive, archive_settings, main, maintenance, open_archive
from normandy_archive.schema import SCHEMA_VERSION, content_hash
from normandy_core import AgentConfig, compact, run_compaction
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session
from normandy_core.transcripts.anthropic import to_anthropic
from normandy_core.transcripts.chat import to_openai


@pytest.fixture
def path(tmp_path, monkeypatch):
    p = tmp_path / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(p))
    return p


# PostgreSQL is a server process started for the run: slow (make check leaves it out).
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def target(request, tmp_path, monkeypatch) -> str:
    """The archive the hook and the commands use: an SQLite file, or a PostgreSQL URL."""
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    if request.param == "sqlite":
        p = tmp_path / "archive.sqlite3"
        monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(p))
        return str(p)
    url: str = request.getfixturevalue("pg_url")
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", url)
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "unused.sqlite3"))
    return url


def _rows(target: str) -> dict[str, int]:
    """Rows of the archive: contents, compactions and caller ids (id -> content pairs)."""
    assert maintenance.drain(30)  # the index rows the background writer adds, too
    if target.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(target) as pg:
            one = lambda sql: pg.execute(sql).fetchone()[0]  # noqa: E731
            return {
                "entries": one("SELECT count(*) FROM normandy.entries"),
                "compactions": one("SELECT count(*) FROM normandy.compactions"),
                "entry_sources": one(
                    "SELECT count(*) FROM normandy.entries, unnest(source_ids) AS s"
                ),
            }
    conn = sqlite3.connect(target)
    try:
        return {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("entries", "compactions", "entry_sources")
        }
    finally:
        conn.close()


def test_recompacting_the_same_history_archives_nothing_new(target):
    messages = to_openai(generate_session(81, 400))
    first = compact(messages, window=20_000)  # a fresh session id and fresh entry ids
    assert first.compacted
    note = first.note("archive")
    assert note["stored"] == len({content_hash(e) for e in first.dropped}) > 0
    before = _rows(target)
    for _ in range(3):  # compacted from scratch again (fresh), on the same history
        again = compact(messages, window=20_000, fresh=True)
        assert again.compacted and again.note("archive")["stored"] == 0
        assert again.note("archive")["existing"] == note["stored"]
    assert _rows(target) == before  # not one row more: entries, compactions, sources
    # before every request (a continuation): nothing dropped again, nothing written
    again = compact(messages, window=20_000)
    assert again.continued and not again.dropped and _rows(target) == before
    # the history grew (a new list, not an extension): only what is new is stored
    longer = to_openai(generate_session(81, 600))
    grown = compact(longer, window=20_000)
    stored = grown.note("archive")["stored"]
    assert 0 < stored < len(grown.dropped)
    assert _rows(target)["entries"] == before["entries"] + stored
    assert _rows(target)["compactions"] == before["compactions"] + 1


def test_content_is_stored_once_across_sessions(target):
    memory = generate_session(82, 150, end_mid_round=True)
    opts = {"context_window": 20_000, "counter": "cl100k_base"}
    results = []
    for session in ("agent-a", "agent-b"):
        acc = AgentConfig(
            model="claude-sonnet-4-5",
            system_prompt=SYSTEM_PROMPT,
            tools=TOOLS,
            compactor="window_manager",
            compactor_opts=opts,
            session_id=session,
        ).with_memory(memory)
        _, meta = run_compaction(acc, mid_round=True)
        results.append(meta.hook_notes[0]["note"])
    assert results[0]["stored"] > 0 and results[1]["stored"] == 0
    assert results[1]["existing"] == results[0]["stored"]
    archive = open_archive(target)
    assert archive.count("agent-a") == results[0]["stored"] and archive.count("agent-b") == 0
    assert len(archive.compactions()) == 1  # the second stored nothing: no compaction row


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_rows_carry_the_callers_ids_and_the_session_key(target, fmt, capsys, monkeypatch):
    session = generate_session(83, 200)
    if fmt == "openai":
        messages = to_openai(session)
    else:
        system, messages = to_anthropic(session)
        messages = {"system": system, "messages": messages}
    with archive_settings(session="ticket-4711"):
        result = compact(messages, window=20_000)
    assert result.note("archive")["session"] == "ticket-4711"
    archive = open_archive(target)
    assert archive.count("ticket-4711") == result.note("archive")["stored"] > 0
    use = next(e for e in result.dropped if e.tool_uses)
    call_id = use.tool_uses[0].id  # the provider's id, as the caller gave it
    found = archive.by_source_id(call_id)
    assert [i.entry.role for i in found] == ["assistant", "user"]  # the call and its result
    assert call_id in found[0].source_ids and call_id in found[1].source_ids
    assert found[1].entry.tool_results and all(i.session_id == "ticket-4711" for i in found)
    assert main(["show", call_id, "--all", "--json"]) == 0  # the command finds it too
    shown = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["entry_id"] for x in shown] == [i.entry.id for i in found]
    assert call_id in shown[0]["source_ids"]
    # the environment sets the key as well
    monkeypatch.setenv("NORMANDY_ARCHIVE_SESSION", "from-env")
    compact(to_openai(generate_session(84, 200)), window=20_000)
    assert archive.count("from-env") > 0


V1_SCHEMA = (
    """CREATE TABLE compactions (
        compaction_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, compactor TEXT,
        strategy TEXT, model TEXT, mid_round INTEGER, created_at REAL NOT NULL,
        entry_count INTEGER NOT NULL, tokens_before INTEGER, tokens_after INTEGER,
        meta_json TEXT NOT NULL)""",
    """CREATE TABLE entries (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
        entry_id TEXT NOT NULL, content_hash TEXT NOT NULL, turn_id TEXT,
        role TEXT NOT NULL, entry_json TEXT NOT NULL, text TEXT NOT NULL,
        compaction_id TEXT NOT NULL REFERENCES compactions (compaction_id),
        archived_at REAL NOT NULL, UNIQUE (session_id, entry_id, content_hash))""",
    "CREATE INDEX entries_by_id ON entries (entry_id, seq)",
    "CREATE INDEX entries_by_session ON entries (session_id, seq)",
    "CREATE VIRTUAL TABLE entries_fts USING fts5(text, content='entries', content_rowid='seq')",
    """CREATE TRIGGER entries_fts_insert AFTER INSERT ON entries BEGIN
        INSERT INTO entries_fts (rowid, text) VALUES (new.seq, new.text); END""",
    "PRAGMA user_version = 1",
)


def _v1_archive(path: Path) -> list:
    """An archive as version 1 wrote it: the same entries under two sessions."""
    import hashlib

    from normandy_archive import searchable_text

    entries = list(generate_session(85, 30))
    path.touch(mode=0o600)  # as the archive creates it (it refuses a file others may read)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    for stmt in V1_SCHEMA:
        conn.execute(stmt)
    for n, session in enumerate(("old-a", "old-b")):
        cid = f"c{n}"
        conn.execute(
            "INSERT INTO compactions VALUES (?, ?, 'window_manager', 'oldest_first', NULL, 0, "
            "?, ?, NULL, NULL, '{}')",
            (cid, session, 1000.0 + n, len(entries)),
        )
        for e in entries:
            data = e.model_dump_json()
            conn.execute(
                "INSERT INTO entries (session_id, entry_id, content_hash, turn_id, role, "
                "entry_json, text, compaction_id, archived_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    session,
                    e.id,
                    hashlib.sha256(data.encode()).hexdigest(),
                    e.turn_id,
                    e.role,
                    data,
                    searchable_text(e),
                    cid,
                    1000.0 + n,
                ),
            )
    conn.close()
    return entries


def test_a_version_1_archive_is_read_as_it_is_and_moved_by_the_first_write(path):
    entries = _v1_archive(path)
    before = path.read_bytes()
    archive = Archive(path)  # reading: version 1 as it is, nothing written
    assert archive.count() == 2 * len(entries)
    assert archive.recall(entries[3].id, "old-b") == entries[3]
    word = entries[1].text().split()[0]
    assert entries[1].id in {h.entry.id for h in archive.search(word)}
    tool = next(e for e in entries if e.tool_uses)
    assert tool.id in {i.entry.id for i in archive.by_source_id(tool.tool_uses[0].id)}
    archive.close()
    assert path.read_bytes() == before
    # the first write moves it to version 2: each content once (the first kept), indexed
    Archive(path).record(entries[:2], session_id="new")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    archive = Archive(path)
    assert archive.count() == len(entries) and archive.count("old-a") == len(entries)
    assert archive.count("new") == 0  # its entries were archived before
    assert archive.recall(entries[3].id) == entries[3]
    assert entries[1].id in {h.entry.id for h in archive.search(word)}
    assert next(i.entry for i in archive.by_source_id(tool.tool_uses[0].id)) == tool
    counts = {c.session_id: c.entry_count for c in archive.compactions()}
    assert counts == {"old-a": len(entries), "old-b": 0}


@pytest.mark.parametrize(
    "limits",
    [
        {"max_sessions": -1},
        {"max_bytes": -1},
        {"max_age_seconds": -1.0},
        {"max_age_seconds": float("nan")},
        {"max_sessions": True},
        {"max_sessions": 1.5},
        {"max_bytes": "500MB"},
    ],
)
def test_both_backends_refuse_the_same_bad_retention_limits(target, limits):
    """A retention limit must be a number >= 0 (sessions and bytes whole numbers): the
    same ValueError from both backends, for prune, its dry run and prune_plan, and
    nothing removed (a negative session count used to remove every session)."""
    archive = open_archive(target)
    for n in range(3):
        archive.record(list(generate_session(60 + n, 12)), session_id=f"s{n}", at=1000.0 + n)
    before = archive.count()
    name = next(iter(limits))
    for call in (
        lambda: archive.prune(**limits),
        lambda: archive.prune(**limits, dry_run=True),
        lambda: archive.prune_plan(**limits),
    ):
        with pytest.raises(ValueError, match=f"^{name} must be"):
            call()
    assert archive.count() == before

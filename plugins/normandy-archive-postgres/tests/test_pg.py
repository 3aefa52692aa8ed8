"""The PostgreSQL archive against a real PostgreSQL 16 server (pgserver, in a temporary directory).

One server for the run (conftest.py); every test gets a database of its own. Set
``NORMANDY_TEST_POSTGRES_URL`` to run these tests against another server instead (a
database there is created and dropped per test, so the role needs ``CREATEDB``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import psycopg
import pytest
from archive_helpers import CRASH_AGENT
from reliability_counts import PG_KILLS, PG_SAME_CONTENT_WRITERS, PG_WRITERS_BESIDE

from normandy_archive import Archive, open_archive, searchable_text
from normandy_archive.backend import BACKENDS_GROUP
from normandy_archive.schema import content_hash
from normandy_archive_postgres import PostgresArchive, PostgresArchiveError
from normandy_core import (
    AgentConfig,
    Entry,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    list_plugins,
    run_compaction,
)
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session

#: What the server logs when a client vanishes inside its transaction: at rest between
#: statements, or in the middle of sending its pipeline (BEGIN is sent first).
_OPEN_TX = (
    "unexpected EOF on client connection with an open transaction",
    "incomplete message from client",
)


def _in_tx(log: Path) -> int:
    """How many clients the server's log says vanished inside a transaction."""
    text = log.read_text(errors="replace")
    return sum(text.count(line) for line in _OPEN_TX)


@pytest.fixture
def server(pg_server: str) -> str:
    """The PostgreSQL server's URL (conftest.py starts it once for the run)."""
    return pg_server


@pytest.fixture
def url(pg_url: str) -> str:
    """A fresh, empty database on the server."""
    return pg_url


def test_it_is_the_backend_of_postgresql_urls_once_installed():
    (ep,) = entry_points(group=BACKENDS_GROUP, name="postgresql")
    assert ep.load() is PostgresArchive and ep.dist is not None
    assert ep.dist.name == "normandy-archive-postgres"
    for scheme in ("postgresql", "postgres"):  # opening connects at the first call only
        archive = open_archive(f"{scheme}://nobody@/db?host=/nonexistent")
        assert isinstance(archive, PostgresArchive)


def _tricky() -> list[Entry]:
    """Entries whose JSON has everything that could change on the way: NUL, emoji, escapes."""
    return [
        Entry(id="t-1", role="user", content='zéro\x00nul 🚀 "quotes" \\ back\nslash'),
        Entry(
            id="t-2",
            role="assistant",
            turn_id="turn-9",
            content=[
                TextBlock(text="calling the tool"),
                ToolUseBlock(id="tu_1", name="read_file", input={"path": "src/utils.py", "n": 1}),
            ],
        ),
        Entry(
            id="t-3",
            role="user",
            content=[ToolResultBlock(tool_use_id="tu_1", content="def f():\n    return 1\n")],
        ),
    ]


@pytest.mark.slow
def test_round_trip_byte_for_byte_versions_and_paging_as_sqlite(url, tmp_path):
    entries = [*_tricky(), *generate_session(3, 30)]
    pg, lite = PostgresArchive(url), Archive(tmp_path / "a.sqlite3")
    cleared = entries[2].model_copy(update={"content": "[cleared]"})
    for archive in (pg, lite):
        archive.record(entries[:12], session_id="s1", compactor="x", strategy="y", at=1000.0)
        archive.record(entries[6:20], session_id="s1", compactor="x", meta={"tokens_before": 9})
        archive.record([cleared], session_id="s1", compactor="z", mid_round=True)
        archive.record(entries[20:23], session_id="s2", model="m")
    assert pg.count() == lite.count() == 20 + 1 + 3
    assert pg.count("s1") == 21 and pg.count("nope") == 0

    def same(a, b):
        assert [x.entry_json for x in a] == [x.entry_json for x in b]
        assert [x.session_id for x in a] == [x.session_id for x in b]
        assert [(x.compactor, x.strategy) for x in a] == [(x.compactor, x.strategy) for x in b]

    for e in entries[:20]:
        got = pg.recall(e.id, "s1")
        assert got == e and got.model_dump_json() == e.model_dump_json()
        same(pg.versions(e.id), lite.versions(e.id))
    v = pg.versions(entries[2].id, "s1")
    assert [x.entry for x in v] == [entries[2], cleared]  # both versions, original first
    assert pg.recall(entries[2].id, "s1") == entries[2]
    assert pg.recall("missing") is None
    for item in pg.list(limit=10**9):
        assert item.entry.model_dump_json() == item.entry_json
        assert content_hash(item.entry) == item.content_hash
    same(pg.list(limit=10**9), lite.list(limit=10**9))
    same(pg.list("s1", limit=4, offset=2), lite.list("s1", limit=4, offset=2))
    assert [i.entry for i in pg.list("s1", limit=4, offset=2)] == entries[2:6]
    assert pg.list("s1")[0].archived_at == 1000.0

    comps, lite_comps = pg.compactions(limit=100), lite.compactions(limit=100)
    strip = [(c.session_id, c.compactor, c.strategy, c.model, c.mid_round) for c in comps]
    assert strip == [
        (c.session_id, c.compactor, c.strategy, c.model, c.mid_round) for c in lite_comps
    ]
    # each counts the content it stored (not what was there before) and what it dropped
    assert [(c.entry_count, c.dropped_count, c.tokens_before) for c in comps] == [
        (c.entry_count, c.dropped_count, c.tokens_before) for c in lite_comps
    ]
    assert [c.entry_count for c in comps] == [12, 8, 1, 3]
    assert comps[0].created_at == 1000.0 and comps[1].tokens_before == 9
    assert [c.compaction_id for c in pg.compactions("s2")] == [comps[-1].compaction_id]


@pytest.mark.slow
def test_bad_pages_are_refused_as_sqlite_refuses_them(url, tmp_path, capsys):
    """A limit or offset outside 0 to 2**63-1 (or not a whole number) is the same
    ArchiveQueryError, with the same one line, from both backends; exit 2 from both
    commands."""
    from normandy_archive import main
    from normandy_archive.errors import ArchiveQueryError

    pg, lite = PostgresArchive(url), Archive(tmp_path / "a.sqlite3")
    for archive in (pg, lite):
        archive.record(_tricky(), session_id="s")
    reads = {
        "list": lambda a, limit, offset: a.list("s", limit, offset),
        "search": lambda a, limit, offset: a.search("calling", limit=limit, offset=offset),
        "empty search": lambda a, limit, offset: a.search(" ", limit=limit, offset=offset),
        "compactions": lambda a, limit, offset: a.compactions("s", limit, offset),
    }
    bad = [(-1, 0), (0, -5), (2**63, 0), (0, 2**63), (True, 0), (1.5, 0), ("3", 0), (None, 0)]
    for (limit, offset), (name, read) in itertools.product(bad, reads.items()):
        said = []
        for archive in (pg, lite):
            with pytest.raises(ArchiveQueryError) as info:
                read(archive, limit, offset)
            said.append(str(info.value))
        assert said[0] == said[1] and "\n" not in said[0], (name, limit, offset, said)
        assert "must be a whole number from 0 to 9223372036854775807" in said[0]
    for archive in (pg, lite):  # the extremes are pages like any other
        assert len(archive.list("s", 2**63 - 1, 0)) == 3 and archive.list("s", 0, 0) == []
        assert (
            archive.list("s", 5, 2**63 - 1) == [] and archive.compactions("s", 1, 2**63 - 1) == []
        )
    for argv in (["list", "--limit", "-1"], ["search", "x", "--offset", "99999999999999999999"]):
        errors = []
        for where in (["--url", url], ["--path", str(tmp_path / "a.sqlite3")]):
            assert main([*where, *argv]) == 2
            errors.append(capsys.readouterr().err)
        assert errors[0] == errors[1] and errors[0].count("\n") == 1


@pytest.mark.slow
def test_reads_never_create_the_schema_and_say_what_is_missing(url):
    archive = PostgresArchive(url)
    for read in (
        archive.list,
        archive.count,
        archive.compactions,
        lambda: archive.search("x"),
        lambda: archive.recall("x"),
    ):
        with pytest.raises(PostgresArchiveError, match="no Normandy archive here") as info:
            read()
        assert "postgresql://" in str(info.value) and "schema 'normandy'" in str(info.value)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'normandy'")
        assert row.fetchone()[0] == 0

    archive.record(_tricky(), session_id="s")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM normandy.schema_version").fetchall() == [(3,)]
        conn.execute("INSERT INTO normandy.schema_version (version) VALUES (4)")
    for fresh in (
        PostgresArchive(url).list,
        lambda: PostgresArchive(url).record([], session_id="s"),
    ):
        with pytest.raises(PostgresArchiveError, match="version 4"):
            fresh()


@pytest.mark.slow
def test_concurrent_first_writers_create_the_schema_once(url):
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []
    entries = list(generate_session(4, 12))

    def write(n: int) -> None:
        archive = PostgresArchive(url)
        try:
            barrier.wait()
            archive.record(entries, session_id=f"s{n % 2}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            archive.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    archive = PostgresArchive(url)
    assert archive.count() == len(entries)  # the same content, stored once
    assert sum(c.entry_count for c in archive.compactions()) == len(entries)


SAME_CONTENT = textwrap.dedent(
    """
    import json, sys, time
    from normandy_archive_postgres import PostgresArchive
    from normandy_core.app.workload import generate_session
    url, tag, order, start = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    # every writer drops the same contents, under ids of its own
    mine = [e.model_copy(update={"id": f"{tag}-{e.id}"}) for e in generate_session(9, 160)]
    if order == "reversed":
        mine.reverse()
    archive = PostgresArchive(url)
    archive.create_schema()  # connected and ready before the start
    while time.time() < start:
        time.sleep(0.0005)
    done = []
    for k in range(0, len(mine), 40):
        r = archive.record(mine[k : k + 40], session_id=tag)
        done.append([r.entries, r.existing])
    print(json.dumps(done))
    """
)


@pytest.mark.slow
def test_writers_of_the_same_content_at_once_store_it_once(url):
    """Several processes archive the same contents at the same moment (two in the order
    dropped, two in the reverse order, so their inserts cross): none fails, each content
    is stored once, by whichever committed it first, and every writer is told what it
    stored and what was there already."""
    from normandy_archive.schema import content_hash

    PostgresArchive(url).create_schema()
    tags = {f"{order[:3]}-{n}": order for n, order in enumerate(PG_SAME_CONTENT_WRITERS)}
    assert sorted(tags.values()) == ["forward", "forward", "reversed", "reversed"]
    start = time.time() + 3.0
    procs = {
        tag: subprocess.Popen(
            [sys.executable, "-c", SAME_CONTENT, url, tag, order, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag, order in tags.items()
    }
    reports = {}
    for tag, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, (tag, err[-3000:])
        reports[tag] = json.loads(out.splitlines()[-1])
    contents = {content_hash(e) for e in generate_session(9, 160)}
    archive = PostgresArchive(url)
    assert archive.count() == len(contents)
    assert sum(stored for r in reports.values() for stored, _ in r) == len(contents)
    for tag, report in reports.items():  # each compaction: its contents, stored or found
        assert sum(stored + existing for stored, existing in report) >= len(contents), tag
    rows = archive.list(limit=10**6)
    assert len({r.content_hash for r in rows}) == len(rows) == len(contents)
    for r in rows:  # the first writer's entry, byte for byte, under its session
        assert r.entry.id.startswith(f"{r.session_id}-") and r.session_id in tags
        assert r.entry.model_dump_json() == r.entry_json
        assert content_hash(r.entry) == r.content_hash
    with psycopg.connect(url) as conn:
        wrong = conn.execute(
            "SELECT c.compaction_id FROM normandy.compactions c LEFT JOIN normandy.entries e "
            "ON e.compaction_id = c.compaction_id GROUP BY c.compaction_id "
            "HAVING count(e.seq) <> max(c.entry_count)"
        ).fetchall()
        seen = conn.execute(
            "SELECT count(*), count(DISTINCT seq) FROM normandy.seen WHERE session_id = ANY(%s)",
            [list(tags)],
        ).fetchone()
    assert wrong == []  # every compaction row counts exactly the contents it stored
    assert seen == (len(contents), len(contents))  # one last dropper per content


@pytest.mark.slow
def test_idempotent_rewrites(url):
    archive = PostgresArchive(url)
    entries = list(generate_session(5, 20))
    cid = archive.record(entries, session_id="s", compactor="x")
    assert (cid.entries, cid.existing) == (len(entries), 0)
    again = archive.record(entries, session_id="s", compaction_id=cid, compactor="y")
    assert again == cid and (again.entries, again.existing) == (0, len(entries))
    assert archive.count() == len(entries) and len(archive.compactions()) == 1
    assert archive.compactions()[0].compactor == "x"  # the first write stands
    dup = archive.record([*entries, *entries], session_id="s")  # duplicates in one call
    assert (dup.entries, dup.existing) == (0, len(entries)) and not dup.stored
    assert archive.count() == len(entries) and len(archive.compactions()) == 1
    # another session's content is stored once too: the rows stay the first session's
    moved = archive.record(entries[:3], session_id="other")
    assert (moved.entries, moved.existing) == (0, 3) and archive.count("other") == 0
    assert archive.recall(entries[0].id).model_dump_json() == entries[0].model_dump_json()
    with psycopg.connect(url) as conn:  # and it dropped them last: retention keeps them for it
        owners = conn.execute(
            "SELECT s.session_id, count(*) FROM normandy.seen s GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert owners == [("other", 3), ("s", len(entries) - 3)]


@pytest.mark.slow
def test_ranked_search_and_syntax_that_breaks_to_tsquery(url):
    archive = PostgresArchive(url)
    docs = [
        Entry(id="a", role="user", content="billing failed with TypeError in billing billing"),
        Entry(id="b", role="user", content="a long story " * 40 + "billing mentioned once"),
        Entry(id="c", role="assistant", content="the exact phrase is here, nothing else"),
        Entry(id="d", role="assistant", content="phrase exact, the other way round"),
        *_tricky(),
    ]
    archive.record(docs, session_id="s1")
    # the same words from another role: another content (the same content is stored once)
    archive.record([docs[0].model_copy(update={"id": "a2", "role": "assistant"})], session_id="s2")
    ids = lambda hits: [h.entry.id for h in hits]  # noqa: E731

    assert ids(archive.search("billing", session_id="s1")) == ["a", "b"]  # best first
    assert ids(archive.search("BILLING typeerror")) == ["a", "a2"]
    assert ids(archive.search("billing", limit=1, offset=1, session_id="s1")) == ["b"]
    assert ids(archive.search("src/utils.py")) == ["t-2"]  # in the tool input
    assert ids(archive.search("utils")) == ["t-2"]  # a path's words are words
    assert ids(archive.search("return")) == ["t-3"]  # a tool result's text
    assert ids(archive.search("zéro nul 🚀")) == ["t-1"]  # NUL stored as a blank
    assert ids(archive.search('"exact phrase"', raw=True)) == ["c"]
    assert set(ids(archive.search("exact phrase"))) == {"c", "d"}
    assert set(ids(archive.search("TypeError OR round", raw=True, session_id="s1"))) == {"a", "d"}
    assert ids(archive.search("phrase -round", raw=True)) == ["c"]
    assert archive.search("zzzznotthere") == [] and archive.search("   ") == []

    breaking = ["((", "<->", "!", "'", "billing & | ", ":", "\\", "two words", "a:b:c"]
    hostile = [*breaking, '"unbalanced', "a & b | !c", "foo:*", "-", "OR", "\x00", "🚀:*"]
    hostile += ["a <2> b", "x" * 5000, "-billing", "'; DROP TABLE normandy.entries; --"]
    with psycopg.connect(url) as conn:
        for q in breaking:  # what to_tsquery does with user syntax
            with pytest.raises(psycopg.errors.SyntaxError):
                conn.execute("SELECT to_tsquery('simple', %s)", [q])
            conn.rollback()
    for q in hostile:
        for raw in (False, True):
            archive.search(q, raw=raw)  # never an error
    assert ids(archive.search("billing & | ", session_id="s1")) == ["a", "b"]
    assert ids(archive.search('"unbalanced phrase', raw=True)) == []
    assert archive.count() == len(docs) + 1


def grow(acc: AgentConfig, session, metas: list) -> AgentConfig:
    """Replay ``session`` into ``acc`` one entry at a time, compacting after every tool batch."""
    for e in session:
        acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
        if e.role == "user" and e.tool_results:
            acc, meta = run_compaction(acc, mid_round=True)
            assert "error" not in meta and "hook_errors" not in meta, meta
            if meta["compacted"]:
                metas.append(meta)
    return acc


def config(compactor: str, opts: dict) -> AgentConfig:
    return AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt=SYSTEM_PROMPT,
        tools=TOOLS,
        compactor=compactor,
        compactor_opts=opts,
    )


@pytest.mark.slow
def test_many_compactions_through_the_boundary_are_recallable(url, monkeypatch, tmp_path):
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", url)
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "unused.sqlite3"))
    assert ("archive", "loaded") in {(r.name, r.status) for r in list_plugins()}
    wm = {"context_window": 30_000, "trigger": 0.9, "target": 0.5, "counter": "cl100k_base"}
    metas: dict[str, list] = {}
    acc = config("window_manager", wm)
    metas[acc.session_id] = []
    grow(acc, generate_session(21, 400), metas[acc.session_id])
    steps = [
        {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 20_000, "keep": 4}},
        {"compactor": "window_manager", "opts": wm},
    ]
    acc2 = config("pipeline", {"steps": steps, "counter": "cl100k_base"})
    metas[acc2.session_id] = []
    grow(acc2, generate_session(22, 400), metas[acc2.session_id])
    assert len(metas[acc.session_id]) >= 5 and len(metas[acc2.session_id]) >= 5
    assert not (tmp_path / "unused.sqlite3").exists()  # the URL wins over the path

    archive = PostgresArchive(url)
    stored = {item.content_hash: item for item in archive.list(limit=10**9)}
    first: dict[str, str] = {}  # content -> the JSON of the entry that dropped it first
    for session_metas in metas.values():
        for meta in session_metas:
            for e in meta["dropped"]:
                first.setdefault(content_hash(e), e.model_dump_json())
    assert stored.keys() == first.keys()  # every content dropped, once
    for digest, data in first.items():  # as first dropped, byte for byte
        item = stored[digest]
        assert item.entry_json == data and item.entry.model_dump_json() == data
        versions = archive.versions(item.entry.id, item.session_id)
        assert data in [v.entry.model_dump_json() for v in versions]
    # clear_tool_results reported originals; window_manager later dropped cleared versions
    ids = [i.entry.id for i in stored.values() if i.session_id == acc2.session_id]
    assert len(ids) > len(set(ids))
    notes = [n["note"] for m in metas.values() for meta in m for n in meta.hook_notes]
    assert sum(n["stored"] for n in notes) == archive.count() == len(first)
    records = archive.compactions(limit=10**6)
    assert len(records) == sum(1 for n in notes if n["stored"])
    assert {r.compactor for r in records} == {"window_manager", "pipeline"}
    assert all(r.model == "claude-sonnet-4-5" and r.mid_round for r in records)


def test_an_unreachable_database_is_reported_in_hook_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", f"postgresql://nobody@/db?host={tmp_path}")
    acc = config("window_manager", {"context_window": 20_000}).with_memory(
        generate_session(4, 150, end_mid_round=True)
    )
    # required (the default): the compaction is refused, the conversation kept
    out, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is False and out is acc
    assert "could not record" in meta["error"]
    assert "PostgreSQL archive postgresql://nobody@" in meta["error"]
    # best effort: the compaction stands and the loss is an error in hook_errors
    monkeypatch.setenv("NORMANDY_ARCHIVE_REQUIRED", "0")
    _, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True
    [error] = meta["hook_errors"]
    assert error["hook"] == "normandy_core.hooks:archive"
    assert "PostgreSQL archive postgresql://nobody@" in str(error)


@pytest.mark.slow
def test_archive_commands_against_postgres(url, monkeypatch, capsys, tmp_path):
    from normandy_archive import main
    from normandy_core.app.cli import main as normandy

    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "unused.sqlite3"))
    # before anything is archived: one line, exit 2, and still no schema
    assert main(["--url", url, "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Normandy archive here" in err
    assert "postgresql://postgres@" in err

    entries = [*_tricky(), *generate_session(5, 20)]
    PostgresArchive(url).record(entries, session_id="sess-1", compactor="window_manager")
    assert main(["--url", url, "list", "--limit", "3"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[0] == "SEQ"
    assert len(lines) == 3 and entries[0].id in lines[0] and "sess-1" in lines[0]
    assert main(["--url", url, "show", "t-1"]) == 0
    assert capsys.readouterr().out == entries[0].model_dump_json() + "\n"
    assert main(["--url", url, "show", "--json", "t-2"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["entry_id"] == "t-2" and row["compactor"] == "window_manager"
    assert main(["--url", url, "search", "--json", "src/utils.py"]) == 0
    assert [json.loads(x)["entry_id"] for x in capsys.readouterr().out.splitlines()] == ["t-2"]
    assert main(["--url", url, "search", "--raw", '"unbalanced', "((", "<->"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["--url", url, "show", "nope"]) == 1
    err = capsys.readouterr().err
    assert "'nope'" in err and "postgresql://" in err

    # NORMANDY_ARCHIVE_URL selects it for `normandy archive` too; --path still reads a file
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", url)
    assert normandy(["archive", "list", "--session", "sess-1", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(entries)
    assert normandy(["archive", "search", "return"]) == 0
    assert "t-3" in capsys.readouterr().out
    # --path wins over the URL; a missing archive file is an error (exit 2, one line)
    assert normandy(["archive", "--path", str(tmp_path / "none.sqlite3"), "list"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "unused.sqlite3").exists()

    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", "mysql://x")
    assert main(["list"]) == 2
    assert "postgresql://" in capsys.readouterr().err
    bad = f"postgresql://nobody@/db?host={tmp_path}"
    assert main(["--url", bad, "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PostgreSQL archive postgresql://nobody@" in err
    with pytest.raises(SystemExit) as info:
        main(["--url", url, "--path", "x", "list"])  # one or the other
    assert info.value.code == 2

    done = subprocess.run(
        [sys.executable, "-m", "normandy_archive", "search", "--json", "zéro"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "NORMANDY_ARCHIVE_URL": url},
    )
    assert [json.loads(x)["entry"] for x in done.stdout.splitlines()] == [
        json.loads(entries[0].model_dump_json())
    ]

    # prune: the plan listed, then removed, as for SQLite (exit 2 without a limit)
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL")
    PostgresArchive(url).record(list(generate_session(6, 10)), session_id="sess-0", at=1000.0)
    assert main(["--url", url, "prune", "--max-sessions", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sess-0  last ") and "would remove 1 of 2 sessions" in out
    assert main(["--url", url, "prune", "--max-sessions", "1"]) == 0
    assert "removed 1 of 2 sessions" in capsys.readouterr().out
    assert PostgresArchive(url).count("sess-0") == 0 and PostgresArchive(url).count() > 0
    assert main(["--url", url, "prune"]) == 2 and "no limit" in capsys.readouterr().err


def _agent(url: str, tag: str, seed: int, messages: int) -> subprocess.Popen[str]:
    env = {**os.environ, "NORMANDY_ARCHIVE_URL": url, "NORMANDY_ARCHIVE_PATH": os.devnull}
    return subprocess.Popen(
        [sys.executable, "-c", CRASH_AGENT, tag, str(seed), str(messages)],
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PGAPPNAME": tag},  # its connection, in pg_stat_activity
    )


def _kill_9(
    url: str, proc: subprocess.Popen[str], tag: str, how: str, rng: random.Random
) -> list[str]:
    """SIGKILL ``proc`` in a compaction after its first one to three; return its lines.

    ``how`` is ``"delay"`` (a random delay after a compaction begins: one takes 20-30 ms
    here) or ``"transaction"`` (inside its archive transaction: the compactions table is
    held locked, so the archive statement waits in its open transaction until the kill,
    however loaded the machine; a kill aimed at a running statement instead could land
    after its commit).
    """
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(x.strip() for x in proc.stdout))
    reader.start()
    after, delay = rng.randint(1, 3), rng.uniform(0.0, 0.035)
    deadline = time.monotonic() + 60
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tag, lines)
            completed = sum(1 for x in list(lines) if x.startswith("["))
            if completed < after:
                time.sleep(0.002)
            elif how == "delay":
                if lines[-1] == "begin":
                    time.sleep(delay)
                    break
                time.sleep(0.001)
            else:
                _kill_waiting(url, conn, proc, tag, deadline)
                break
        if how == "delay":
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    reader.join(timeout=60)
    return lines


#: Seconds the compactions table is held locked at a time while a writer is awaited: well
#: under the archive's lock timeout (5 s), which the writers beside it wait at most.
_HOLD = 1.0


def _kill_waiting(
    url: str, conn: psycopg.Connection[Any], proc: subprocess.Popen[str], tag: str, deadline: float
) -> None:
    """SIGKILL ``proc`` while its next archive statement waits for a lock on the
    compactions table that ``conn`` holds (released once the process is gone; released
    and taken again every :data:`_HOLD` seconds meanwhile, so the other writers never
    wait past their lock timeout)."""
    # watched from another connection: pg_stat_activity is read once per transaction
    with psycopg.connect(url, autocommit=True) as watch:
        while True:
            with conn.transaction():
                conn.execute("LOCK TABLE normandy.compactions IN EXCLUSIVE MODE")
                held = time.monotonic() + _HOLD
                while time.monotonic() < held:
                    if watch.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s "
                        "AND wait_event_type = 'Lock' AND query LIKE 'WITH t AS%%'",
                        [tag],
                    ).fetchone():
                        os.kill(proc.pid, signal.SIGKILL)
                        proc.wait(timeout=60)
                        return
                    assert proc.poll() is None and time.monotonic() < deadline, tag
                    time.sleep(0.002)


def _vanished_in_tx(log: Path | None, before: int, expected: int) -> int | None:
    """How many clients the server saw vanish inside an open transaction since ``before``
    (``None`` without its log); waits up to five seconds for it to log ``expected``."""
    if log is None:
        return None
    deadline = time.monotonic() + 5.0
    while True:
        n = _in_tx(log) - before
        if n >= expected or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


@pytest.mark.slow
def test_three_writers_at_once_and_kill_9_at_random_moments(url, pg_server_log):
    """Two agents archive the same contents at once, to the end, while a third is killed
    -9 again and again (two of the killed drop the same contents too): every compaction
    that completed is recallable byte for byte, each content stored once, and every
    compaction row has all the content it stored."""
    # a fixed seed unless one is given, so a run draws the same delays (the kill moments
    # still depend on the machine's timing; the seed is printed and in every message)
    seed = int(os.environ.get("NORMANDY_TEST_SEED", "595"))
    rng = random.Random(seed)
    outputs: dict[str, list[str]] = {}
    # the same session replayed by both: they write the same contents at the same moments
    survivors = {
        f"alive-{k}": _agent(url, f"alive-{k}", 40, 1000) for k in range(PG_WRITERS_BESIDE)
    }
    killed: list[str] = []
    overlapped = 0  # kills while both other writers were still writing
    log = pg_server_log
    open_before = _in_tx(log) if log else 0
    for k, how in enumerate(PG_KILLS):
        tag = f"killed-{k}"
        killed.append(tag)
        proc = _agent(url, tag, 30 + k % 2, 400)  # the third writer, again and again
        outputs[tag] = _kill_9(url, proc, tag, how, rng)
        overlapped += all(p.poll() is None for p in survivors.values())
        assert proc.returncode == -signal.SIGKILL, (seed, tag)
        assert "end" not in outputs[tag], (seed, tag)
    for tag, p in survivors.items():
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, (seed, tag)
        outputs[tag] = out.splitlines()
        assert outputs[tag][-1] == "end"
    assert overlapped >= len(PG_KILLS) - 1, (seed, overlapped)

    in_tx = _vanished_in_tx(log, open_before, PG_KILLS.count("transaction"))

    archive = PostgresArchive(url)
    with psycopg.connect(url) as conn:
        partial = conn.execute(
            "SELECT c.session_id, c.compaction_id, c.entry_count, count(e.seq) "
            "FROM normandy.compactions c LEFT JOIN normandy.entries e "
            "ON e.compaction_id = c.compaction_id GROUP BY c.compaction_id "
            "HAVING count(e.seq) <> c.entry_count"
        ).fetchall()
    assert partial == [], seed  # every compaction row with all the content it stored
    stored = {item.content_hash: item for item in archive.list(limit=10**9)}
    assert len(stored) == archive.count()  # each content once
    dropped: dict[str, set[str]] = {}  # content -> hashes of the entries dropped with it
    for tag, lines in outputs.items():
        completed = [json.loads(line) for line in lines if line.startswith("[")]
        assert completed, (seed, tag)
        for done in completed:
            for content, whole in done:
                dropped.setdefault(content, set()).add(whole)
        # the compaction killed is there whole or not at all (a row only when it stored)
        assert len(archive.compactions(tag, limit=10**6)) <= len(completed) + (tag in killed)
    for content, wholes in dropped.items():  # every completed compaction is recallable
        item = stored.get(content)
        assert item is not None, (seed, content)
        assert item.entry.model_dump_json() == item.entry_json  # byte for byte
        # the entry as one of the completed compactions dropped it, or as a killed writer
        # did when it stored the content first and was killed before it could say so
        # (the same content, another entry: a compaction marker's text, say)
        whole = hashlib.sha256(item.entry_json.encode()).hexdigest()
        assert whole in wholes or item.session_id in killed, (seed, content, item.session_id)
    # nothing extra, but what a killed writer committed before it could say so
    landed = {stored[c].session_id for c in set(stored) - set(dropped)}
    assert landed <= set(killed), (seed, landed)
    print(
        f"seed {seed}: {len(killed)} writers killed, {in_tx} inside an open transaction, "
        f"{len(landed)} after their last compaction committed; {archive.count()} contents"
    )
    if in_tx is not None:
        # the server saw each writer killed in its archive transaction vanish inside it
        assert in_tx >= PG_KILLS.count("transaction"), (seed, in_tx)


@pytest.mark.slow
def test_prune_removes_the_oldest_sessions_first(url):
    """As in SQLite: a session's age is that of the last content it dropped, and content
    belongs to the session that dropped it last, so shared content stays with a kept one."""
    archive = PostgresArchive(url)
    entries = list(generate_session(6, 40))
    assert len({content_hash(e) for e in entries[:28]}) == 28
    archive.record(entries[:10], session_id="old", at=1000.0)
    archive.record(entries[10:14], session_id="old", at=1500.0)
    archive.record(entries[14:22], session_id="older-start", at=900.0)
    archive.record(entries[22:23], session_id="older-start", at=2000.0)  # active later
    shared = archive.record([*entries[:3], *entries[23:28]], session_id="new")
    assert (shared.entries, shared.existing) == (5, 3)  # "new" dropped 3 of old's last
    assert archive.prune() == 0
    plan = archive.prune_plan(max_bytes=0)  # never the most recent session for size
    assert [s.session_id for s in plan.sessions] == ["old", "older-start"]
    assert plan.total_sessions == 3 and plan.entries == 11 + 9
    assert archive.prune(max_sessions=2, dry_run=True) == 11
    assert archive.count() == 28  # a dry run removes nothing
    assert archive.prune(max_sessions=2) == 11
    assert archive.count("old") == 0 and archive.compactions("old") == []
    kept = archive.versions(entries[0].id)  # shared content stays, under the kept session
    assert [(i.session_id, i.entry) for i in kept] == [("new", entries[0])]
    assert archive.count("new") == 8
    assert archive.prune(max_age_seconds=3600, dry_run=True) == 9
    assert archive.prune(max_age_seconds=3600) == 9
    assert archive.count() == 8 and [c.session_id for c in archive.compactions()] == ["new"]
    assert archive.prune(max_age_seconds=3600, max_sessions=1) == 0
    assert archive.prune(max_sessions=0) == 8 and archive.count() == 0
    assert archive.compactions() == []
    with pytest.raises(ValueError, match="max_sessions"):
        archive.prune(max_sessions=-1)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_opens_its_own_connection(url):
    archive = PostgresArchive(url)
    entries = list(generate_session(7, 12))
    archive.record(entries[:4], session_id="parent")
    backend = archive._local.conn.info.backend_pid
    pid = os.fork()
    if pid == 0:  # the child: its inherited connection is dropped (and collected) here
        status = 1
        try:
            archive.record(entries[4:8], session_id="child")
            mine = archive._local.conn.info.backend_pid
            status = 0 if archive.count("child") == 4 and mine != backend else 1
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    archive.record(entries[8:], session_id="parent")
    assert archive._local.conn.info.backend_pid == backend  # the parent's session lived on
    assert archive.count("parent") == len(entries) - 4 and archive.count("child") == 4


@pytest.mark.slow
def test_the_write_throughput_benchmark_runs(server, monkeypatch):
    import importlib.util

    root = Path(__file__).resolve().parents[3]
    path = root / "benchmarks" / "archive_backends.py"
    spec = importlib.util.spec_from_file_location("bench_archive", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setenv("NORMANDY_BENCH_POSTGRES_URL", server)  # this module's server
    rows = bench.write_throughput(3, [2])
    assert [r["size"] for r in rows] == [2, 2] and not any(r["skipped"] for r in rows)
    assert all(r["entries_per_s"] > 0 and r["compactions"] == 3 for r in rows)


@pytest.mark.slow
def test_least_privilege_roles(url):
    """The agents' role owns only the schema; readers may only read; no database CREATE."""
    tag = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    agent, reader, writer = f"{tag}_agent", f"{tag}_reader", f"{tag}_writer"
    as_role = lambda role: url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)  # noqa: E731
    with psycopg.connect(url, autocommit=True) as conn:
        for role in (agent, reader, writer):
            conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"REVOKE CREATE, TEMPORARY ON DATABASE {tag} FROM PUBLIC")
        conn.execute(f"CREATE SCHEMA normandy AUTHORIZATION {agent}")
    try:
        entries = list(generate_session(8, 10))
        # the role that owns the (empty) schema creates the tables on its first write
        PostgresArchive(as_role(agent)).record(entries[:5], session_id="a")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"GRANT USAGE ON SCHEMA normandy TO {reader}, {writer}")
            conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA normandy TO {reader}")
            conn.execute(f"GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA normandy TO {writer}")
            conn.execute(f"GRANT UPDATE ON normandy.seen TO {writer}")
        # a writer granted SELECT and INSERT, and UPDATE on seen, is enough (identity
        # columns need no grant)
        PostgresArchive(as_role(writer)).record(entries[5:], session_id="w")
        mine = PostgresArchive(as_role(reader))
        assert mine.count() == len(entries)
        word = searchable_text(entries[0]).split()[0]
        assert entries[0].id in [h.entry.id for h in mine.search(word, session_id="a")]
        with pytest.raises(PostgresArchiveError, match="permission denied"):
            mine.record(entries[:1], session_id="r")
        with pytest.raises(PostgresArchiveError, match="permission denied"):
            PostgresArchive(as_role(writer)).prune(max_sessions=0)  # DELETE is not granted
        assert mine.count() == len(entries)
        # a role that may not create the schema gets PostgreSQL's refusal, named
        with pytest.raises(PostgresArchiveError, match="permission denied"):
            PostgresArchive(as_role(reader), schema="other").record(entries[:1], session_id="r")
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA normandy CASCADE")
            for role in (agent, reader, writer):
                conn.execute(f"DROP ROLE {role}")


PG_V1_SCHEMA = (
    "CREATE SCHEMA normandy",
    """CREATE TABLE normandy.schema_version (
        version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE normandy.compactions (
        compaction_id text PRIMARY KEY, seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        session_id text NOT NULL, compactor text, strategy text, model text,
        mid_round boolean, created_at double precision NOT NULL, entry_count integer NOT NULL,
        tokens_before bigint, tokens_after bigint, meta_json text NOT NULL)""",
    "CREATE INDEX compactions_by_session ON normandy.compactions (session_id, created_at)",
    "CREATE INDEX compactions_by_time ON normandy.compactions (created_at, seq)",
    """CREATE TABLE normandy.entries (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, session_id text NOT NULL,
        entry_id text NOT NULL, content_hash text NOT NULL, turn_id text, role text NOT NULL,
        entry_json text NOT NULL, text text NOT NULL,
        compaction_id text NOT NULL REFERENCES normandy.compactions (compaction_id),
        archived_at double precision NOT NULL,
        tsv tsvector GENERATED ALWAYS AS
            (to_tsvector('simple'::regconfig, left(text, 100000))) STORED,
        UNIQUE (session_id, entry_id, content_hash))""",
    "CREATE INDEX entries_by_id ON normandy.entries (entry_id, seq)",
    "CREATE INDEX entries_by_session ON normandy.entries (session_id, seq)",
    "CREATE INDEX entries_by_compaction ON normandy.entries (compaction_id)",
    "CREATE INDEX entries_tsv ON normandy.entries USING gin (tsv)",
    "INSERT INTO normandy.schema_version (version) VALUES (1)",
)


def _pg_v1_archive(url: str) -> list[Entry]:
    """A database as version 1 wrote it: the same entries under two sessions."""
    from normandy_archive_postgres.archive import _words

    entries = list(generate_session(85, 30))
    with psycopg.connect(url) as conn:
        for stmt in PG_V1_SCHEMA:
            conn.execute(stmt)
        for n, session in enumerate(("old-a", "old-b")):
            cid = f"c{n}"
            conn.execute(
                "INSERT INTO normandy.compactions (compaction_id, session_id, compactor, "
                "strategy, mid_round, created_at, entry_count, meta_json) "
                "VALUES (%s, %s, 'window_manager', 'oldest_first', false, %s, %s, '{}')",
                (cid, session, 1000.0 + n, len(entries)),
            )
            for e in entries:
                data = e.model_dump_json()
                conn.execute(
                    "INSERT INTO normandy.entries (session_id, entry_id, content_hash, turn_id, "
                    "role, entry_json, text, compaction_id, archived_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (
                        session,
                        e.id,
                        hashlib.sha256(data.encode()).hexdigest(),
                        e.turn_id,
                        e.role,
                        data,
                        _words(searchable_text(e)),
                        cid,
                        1000.0 + n,
                    ),
                )
    return entries


@pytest.mark.slow
def test_a_version_1_schema_is_read_as_it_is_and_moved_by_the_first_write(url):
    entries = _pg_v1_archive(url)
    archive = PostgresArchive(url)  # reading: version 1 as it is, nothing written
    assert archive.count() == 2 * len(entries)
    assert archive.recall(entries[3].id, "old-b") == entries[3]
    word = entries[1].text().split()[0]
    assert entries[1].id in {h.entry.id for h in archive.search(word)}
    tool = next(e for e in entries if e.tool_uses)
    assert tool.id in {i.entry.id for i in archive.by_source_id(tool.tool_uses[0].id)}
    assert [c.dropped_count for c in archive.compactions()] == [len(entries)] * 2
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM normandy.schema_version").fetchall() == [(1,)]
    # the first write moves it to version 3: each content once (the first kept), its caller
    # ids, and the session that dropped it last
    PostgresArchive(url).record(entries[:2], session_id="new")
    with psycopg.connect(url) as conn:
        versions = conn.execute("SELECT version FROM normandy.schema_version ORDER BY 1")
        assert versions.fetchall() == [(1,), (3,)]
        owners = conn.execute("SELECT session_id, count(*) FROM normandy.seen GROUP BY 1")
        assert dict(owners.fetchall()) == {"old-b": len(entries) - 2, "new": 2}
    archive = PostgresArchive(url)
    assert archive.count() == len(entries) and archive.count("old-a") == len(entries)
    assert archive.count("new") == 0  # its entries were archived before
    assert archive.recall(entries[3].id) == entries[3]
    assert entries[1].id in {h.entry.id for h in archive.search(word)}
    found = archive.by_source_id(tool.tool_uses[0].id)
    assert found[0].entry == tool and tool.tool_uses[0].id in found[0].source_ids
    counts = {c.session_id: (c.entry_count, c.dropped_count) for c in archive.compactions()}
    assert counts == {"old-a": (len(entries), len(entries)), "old-b": (0, len(entries))}
    # and it is written like any version-3 archive
    more = archive.record(list(generate_session(86, 10)), session_id="new")
    assert more.entries > 0 and archive.count("new") == more.entries

"""The PostgreSQL archive against a real PostgreSQL 16 server (pgserver, in a temporary directory).

One server for the module; every test gets a database of its own. Set
``NORMANDY_TEST_POSTGRES_URL`` to run these tests against another server instead (a
database there is created and dropped per test, so the role needs ``CREATEDB``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg", reason="the 'postgres' extra is not installed")

from normandy_archive import Archive, searchable_text  # noqa: E402
from normandy_archive.pg import PostgresArchive, PostgresArchiveError  # noqa: E402
from normandy_core import (  # noqa: E402
    AgentConfig,
    Entry,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    list_plugins,
    run_compaction,
)
from normandy_core.workload import SYSTEM_PROMPT, TOOLS, generate_session  # noqa: E402

_PGSERVER_WHEELS = sys.version_info < (3, 13) and (
    platform.machine() in ("x86_64", "AMD64") or sys.platform == "darwin"
)


_SERVER_LOG: list[Path] = []  # pgserver's log file, while it runs
_OPEN_TX = "unexpected EOF on client connection with an open transaction"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A PostgreSQL server's URL (its ``postgres`` database); stopped at the end."""
    given = os.environ.get("NORMANDY_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    if not _PGSERVER_WHEELS:
        pytest.skip("pgserver has no wheel here: set NORMANDY_TEST_POSTGRES_URL")
    # pgserver keeps a lock file in the user runtime directory, read when it is imported:
    # a private one, so nothing is written to the home directory
    runtime = tempfile.mkdtemp(prefix="normandy-pg-run-")
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        import pgserver

        data = tempfile.mkdtemp(prefix="normandy-pg-")
        srv = pgserver.get_server(data, cleanup_mode="delete")
    finally:
        if old is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old
    _SERVER_LOG[:] = [srv.log]
    try:
        yield srv.get_uri()
    finally:
        _SERVER_LOG.clear()
        srv.cleanup()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


_names = itertools.count()


def _with_db(url: str, db: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = db
    host = info.pop("host", None)
    user = info.get("user") or ""
    port = f":{info['port']}" if info.get("port") else ""
    if host and str(host).startswith("/"):
        return f"postgresql://{user}@{port}/{db}?host={host}"
    return f"postgresql://{user}@{host or ''}{port}/{db}"


@pytest.fixture
def url(server: str) -> Iterator[str]:
    """A fresh, empty database on the server."""
    name = f"normandy_test_{os.getpid()}_{next(_names)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield _with_db(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


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
        assert hashlib.sha256(item.entry_json.encode()).hexdigest() == item.content_hash
    same(pg.list(limit=10**9), lite.list(limit=10**9))
    same(pg.list("s1", limit=4, offset=2), lite.list("s1", limit=4, offset=2))
    same(pg.list("s1", limit=-1, offset=-5), lite.list("s1", limit=10**9, offset=0))
    assert [i.entry for i in pg.list("s1", limit=4, offset=2)] == entries[2:6]
    assert pg.list("s1")[0].archived_at == 1000.0

    comps, lite_comps = pg.compactions(limit=100), lite.compactions(limit=100)
    strip = [(c.session_id, c.compactor, c.strategy, c.model, c.mid_round) for c in comps]
    assert strip == [
        (c.session_id, c.compactor, c.strategy, c.model, c.mid_round) for c in lite_comps
    ]
    # PostgreSQL counts every entry a compaction reported; SQLite (since its schema 2)
    # only the content it had not stored before: the two differ where content repeats.
    assert [c.tokens_before for c in comps] == [c.tokens_before for c in lite_comps]
    assert sorted(c.entry_count for c in comps) == [1, 3, 12, 14]
    assert comps[0].created_at == 1000.0 and comps[1].tokens_before == 9
    assert [c.compaction_id for c in pg.compactions("s2")] == [comps[-1].compaction_id]


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
        assert conn.execute("SELECT version FROM normandy.schema_version").fetchall() == [(1,)]
        conn.execute("INSERT INTO normandy.schema_version (version) VALUES (2)")
    for fresh in (
        PostgresArchive(url).list,
        lambda: PostgresArchive(url).record([], session_id="s"),
    ):
        with pytest.raises(PostgresArchiveError, match="version 2"):
            fresh()


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
    assert archive.count() == 2 * len(entries)
    assert len(archive.compactions()) == 6


def test_idempotent_rewrites(url):
    archive = PostgresArchive(url)
    entries = list(generate_session(5, 20))
    cid = archive.record(entries, session_id="s", compactor="x")
    assert archive.record(entries, session_id="s", compaction_id=cid, compactor="y") == cid
    assert archive.count() == len(entries) and len(archive.compactions()) == 1
    assert archive.compactions()[0].compactor == "x"  # the first write stands
    archive.record([*entries, *entries], session_id="s")  # nothing new, duplicates in one call
    assert archive.count() == len(entries) and len(archive.compactions()) == 2
    archive.record(entries[:3], session_id="other")  # sessions are apart
    assert archive.count("other") == 3


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
    archive.record([docs[0].model_copy(update={"id": "a2"})], session_id="s2")
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
    expected: set[tuple[str, str, str]] = set()
    first_seen: dict[tuple[str, str], str] = {}
    for session_id, session_metas in metas.items():
        for meta in session_metas:
            for e in meta["dropped"]:
                data = e.model_dump_json()
                digest = hashlib.sha256(data.encode()).hexdigest()
                expected.add((session_id, e.id, digest))
                first_seen.setdefault((session_id, e.id), data)
                match = [v for v in archive.versions(e.id, session_id) if v.entry_json == data]
                assert len(match) == 1 and match[0].entry == e
    for (session_id, entry_id), data in first_seen.items():
        assert archive.recall(entry_id, session_id).model_dump_json() == data
    # clear_tool_results reported originals; window_manager later dropped cleared versions
    assert archive.count(acc2.session_id) > len({k for k in first_seen if k[0] == acc2.session_id})
    assert archive.count() == len(expected)
    records = archive.compactions(limit=10**6)
    assert len(records) == sum(len(m) for m in metas.values())
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


def test_archive_commands_against_postgres(url, monkeypatch, capsys, tmp_path):
    from normandy_archive import main
    from normandy_core.cli import main as normandy

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


AGENT = textwrap.dedent(
    """
    import hashlib, json, sys
    from normandy_core import AgentConfig, get_counter, run_compaction
    from normandy_core.workload import SYSTEM_PROMPT, TOOLS, generate_session
    tag, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    window, reserved = 20_000, 1_000
    acc = AgentConfig(
        model="claude-sonnet-4-5", system_prompt=SYSTEM_PROMPT, tools=TOOLS,
        compactor="window_manager", session_id=tag,
        compactor_opts={"context_window": window, "reserved_tokens": reserved,
                        "trigger": 0.9, "target": 0.5, "counter": "cl100k_base"},
    )
    counter = get_counter("cl100k_base")
    for e in generate_session(seed, n):
        acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
        if e.role == "user" and e.tool_results:
            if acc.memory.tokens(counter) + acc.prompt_tokens > 0.85 * (window - reserved):
                print("begin", flush=True)  # this boundary is about to compact
            acc, meta = run_compaction(acc, mid_round=True)
            assert "error" not in meta and "hook_errors" not in meta, meta
            if meta["compacted"]:
                done = [[d.id, hashlib.sha256(d.model_dump_json().encode()).hexdigest()]
                        for d in meta["dropped"]]
                print(json.dumps(done), flush=True)
    print("end", flush=True)
    """
)


def _agent(url: str, tag: str, seed: int, messages: int) -> subprocess.Popen[str]:
    env = {**os.environ, "NORMANDY_ARCHIVE_URL": url, "NORMANDY_ARCHIVE_PATH": os.devnull}
    return subprocess.Popen(
        [sys.executable, "-c", AGENT, tag, str(seed), str(messages)],
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PGAPPNAME": tag},  # its connection, in pg_stat_activity
    )


def _kill_9(
    url: str, proc: subprocess.Popen[str], tag: str, how: str, rng: random.Random
) -> list[str]:
    """SIGKILL ``proc`` in a compaction after its first one to three; return its lines.

    ``how`` is ``"delay"`` (a random delay after a compaction begins: one takes 20-30 ms
    here) or ``"transaction"`` (as soon as its archive transaction is seen open).
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
            elif conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s "
                "AND state <> 'idle' AND query LIKE 'INSERT%%'",
                [tag],
            ).fetchone():
                break
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    reader.join(timeout=60)
    return lines


def test_three_writers_at_once_and_kill_9_at_random_moments(url):
    seed = int(os.environ.get("NORMANDY_TEST_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    outputs: dict[str, list[str]] = {}
    survivors = {f"alive-{k}": _agent(url, f"alive-{k}", 40 + k, 1000) for k in range(2)}
    killed: list[str] = []
    overlapped = 0  # kills while both other writers were still writing
    log = _SERVER_LOG[0] if _SERVER_LOG else None
    open_before = log.read_text(errors="replace").count(_OPEN_TX) if log else 0
    for k, how in enumerate(["delay", "transaction", "delay", "transaction"]):
        tag = f"killed-{k}"
        killed.append(tag)
        proc = _agent(url, tag, 30 + k, 400)  # the third writer, again and again
        outputs[tag] = _kill_9(url, proc, tag, how, rng)
        overlapped += all(p.poll() is None for p in survivors.values())
        assert proc.returncode == -signal.SIGKILL, (seed, tag)
        assert "end" not in outputs[tag], (seed, tag)
    for tag, p in survivors.items():
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, (seed, tag)
        outputs[tag] = out.splitlines()
        assert outputs[tag][-1] == "end"
    assert len(killed) == 4 and overlapped >= 3, (seed, overlapped)

    archive = PostgresArchive(url)
    with psycopg.connect(url) as conn:
        partial = conn.execute(
            "SELECT c.session_id, c.compaction_id, c.entry_count, count(e.seq) "
            "FROM normandy.compactions c LEFT JOIN normandy.entries e "
            "ON e.compaction_id = c.compaction_id GROUP BY c.compaction_id "
            "HAVING count(e.seq) <> c.entry_count"
        ).fetchall()
    # window_manager drops an entry once per session: every compaction has all its entries
    assert partial == [], seed
    landed = 0
    for tag, lines in outputs.items():
        completed = [json.loads(line) for line in lines if line.startswith("[")]
        assert completed, (seed, tag)
        expected = {(eid, digest) for done in completed for eid, digest in done}
        for eid, digest in expected:
            match = [v for v in archive.versions(eid, tag) if v.content_hash == digest]
            assert len(match) == 1, (seed, tag, eid)
            data = match[0].entry_json
            assert hashlib.sha256(data.encode()).hexdigest() == digest
            assert match[0].entry.model_dump_json() == data  # recalled byte for byte
        recorded = len(archive.compactions(tag, limit=10**6))
        if tag in survivors:
            assert archive.count(tag) == len(expected) and recorded == len(completed)
        else:  # the compaction killed is there whole or not at all
            assert recorded in (len(completed), len(completed) + 1), (seed, tag)
            assert archive.count(tag) >= len(expected)
            landed += recorded - len(completed)
    in_tx = log.read_text(errors="replace").count(_OPEN_TX) - open_before if log else None
    print(
        f"seed {seed}: {len(killed)} writers killed, {in_tx} inside an open transaction, "
        f"{landed} after their last compaction committed; {archive.count()} versions archived"
    )
    if in_tx is not None:
        assert in_tx >= 1, seed  # the server saw a writer vanish mid-transaction


def test_prune_removes_the_oldest_sessions_first(url):
    archive = PostgresArchive(url)
    entries = list(generate_session(6, 30))
    archive.record(entries[:10], session_id="old", at=1000.0)
    archive.record(entries[10:14], session_id="old", at=1500.0)
    archive.record(entries[:8], session_id="older-start", at=900.0)
    archive.record(entries[8:9], session_id="older-start", at=2000.0)  # active later
    archive.record(entries[:5], session_id="new")
    assert archive.prune() == 0
    assert archive.prune(max_sessions=2, dry_run=True) == 14
    assert archive.count() == 14 + 9 + 5  # a dry run removes nothing
    assert archive.prune(max_sessions=2) == 14
    assert archive.count("old") == 0 and archive.compactions("old") == []
    assert archive.prune(max_age_seconds=3600, dry_run=True) == 9
    assert archive.prune(max_age_seconds=3600) == 9
    assert archive.count() == 5 and [c.session_id for c in archive.compactions()] == ["new"]
    assert archive.prune(max_age_seconds=3600, max_sessions=1) == 0
    assert archive.prune(max_sessions=0) == 5 and archive.count() == 0
    with pytest.raises(ValueError, match="max_sessions"):
        archive.prune(max_sessions=-1)


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
        # a writer granted SELECT and INSERT is enough (identity columns need no grant)
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

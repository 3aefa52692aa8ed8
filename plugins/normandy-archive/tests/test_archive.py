"""The archive hook, installed for real: compactions archived, recalled byte for byte."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from archive_helpers import python

from normandy_archive import (
    Archive,
    ArchiveBackend,
    ArchiveConfigError,
    ArchiveError,
    archive_path,
    archive_settings,
    configure,
    current_settings,
    main,
    open_archive,
    register_cli,
    set_archive_path,
)
from normandy_archive.backend import BACKENDS_GROUP
from normandy_archive.schema import content_hash, source_ids
from normandy_core import AgentConfig, AgentMemory, Entry, compact, list_plugins, run_compaction
from normandy_core.app.cli import main as normandy_main
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session
from normandy_core.transcripts.chat import to_openai


@pytest.fixture
def path(tmp_path, monkeypatch):
    p = tmp_path / "data" / "normandy" / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(p))
    return p


def grow(acc: AgentConfig, session: AgentMemory, metas: list) -> AgentConfig:
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


READER = textwrap.dedent(
    """
    import json, os, sys, time
    from normandy_archive import Archive
    from normandy_archive.schema import content_hash
    path, ready, stop = sys.argv[1:4]
    archive = Archive(path)
    open(ready, "w").close()
    counts, reads = set(), 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = os.path.exists(stop)
        items = archive.list(limit=10**9)
        reads += 1
        for item in items:
            assert item.entry.model_dump_json() == item.entry_json
            assert content_hash(item.entry) == item.content_hash
        counts.add(len(items))
        time.sleep(0.01)
        if done:
            break
    final = sorted([i.session_id, i.entry.id, i.content_hash] for i in items)
    print(json.dumps({"reads": reads, "counts": sorted(counts), "final": final}))
    """
)


@pytest.mark.slow
def test_long_sessions_compacted_many_times_are_recalled_byte_for_byte(path, tmp_path):
    assert ("archive", "loaded") in {(r.name, r.status) for r in list_plugins()}
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path), str(ready), str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert reader.poll() is None and time.monotonic() - t0 < 60
            time.sleep(0.01)
        metas: dict[str, list] = {}
        wm = {"context_window": 30_000, "trigger": 0.9, "target": 0.5, "counter": "cl100k_base"}
        acc = config("window_manager", wm)
        metas[acc.session_id] = []
        grow(acc, generate_session(21, 500), metas[acc.session_id])
        steps = [
            {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 20_000, "keep": 4}},
            {"compactor": "window_manager", "opts": wm},
        ]
        acc2 = config("pipeline", {"steps": steps, "counter": "cl100k_base"})
        metas[acc2.session_id] = []
        grow(acc2, generate_session(22, 500), metas[acc2.session_id])
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=120)
    assert reader.returncode == 0
    assert len(metas[acc.session_id]) >= 5 and len(metas[acc2.session_id]) >= 5

    archive = Archive(path)
    stored = {item.content_hash: item for item in archive.list(limit=10**9)}
    first: dict[str, tuple[str, Entry]] = {}  # content hash -> (session, first dropped)
    storing = 0  # compactions that dropped content not archived before
    for session_id, session_metas in metas.items():
        for meta in session_metas:
            new = {content_hash(e) for e in meta["dropped"]} - set(first)
            storing += bool(new)
            for e in meta["dropped"]:
                first.setdefault(content_hash(e), (session_id, e))
    for digest, (session_id, e) in first.items():
        item = stored[digest]  # every dropped content is archived, once, byte for byte
        assert item.entry_json == e.model_dump_json() and item.entry == e
        assert item.session_id == session_id and item.source_ids == tuple(source_ids(e))
        assert archive.recall(e.id, session_id) is not None
    assert set(stored) == set(first)
    # clear_tool_results reported originals; window_manager later dropped cleared versions
    ids2 = {e.id for s, e in first.values() if s == acc2.session_id}
    assert archive.count(acc2.session_id) > len(ids2)
    assert len(archive.compactions(limit=10**6)) == storing
    expected = {(item.session_id, item.entry.id, digest) for digest, item in stored.items()}

    # the second process read while the first wrote, and saw the same archive at the end
    report = json.loads(out)
    print("reader:", report["reads"], "reads, counts seen:", report["counts"])
    assert len([c for c in report["counts"] if c > 0]) >= 2, report["counts"]
    assert {tuple(row) for row in report["final"]} == expected


def test_file_and_directory_are_owner_only(path):
    old = os.umask(0)
    try:
        Archive(path).record([], session_id="s")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    names = {p.name for p in path.parent.iterdir()}
    assert names >= {path.name, path.name + "-wal", path.name + "-shm"}
    for p in path.parent.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
    # an archive file someone made readable by others is refused, not taken over
    # (test_archive_owned.py): whoever could read it may hold it open already
    Archive(path).close()
    for p in path.parent.iterdir():
        p.chmod(0o644)
    with pytest.raises(ArchiveError, match="mode 0644; refusing to write"):
        Archive(path).record([], session_id="s")
    for p in path.parent.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_recall_list_search_and_duplicates(path):
    mem = generate_session(3, 30)
    entries = list(mem)
    archive = Archive()
    assert archive.path == path == archive_path()
    assert archive.list() == [] and not path.exists()  # reading never creates the file
    cid = archive.record(entries[:10], session_id="s1", compactor="x", strategy="y")
    archive.record(entries[5:15], session_id="s1", compactor="x")  # 5 already there
    assert archive.count("s1") == 15
    page = archive.list("s1", limit=4, offset=2)
    assert [i.entry for i in page] == entries[2:6]
    assert page[0].compaction_id == cid and page[0].strategy == "y"
    assert archive.recall(entries[7].id) == entries[7]
    assert archive.recall("missing") is None
    tool_entry = next(e for e in entries[:15] if e.tool_uses)
    name = tool_entry.tool_uses[0].name
    hits = archive.search(name, session_id="s1")
    assert tool_entry.id in [h.entry.id for h in hits]
    assert archive.search("src/ def") and archive.search('"unbalanced') == []
    assert archive.search("zzzznotthere") == []


def test_set_archive_path_wins_over_the_environment(path, tmp_path):
    other = tmp_path / "other.sqlite3"
    set_archive_path(other)
    try:
        assert archive_path() == other
    finally:
        set_archive_path(None)
    assert archive_path() == path


def test_a_write_failure_refuses_the_compaction_or_is_reported_in_hook_errors(
    tmp_path, monkeypatch
):
    blocker = tmp_path / "a-directory"
    blocker.mkdir()
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(blocker))
    acc = config("window_manager", {"context_window": 20_000}).with_memory(
        generate_session(4, 150, end_mid_round=True)
    )
    out, meta = run_compaction(acc, mid_round=True)  # required (the default): refused
    assert out is acc and meta["compacted"] is False
    assert "is not a regular file" in meta["error"] and "conversation is kept" in meta["error"]
    monkeypatch.setenv("NORMANDY_ARCHIVE_REQUIRED", "0")  # best effort: it stands, reported
    out, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True
    (err,) = meta["hook_errors"]
    assert err["hook"] == "normandy_core.hooks:archive"
    assert f"{len(meta['dropped'])} dropped entries were NOT archived" in err["error"]


def test_settings_per_call_in_code_environment_and_off(path, tmp_path, monkeypatch):
    assert current_settings() == current_settings()
    s = current_settings()
    assert (s.path, s.required, s.busy_timeout, s.source) == (
        path,
        True,
        5.0,
        "NORMANDY_ARCHIVE_PATH",
    )
    monkeypatch.setenv("NORMANDY_ARCHIVE_REQUIRED", "no")
    monkeypatch.setenv("NORMANDY_ARCHIVE_BUSY_TIMEOUT", "0.25")
    assert (current_settings().required, current_settings().busy_timeout) == (False, 0.25)
    other = tmp_path / "other.sqlite3"
    configure(path=other, required=True)
    try:
        assert (current_settings().path, current_settings().required) == (other, True)
        with archive_settings(path="off") as inside:
            assert inside.off and inside.source == "per call"
            with pytest.raises(ArchiveError, match="the archive is off"):
                archive_path()
            with archive_settings(required=False):  # nested: the outer path still holds
                assert current_settings().off and not current_settings().required
        assert current_settings().path == other
    finally:
        configure(path=None, required=None)
    assert current_settings().path == path and not current_settings().required
    for bad in ({"required": "maybe"}, {"busy_timeout": -1}, {"colour": "red"}):
        with pytest.raises(ArchiveConfigError):
            configure(**bad)
    assert current_settings().sync == "normal"
    monkeypatch.setenv("NORMANDY_ARCHIVE_SYNC", "FULL")
    assert current_settings().sync == "full" and Archive(path).sync == "full"
    with pytest.raises(ValueError, match="sync must be"):
        Archive(path, sync="sometimes")
    monkeypatch.setenv("NORMANDY_ARCHIVE_BUSY_TIMEOUT", "soon")
    with pytest.raises(ArchiveConfigError, match="NORMANDY_ARCHIVE_BUSY_TIMEOUT"):
        current_settings()


def test_settings_follow_every_change(tmp_path, monkeypatch):
    """current_settings() follows every change of what it reads: the per-call settings,
    configure(), and each environment variable (the default path's HOME and XDG_DATA_HOME
    too)."""
    for name in ("NORMANDY_ARCHIVE_PATH", "NORMANDY_ARCHIVE_URL", "NORMANDY_ARCHIVE_SESSION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "one"))
    first = current_settings()
    assert current_settings() == first  # nothing changed: the same settings
    assert first.path == tmp_path / "one" / "normandy" / "archive.sqlite3"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "two"))
    assert current_settings().path == tmp_path / "two" / "normandy" / "archive.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert current_settings().path == tmp_path / "home" / ".local/share/normandy/archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_SESSION", "agent-7")
    assert current_settings().session == "agent-7"
    configure(session="set-in-code")
    try:
        assert current_settings().session == "set-in-code"
        with archive_settings(session="per-call"):
            assert current_settings().session == "per-call"
            with archive_settings(session="inner"):
                assert current_settings().session == "inner"
            assert current_settings().session == "per-call"
        assert current_settings().session == "set-in-code"
    finally:
        configure(session=None)
    assert current_settings().session == "agent-7"
    monkeypatch.setenv("NORMANDY_ARCHIVE_BUSY_TIMEOUT", "soon")
    with pytest.raises(ArchiveConfigError, match="NORMANDY_ARCHIVE_BUSY_TIMEOUT"):
        current_settings()  # a bad value is refused at every call, never remembered
    with pytest.raises(ArchiveConfigError, match="NORMANDY_ARCHIVE_BUSY_TIMEOUT"):
        current_settings()


def test_the_background_writer_serializes_ahead_then_indexes(path):
    """Entries the next compaction may drop are serialized by the background writer, and
    what was committed is indexed by it."""
    from normandy_archive import base, maintenance

    entries = list(generate_session(12, 40))
    archive = Archive(path)
    archive.record(entries[:2], session_id="s", index=False)
    assert _indexed(path) == 0
    maintenance.schedule(archive, None, entries[2:40])
    assert maintenance.drain(30)
    assert all(base._prepared.get(id(e), (None,))[0] is e for e in entries[2:40])
    assert archive.count("s") == 2 and _indexed(path) == 2
    archive.close()


def _indexed(path) -> int:
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT value FROM archive_state WHERE key = 'indexed_seq'").fetchone()[
            0
        ]
    finally:
        conn.close()


def test_off_archives_nothing_and_a_bad_setting_refuses(path, monkeypatch):
    acc = config("window_manager", {"context_window": 20_000}).with_memory(
        generate_session(4, 150, end_mid_round=True)
    )
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", "off")
    _, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] and "hook_errors" not in meta
    assert not path.parent.exists()
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    monkeypatch.setenv("NORMANDY_ARCHIVE_REQUIRED", "perhaps")
    out, meta = run_compaction(acc, mid_round=True)  # a bad setting fails closed
    assert out is acc and not meta["compacted"] and "NORMANDY_ARCHIVE_REQUIRED" in meta["error"]


def test_open_archive_sqlite_postgres_url_and_off(path, monkeypatch):
    archive = open_archive()
    assert isinstance(archive, Archive) and isinstance(archive, ArchiveBackend)
    assert archive.location == str(path)
    assert open_archive(path).location == str(path) == open_archive(str(path)).location
    from importlib.metadata import entry_points

    if not entry_points(group=BACKENDS_GROUP, name="postgresql"):  # no backend installed
        with pytest.raises(ArchiveError, match=r"pip install normandy-archive-postgres"):
            open_archive("postgresql://agent@db.example/archive")
        monkeypatch.setenv("NORMANDY_ARCHIVE_URL", "postgresql://agent@db.example/archive")
        assert current_settings().url == "postgresql://agent@db.example/archive"
        with pytest.raises(ArchiveError, match="no archive backend 'postgresql'"):
            open_archive()
        acc = config("window_manager", {"context_window": 20_000}).with_memory(
            generate_session(4, 150, end_mid_round=True)
        )
        out, meta = run_compaction(acc, mid_round=True)  # required: refused, named
        assert out is acc and "normandy-archive-postgres" in meta["error"]
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", "postgresql://agent@db.example/archive")
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", "off")  # off wins over the URL
    assert current_settings().off
    with pytest.raises(ArchiveError, match="off"):
        open_archive()
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", "mysql://x")
    with pytest.raises(ArchiveConfigError, match="NORMANDY_ARCHIVE_URL"):
        current_settings()


@pytest.mark.slow
def test_cli_list_show_search(path, capsys):
    entries = list(generate_session(5, 20))
    Archive().record(entries, session_id="sess-1", compactor="window_manager")
    assert main(["list", "--limit", "3"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:2] == ["SEQ", "ARCHIVED"]
    assert len(lines) == 3 and entries[0].id in lines[0]
    assert main(["--path", str(path), "show", entries[4].id]) == 0
    assert capsys.readouterr().out == entries[4].model_dump_json() + "\n"
    assert main(["search", "--json", entries[1].text().split()[0]]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert entries[1].id in [r["entry_id"] for r in rows]
    assert main(["show", "nope"]) == 1

    parser = argparse.ArgumentParser(prog="normandy")
    register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["archive", "list", "--session", "sess-1", "--json"])
    assert args.func(args) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(entries)

    done = subprocess.run(
        [sys.executable, "-m", "normandy_archive", "--path", str(path), "show", entries[0].id],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == entries[0].model_dump_json() + "\n"


WRITER = textwrap.dedent(
    """
    import sys
    from normandy_archive import Archive, maintenance
    from normandy_core import Entry
    from normandy_core.app.workload import generate_session
    path, tag, rounds, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    background = sys.argv[5] == "background"  # as the hook writes: index afterwards
    entries = list(generate_session(1, size))
    archive = Archive(path)
    for i in range(rounds):  # content of its own for every round of every writer
        batch = [
            Entry(id=f"{tag}-{i}-{e.id}", role="user",
                  content=f"marker{tag}round{i} {n} {e.text()}")
            for n, e in enumerate(entries[:size])
        ]
        cid = archive.record(batch, session_id=tag, compactor="test", index=not background)
        if background:
            maintenance.schedule(archive)
        print(cid, flush=True)
    """
)


def _marked(archive: Archive, tag: str, rounds: int) -> list[int]:
    """How many entries a search finds for each round's marker word."""
    return [len(archive.search(f"marker{tag}round{i}", limit=1000)) for i in range(rounds)]


def _fully_indexed(path) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        indexed = conn.execute("SELECT value FROM archive_state WHERE key = 'indexed_seq'")
        top = conn.execute("SELECT max(seq) FROM entries").fetchone()[0]
        assert indexed.fetchone()[0] == top
        conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('integrity-check')")
    finally:
        conn.close()


@pytest.mark.slow
def test_several_processes_archive_at_once_and_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite3"
    modes = ["background", "background", "inline"]  # the hook's way, and indexed at once
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"w{n}", "10", "8", mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n, mode in enumerate(modes)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    archive = Archive(path)
    for n, out in enumerate(outs):
        assert len(out.split()) == 10
        assert archive.count(f"w{n}") == 10 * 8
        assert _marked(archive, f"w{n}", 10) == [8] * 10  # each round found, whole, once
    assert len(archive.compactions(limit=1000)) == 30
    _fully_indexed(path)  # the background writers were drained at exit


@pytest.mark.slow
def test_sigkill_while_writing_leaves_every_completed_compaction(tmp_path):
    import signal
    import sqlite3

    path = tmp_path / "killed.sqlite3"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), "k", "100000", "120", "background"],
        stdout=subprocess.PIPE,
        text=True,
    )
    done = [child.stdout.readline().strip() for _ in range(5)]
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute(
            "SELECT c.compaction_id, c.entry_count, count(e.seq) FROM compactions c "
            "LEFT JOIN entries e ON e.compaction_id = c.compaction_id GROUP BY c.compaction_id"
        ).fetchall()
    finally:
        conn.close()
    # all or nothing: every compaction that is there has all its entries
    assert all(expected == found for _, expected, found in rows)
    assert set(done) <= {cid for cid, _, _ in rows}
    archive = Archive(path)
    for item in archive.list("k", limit=10**6):
        assert item.entry.model_dump_json() == item.entry_json
    # what the background writer had not indexed when it was killed is found all the same
    rounds = len(rows)
    assert _marked(archive, "k", rounds) == [120] * rounds
    archive.index()  # the next writer indexes what was left
    _fully_indexed(path)
    assert _marked(archive, "k", rounds) == [120] * rounds


def test_search_finds_what_is_not_indexed_yet(path):
    entries = list(generate_session(8, 40))
    archive = Archive(path)
    archive.record(entries[:20], session_id="s", index=True)
    archive.record(entries[20:], session_id="s", index=False)  # as a killed process left it
    late = next(e for e in entries[20:] if e.role == "user" and isinstance(e.content, str))
    word = max(late.text().split(), key=len).strip(".,")
    assert late.id in {h.entry.id for h in archive.search(word, limit=100)}
    raw = archive.search(f'"{word}"', raw=True, limit=100)  # raw FTS5 sees the index only
    assert late.id not in {h.entry.id for h in raw}
    tool = next(e for e in entries[20:] if e.tool_uses)  # its caller ids are found too
    assert tool.id in {i.entry.id for i in archive.by_source_id(tool.tool_uses[0].id)}
    assert archive.index() == len(entries) - 20
    assert tool.id in {i.entry.id for i in archive.by_source_id(tool.tool_uses[0].id)}
    assert late.id in {h.entry.id for h in archive.search(f'"{word}"', raw=True, limit=100)}


def test_compact_and_the_command_say_where_the_dropped_content_went(path, tmp_path, capsys):
    messages = to_openai(generate_session(7, 120))
    result = compact(messages, window=20_000)
    note = result.note("archive")
    assert result.compacted and note is not None
    assert note["path"] == str(path) and note["entries"] == len(result.dropped)
    assert Archive(path).count(note["session"]) == len(result.dropped)
    other = tmp_path / "per-call.sqlite3"
    # (fresh: the same list again would be compacted as a continuation, dropping nothing new)
    with archive_settings(path=other):  # per call
        assert compact(messages, window=20_000, fresh=True).note("archive")["path"] == str(other)
    with archive_settings(path="off"):  # explicitly off: said so, nothing written
        off = compact(messages, window=20_000, fresh=True).note("archive")
    assert off["path"] is None and "not archived: the archive is off" in off["message"]

    source = tmp_path / "chat.json"
    source.write_text(json.dumps(messages))
    args = ["compact", str(source), "--window", "20000", "-o", str(tmp_path / "out.json")]
    assert normandy_main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[1].startswith("normandy compact: ")
    assert f"dropped entries archived to {path} (0 new, " in lines[1]  # stored before
    with archive_settings(path="off"):
        assert normandy_main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    assert "not archived: the archive is off (set by per call)" in lines[1]


FORK = textwrap.dedent(
    """
    import os, sys, threading, time
    from normandy_archive import Archive
    from normandy_core.app.workload import generate_session
    entries = list(generate_session(9, 10))
    archive = Archive(sys.argv[1], timeout=1.0)
    archive.record(entries[:3], session_id="parent")
    held = threading.Event()

    def hold():  # another thread is writing when the process forks
        with archive._write_lock:
            held.set()
            time.sleep(3)

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        try:
            archive.record(entries[3:], session_id="child")
        except BaseException as exc:
            print("child failed:", exc, flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_while_another_thread_writes_can_write(tmp_path):
    path = tmp_path / "forked.sqlite3"
    done = python(FORK, str(path), check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("child 0"), done
    assert Archive(path).count("child") == len(list(generate_session(9, 10))) - 3


def test_entries_serialized_ahead_of_time_are_stored_byte_for_byte(path):
    from normandy_archive import base, store

    entries = list(generate_session(10, 30))
    assert store.prepare(entries[:20]) == 20 and store.prepare(entries[:20]) == 0
    archive = Archive(path)
    archive.record(entries, session_id="s")  # 20 prepared, the rest serialized now
    assert not {id(e) for e in entries} & set(base._prepared)  # used up
    assert base._prepared_bytes[0] == sum(len(x[1]) for x in base._prepared.values())
    stored = {item.entry.id: item for item in archive.list("s", limit=100)}
    for e in entries:
        item = stored[e.id]
        assert item.entry_json == e.model_dump_json() and item.content_hash == content_hash(e)

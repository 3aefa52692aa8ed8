"""Reading the archive: read-only, never a schema, never another application's file.

``list``, ``show`` and ``search`` (and ``Archive``'s read methods) open the database with
``mode=ro``: no schema is created or migrated, the journal mode is never switched. A file
that is not a Normandy archive is refused with a clear message, and so is a symbolic link
at the archive path, for reading and for writing. Every bad query or option is exit 2
with one line on stderr, from both console scripts (``normandy archive`` and
``normandy-archive``), which are run here in process (their ``main``) and, for one case
of each kind, as the installed scripts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from archive_helpers import DROP_DAC, config
from reliability_counts import (
    ARCHIVE_SCRIPTS,
    BAD_NUMBERS,
    FOREIGN_FILES,
    FTS_RAW_ERRORS,
    ODD_QUERIES,
    SYMLINKS,
)

from normandy_archive import Archive, NotAnArchiveError, main as archive_main
from normandy_core import run_compaction
from normandy_core.app.cli import main as normandy_main
from normandy_core.app.workload import generate_session

SCRIPTS = {
    "normandy archive": Path(sys.executable).parent / "normandy",
    "normandy-archive": Path(sys.executable).parent / "normandy-archive",
}


ENTRIES = list(generate_session(61, 40))


@pytest.fixture
def archive_file(tmp_path, monkeypatch):
    path = tmp_path / "data" / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    entries = ENTRIES
    archive = Archive(path)
    archive.record(entries, session_id="s1", compactor="window_manager")
    archive.close()
    return path


def _cli(script: str, args: list[str], capsys) -> tuple[int, str, str]:
    """Run one of the two commands in process: exit status, stdout, stderr."""
    if script == "normandy archive":
        status = normandy_main(["archive", *args])
    else:
        status = archive_main(args)
    out, err = capsys.readouterr()
    return status, out, err


def _one_line(err: str, prog: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(prog), err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def _snapshot(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file() and not p.is_symlink()
    }


def _compaction_refused(path: Path, monkeypatch) -> str:
    """A compaction against ``path`` as the archive: refused, the conversation kept."""
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    acc = config("reads").with_memory(generate_session(62, 150, end_mid_round=True))
    before = [e.model_dump_json() for e in acc.memory]
    out, meta = run_compaction(acc, mid_round=True)
    assert out is acc and meta["compacted"] is False
    assert [e.model_dump_json() for e in out.memory] == before  # nothing lost
    return str(meta["error"])


# -- reading writes nothing ----------------------------------------------------------------


def test_reading_writes_nothing(archive_file, capsys):
    directory = archive_file.parent
    conn = sqlite3.connect(archive_file)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = _snapshot(directory)
    archive = Archive(archive_file)
    assert archive.count() == len(ENTRIES) and len(archive.list(limit=5)) == 5
    assert archive.search("def") and archive.compactions() and archive.versions("e61-0000003")
    for script in ARCHIVE_SCRIPTS:
        for args in (["list"], ["search", "def"], ["show", "e61-0000003"]):
            assert _cli(script, args, capsys)[0] == 0
    archive.close()
    after = _snapshot(directory)
    assert {k: v for k, v in after.items() if not k.endswith(("-wal", "-shm"))} == {
        k: v for k, v in before.items() if not k.endswith(("-wal", "-shm"))
    }


# -- another application's file -----------------------------------------------------------


def _foreign(tmp_path: Path, kind: str) -> Path:
    """Another application's file, owner-only (one others may open is refused for that
    alone: test_archive_owned.py)."""
    path = tmp_path / "foreign" / "app.db"
    path.parent.mkdir()
    path.touch(mode=0o600)
    if kind == "text":
        path.write_text("not a database at all\n" * 100)
        return path
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 42")
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('keep me')")
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("kind", FOREIGN_FILES)
def test_a_foreign_file_is_refused_and_left_untouched(tmp_path, monkeypatch, capsys, kind):
    path = _foreign(tmp_path, kind)
    before = _snapshot(path.parent)
    for script in ARCHIVE_SCRIPTS:
        for args in (["list"], ["search", "keep"], ["show", "x"]):
            status, out, err = _cli(script, ["--path", str(path), *args], capsys)
            line = _one_line(err, script)
            assert status == 2 and out == "" and "is not a Normandy archive" in line, line
    with pytest.raises(NotAnArchiveError):
        Archive(path).list()
    error = _compaction_refused(path, monkeypatch)  # the hook never writes into it either
    assert "is not a Normandy archive" in error
    assert _snapshot(path.parent) == before  # no byte changed, no -wal or -shm made
    if kind == "sqlite":
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 42
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        tables = conn.execute("SELECT name FROM sqlite_master").fetchall()
        assert tables == [("notes",)]
        conn.close()


# -- symbolic links ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", SYMLINKS)
def test_a_symlink_at_the_archive_path_is_refused(
    tmp_path, archive_file, monkeypatch, capsys, kind
):
    target = archive_file if kind == "to an archive" else tmp_path / "elsewhere" / "a.sqlite3"
    link = tmp_path / "link" / "archive.sqlite3"
    link.parent.mkdir()
    link.symlink_to(target)
    for script in ARCHIVE_SCRIPTS:
        status, _, err = _cli(script, ["--path", str(link), "list"], capsys)
        assert status == 2 and "symbolic link" in _one_line(err, script)
    error = _compaction_refused(link, monkeypatch)
    assert "symbolic link" in error
    if kind == "dangling":
        assert not target.exists() and not target.parent.exists()  # nothing created there
    else:
        assert Archive(archive_file).count() == len(ENTRIES)  # the archive behind it untouched


# -- a read-only archive -------------------------------------------------------------------

READER = textwrap.dedent(
    """
    import json, sys
    exec(sys.argv[2])
    from normandy_archive import Archive
    from normandy_archive import main
    archive = Archive(sys.argv[1])
    status = main(["--path", sys.argv[1], "search", "def"])
    print(json.dumps({"count": archive.count(), "listed": len(archive.list(limit=1000)),
                      "status": status}))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("directory_mode", [0o755, 0o555])
def test_a_read_only_archive_can_be_read(archive_file, directory_mode):
    directory = archive_file.parent
    conn = sqlite3.connect(archive_file)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    archive_file.chmod(0o444)
    directory.chmod(directory_mode)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", READER, str(archive_file), DROP_DAC],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        directory.chmod(0o700)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report == {"count": len(ENTRIES), "listed": len(ENTRIES), "status": 0}


# -- bad queries and options ---------------------------------------------------------------


def test_bad_queries_and_options_exit_2_with_one_line(archive_file, tmp_path, capsys):
    for script in ARCHIVE_SCRIPTS:
        for query in FTS_RAW_ERRORS:
            status, out, err = _cli(script, ["search", "--raw", "--", query], capsys)
            line = _one_line(err, f"{script} search")
            assert status == 2 and out == "" and "bad full-text query" in line, (query, line)
        for query in ODD_QUERIES:  # taken literally without --raw: never an error
            status, out, err = _cli(script, ["search", "--", query], capsys)
            # no error; at most the one line saying why nothing matched (issue 33 item 6)
            assert status == 0, (query, err)
            assert err == "" or "no archived entry" in _one_line(err, f"{script} search")
        for number in BAD_NUMBERS:
            for cmd, option in (("list", "--limit"), ("search", "--offset")):
                extra = ["x"] if cmd == "search" else []
                status, out, err = _cli(script, [cmd, *extra, f"{option}={number}"], capsys)
                line = _one_line(err, f"{script} {cmd}")
                assert status == 2 and option in line, line
        missing = tmp_path / "missing" / "archive.sqlite3"
        for args in (["list"], ["search", "x"], ["show", "x"]):
            status, out, err = _cli(script, ["--path", str(missing), *args], capsys)
            assert status == 2 and "no archive at" in _one_line(err, script)
        assert not missing.parent.exists()  # reading created nothing


@pytest.mark.slow
def test_the_installed_scripts_answer_the_same(archive_file, tmp_path):
    foreign = _foreign(tmp_path, "sqlite")
    cases = [
        (["search", "--raw", FTS_RAW_ERRORS[0]], "bad full-text query"),
        (["list", "--limit", BAD_NUMBERS[0]], "--limit"),
        (["--path", str(foreign), "list"], "is not a Normandy archive"),
        (["--path", str(tmp_path / "none.sqlite3"), "list"], "no archive at"),
    ]
    env = {**os.environ, "NORMANDY_ARCHIVE_PATH": str(archive_file)}

    def run(script: str, args: list[str]) -> subprocess.CompletedProcess[str]:
        prefix = ["archive"] if script == "normandy archive" else []
        return subprocess.run(
            [str(SCRIPTS[script]), *prefix, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )

    jobs = [(script, args, want) for script in ARCHIVE_SCRIPTS for args, want in cases]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda j: run(j[0], j[1]), jobs))
    for (script, _, want), proc in zip(jobs, done, strict=True):
        line = _one_line(proc.stderr, script)
        assert proc.returncode == 2 and want in line, (script, proc.stderr)

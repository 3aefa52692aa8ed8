"""An archive the version before issue 31 left: its journal and spool files moved once.

``data/legacy-archive`` was written by that version (``make.py`` there, run with its
code) and killed before its background writer ran: two compactions are journal rows, three
are frames of its spool file, one of them dropping content of the first again under
another session. The first writer that opens it moves them all into the tables, intact,
and removes the spool file; a damaged spool file, or one others may write, is kept and
named in a warning instead of being dropped silently.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
from pathlib import Path

import pytest

from normandy_archive import Archive
from normandy_archive.legacy import spool_files
from normandy_core import Entry
from normandy_core.app.workload import generate_session

DATA = Path(__file__).parent / "data" / "legacy-archive"
ENTRIES = list(generate_session(91, 30))  # what make.py archived, the same entries


def _copy(tmp_path: Path) -> Path:
    for f in DATA.iterdir():
        if f.name.startswith("archive.sqlite3"):
            shutil.copyfile(f, tmp_path / f.name)
            (tmp_path / f.name).chmod(0o600)
    return tmp_path / "archive.sqlite3"


def _count(path: Path, table: str) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def _first_write(path: Path) -> Archive:
    archive = Archive(path)
    archive.record([Entry(id="new", role="user", content="the first new write")], session_id="n")
    return archive


def test_journal_rows_and_spool_frames_are_moved_once_intact(tmp_path):
    path = _copy(tmp_path)
    assert _count(path, "journal") == 2 and _count(path, "entries") == 0
    assert len(spool_files(path)) == 1
    archive = _first_write(path)
    assert _count(path, "journal") == 0 and spool_files(path) == []
    expected = json.loads((DATA / "expected.json").read_text())
    records = {c.compaction_id: c for c in archive.compactions(limit=100)}
    for cid, session, start, end, stored in expected:
        if stored:
            assert records[cid].session_id == session and records[cid].entry_count == stored
        for e in ENTRIES[start:end]:  # byte for byte, as dropped first
            (found,) = archive.versions(e.id)
            assert found.entry_json == e.model_dump_json()
            assert found.entry == e
    assert archive.count() == 16 + 1
    # content dropped again by another session (s2) is seen by it last, as before
    assert {a.entry.id for a in archive.list("s2", limit=100)} >= {e.id for e in ENTRIES[8:12]}
    archive.index()
    word = max(ENTRIES[13].text().split(), key=len)
    assert ENTRIES[13].id in {a.entry.id for a in archive.search(word, limit=100)}
    archive.close()
    _first_write(path).close()  # once: nothing is moved twice
    assert _count(path, "entries") == 16 + 1


def test_a_damaged_spool_file_is_kept_and_named(tmp_path, caplog):
    path = _copy(tmp_path)
    (spool,) = spool_files(path)
    data = bytearray(spool.read_bytes())
    data[len(data) // 2] ^= 0xFF  # in the second or third frame
    spool.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="normandy_archive"):
        _first_write(path).close()
    assert spool.exists()  # kept: what is after the damage is not lost silently
    assert f"spool file {spool} is damaged after its frame" in caplog.text
    assert _count(path, "journal") == 0  # the journal and the frames before it moved


@pytest.mark.parametrize("mode", [0o664, 0o666])
def test_a_spool_file_others_may_write_is_kept_and_named(tmp_path, caplog, mode):
    path = _copy(tmp_path)
    spool = next(p for p in tmp_path.iterdir() if ".spool-" in p.name)
    spool.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="normandy_archive"):
        _first_write(path).close()
    assert spool.exists()
    assert f"spool file {spool} has mode {mode:04o}" in caplog.text

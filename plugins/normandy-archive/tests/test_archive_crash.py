"""SIGKILL in the middle of a compaction, with the archive hook installed, beside other writers.

test_archive.py kills a process inside ``Archive.record`` and runs concurrent writers
that call it directly; here whole agents compact with ``window_manager`` through the
boundary, so the hook runs for real (the durable write in the boundary, indexing in the
background writer), and two of them are killed right after a compaction began while two
others archive into the same file to the end, all under a umask of 0: the archive, its
-wal and -shm files stay owner-only. What the killed processes' background writers had
not indexed is found by searches all the same, and indexed by the next writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import threading

import pytest
from archive_helpers import CRASH_AGENT, follow, unsound
from reliability_counts import CONCURRENT_PROCESSES, KILLED_PROCESSES

from normandy_archive import Archive

# Slow: agent processes killed with SIGKILL mid-compaction (make check leaves it out).
pytestmark = pytest.mark.slow


def _start(tag: str, seed: int, messages: int, path: str) -> subprocess.Popen[str]:
    env = {**os.environ, "NORMANDY_ARCHIVE_PATH": path}
    return subprocess.Popen(
        [sys.executable, "-c", CRASH_AGENT, tag, str(seed), str(messages)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_sigkill_mid_compaction_with_concurrent_writers(tmp_path):
    path = str(tmp_path / "shared" / "archive.sqlite3")
    killed = {f"killed-{k}": _start(f"killed-{k}", 30 + k, 400, path) for k in range(2)}
    survivors = {f"alive-{k}": _start(f"alive-{k}", 40 + k, 260, path) for k in range(2)}
    assert len(killed) == KILLED_PROCESSES and len(survivors) == CONCURRENT_PROCESSES
    outputs: dict[str, list[str]] = {tag: [] for tag in killed}
    readers = [
        threading.Thread(target=follow, args=(p, outputs[tag], 2 + k, 0.004 * k))
        for k, (tag, p) in enumerate(killed.items())
    ]
    for t in readers:
        t.start()
    for tag, p in survivors.items():
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, tag
        outputs[tag] = out.splitlines()
    for t in readers:
        t.join(timeout=120)
    for tag, p in killed.items():
        assert p.returncode == -signal.SIGKILL, tag
        assert outputs[tag][-1] == "begin" and "end" not in outputs[tag]  # killed mid-compaction

    assert unsound(path) == []  # integrity ok, no compaction row without its entries

    shared = tmp_path / "shared"
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700
    assert (shared / "archive.sqlite3").exists()
    for p in shared.iterdir():  # -wal and -shm are gone once the last writer closed cleanly
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
    assert not [p for p in shared.iterdir() if ".spool" in p.name]  # no file but SQLite's

    archive = Archive(path)
    # content is stored once: the row of a content is the first compaction's that dropped it
    stored = {item.content_hash: item for item in archive.list(limit=10**9)}
    seen: dict[str, set[str]] = {}  # content hash -> hashes of the entries dropped with it
    for tag, lines in outputs.items():
        completed = [json.loads(line) for line in lines if line.startswith("[")]
        assert completed, tag
        if tag in survivors:
            assert lines[-1] == "end"
        for done in completed:
            for content, whole in done:
                seen.setdefault(content, set()).add(whole)
    for content, wholes in seen.items():  # every committed compaction is recallable
        item = stored[content]
        assert item.entry.model_dump_json() == item.entry_json  # byte for byte
        assert hashlib.sha256(item.entry_json.encode()).hexdigest() in wholes
    # nothing extra, but what a killed process committed before it could say so
    extra = {stored[c].session_id for c in set(stored) - set(seen)}
    assert extra <= set(killed), extra

    # the background writers index what was committed: the killed ones may have left rows
    # unindexed, which searches find all the same and the next writer indexes
    def found(item) -> bool:
        words = re.findall(r"[A-Za-z]{8,}", item.entry.text())
        hits = archive.search(max(words, key=len), limit=10**6) if words else [item]
        return item.seq in {h.seq for h in hits}

    sample = list(stored.values())[::7]
    assert all(found(item) for item in sample)
    archive.index()
    conn = sqlite3.connect(path)
    try:
        indexed = conn.execute("SELECT value FROM archive_state WHERE key = 'indexed_seq'")
        assert indexed.fetchone()[0] == conn.execute("SELECT max(seq) FROM entries").fetchone()[0]
        conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('integrity-check')")
    finally:
        conn.close()
    assert all(found(item) for item in sample)

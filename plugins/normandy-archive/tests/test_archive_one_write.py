"""The one write path: a compaction is one transaction into the tables, indexed later.

A compaction's data is in two states: *committed* (its rows in ``entries`` and
``compactions``, past the indexed-up-to mark) and *indexed* (full text, caller ids, first
``seen``). Between the two, every read finds it (a plain scan of the rows past the
mark); a process killed before indexing leaves it to the next writer; a child made by
``fork`` writes through a connection of its own.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from archive_helpers import digest, python
from reliability_counts import COMMIT_KILLS

from normandy_archive import Archive
from normandy_core import Entry
from normandy_core.app.workload import generate_session


def _raw(path: Path) -> dict[str, int]:
    """Rows of the tables and the indexed-up-to mark, read directly."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        found = {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("entries", "compactions", "seen")
        }
        mark = conn.execute("SELECT value FROM archive_state WHERE key = 'indexed_seq'")
        found["indexed"] = mark.fetchone()[0]
        return found
    finally:
        conn.close()


def _word(entry: Entry) -> str:
    return max(entry.text().split(), key=len).strip(".,:;()\"'")


KILLED = textwrap.dedent(
    """
    import json, sys
    from normandy_archive import Archive
    from normandy_core.app.workload import generate_session

    entries = list(generate_session(int(sys.argv[2]), 400))
    archive = Archive(sys.argv[1])
    for n in range(0, len(entries), 25):
        batch = entries[n : n + 25]
        # the boundary's write: committed into the tables, the index left to later
        cid = archive.record(batch, session_id="k", index=False)
        print(json.dumps([str(cid), [e.id for e in batch]]), flush=True)
    sys.stdin.readline()  # killed here, before any indexing
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("commits", COMMIT_KILLS)
def test_killed_between_the_commit_and_the_index_everything_is_recallable(tmp_path, commits):
    path = tmp_path / "archive.sqlite3"
    source = {e.id: e for e in generate_session(83, 400)}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(path), "83"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    done = [json.loads(child.stdout.readline()) for _ in range(commits)]
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    raw = _raw(path)
    assert raw["indexed"] == 0 and raw["compactions"] >= len(done)  # committed, not indexed

    def check(archive: Archive) -> list[tuple[int, str]]:
        committed = {cid for cid, _ in done}
        assert committed <= {c.compaction_id for c in archive.compactions(limit=1000)}
        for _, ids in done:
            for entry_id in ids:
                entry = source[entry_id]
                found = archive.by_source_id(entry.tool_uses[0].id) if entry.tool_uses else []
                found += archive.search(_word(entry), limit=1000) if entry.text().strip() else []
                found += archive.versions(entry_id)
                # stored once by content: under this id, or under the first with it
                assert digest(entry) in {digest(a.entry) for a in found}, entry_id
        listed = archive.list(limit=10**6)
        for a in listed:
            assert a.entry.model_dump_json() == a.entry_json
        return [(a.seq, a.entry_json) for a in listed]

    reader = Archive(path)
    before = check(reader)  # the rows past the mark, found by a plain scan
    writer = Archive(path)
    writer.record([Entry(id="next", role="user", content="the next agent")], session_id="n")
    writer.index()  # the next writer indexes what the killed one left
    raw = _raw(path)
    assert raw["indexed"] == raw["entries"] == len(before) + 1 == raw["seen"]
    assert check(reader)[: len(before)] == before  # the same rows, numbers and bytes
    writer.close()
    reader.close()


FORKED = textwrap.dedent(
    """
    import json, os, sys
    from normandy_archive import Archive
    from normandy_core import Entry
    path = sys.argv[1]
    archive = Archive(path)
    archive.record([Entry(id="p1", role="user", content="parent before fork")],
                   session_id="p", index=False)
    pid = os.fork()
    if pid == 0:  # the child: a connection of its own, never the parent's
        archive.record([Entry(id="c1", role="user", content="child after fork")],
                       session_id="c", index=False)
        archive.index()
        os._exit(0)
    os.waitpid(pid, 0)
    archive.record([Entry(id="p2", role="user", content="parent after fork")],
                   session_id="p", index=False)
    archive.index()
    print(json.dumps({"p": archive.count("p"), "c": archive.count("c")}))
    archive.close()
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_child_made_by_fork_writes_through_a_connection_of_its_own(tmp_path):
    path = tmp_path / "archive.sqlite3"
    out = python(FORKED, str(path)).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"p": 2, "c": 1}
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()

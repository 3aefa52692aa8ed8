"""The archive under faults: every dropped entry is archived or still in the conversation.

Each scenario replays an agent session through the boundary with the archive hook
installed for real (``window_manager``, a compaction after every tool batch) while the
archive is broken in one way, and ends with the same check: every entry the agent ever
appended is either still in its conversation or archived, byte for byte. By default the
archive is *required*: a compaction it cannot record is refused with the archive's own
error. Best-effort (``NORMANDY_ARCHIVE_REQUIRED=0``) compactions stand, and every entry
they lose is counted in ``hook_errors``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_counts import (
    DISK_FULL_LIMITS,
    LOCKED_COMPACTIONS,
    READ_ONLY_SESSIONS,
    ROTATIONS,
)

from normandy_archive import Archive, archive_settings
from normandy_core import AgentConfig, Entry, run_compaction
from normandy_core.workload import SYSTEM_PROMPT, TOOLS, generate_session

#: Run first in a subprocess as root: drop the capabilities that let root ignore file
#: permissions, so a 0444 file is read-only for it too (a no-op for other users).
DROP_DAC = textwrap.dedent(
    """
    import ctypes, os
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        class _Hdr(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        class _Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]
        hdr, data = _Hdr(0x20080522, 0), (_Data * 2)()
        if libc.capget(ctypes.byref(hdr), data) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        keep = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        data[0].effective &= keep
        data[0].permitted &= keep
        if libc.capset(ctypes.byref(hdr), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
    """
)

AGENT = textwrap.dedent(
    """
    import hashlib, json, os, sys
    cfg = json.loads(sys.argv[1])
    if cfg.get("fsize"):
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
    if cfg.get("drop_dac"):
        exec(cfg["drop_dac"])
    from normandy_core import AgentConfig, run_compaction
    from normandy_core.workload import SYSTEM_PROMPT, TOOLS, generate_session

    def h(e):  # see _digest
        data = e.without_thinking().model_dump_json(exclude={"parent_id"})
        return [e.id, hashlib.sha256(data.encode()).hexdigest()]

    acc = AgentConfig(
        model="claude-sonnet-4-5", system_prompt=SYSTEM_PROMPT, tools=TOOLS,
        compactor="window_manager", session_id=cfg["session"],
        compactor_opts={"context_window": 20_000, "reserved_tokens": 1_000,
                        "trigger": 0.9, "target": 0.5, "counter": "cl100k_base"},
    )
    appended, boundaries = [], []
    for e in generate_session(cfg["seed"], cfg["messages"]):
        acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
        appended.append(h(acc.memory[e.id]))
        if e.role == "user" and e.tool_results:
            acc, meta = run_compaction(acc, mid_round=True)
            if meta["compacted"] or meta.get("error"):
                boundaries.append({
                    "compacted": meta["compacted"],
                    "error": meta.get("error"),
                    "hook_errors": [dict(x) for x in meta.get("hook_errors", ())],
                    "dropped": [h(d) for d in meta.get("dropped", ())],
                })
    print(json.dumps({"appended": appended, "final": [h(x) for x in acc.memory],
                      "boundaries": boundaries}))
    """
)


def _agent(path: Path, session: str, seed: int, messages: int, **cfg: Any) -> dict[str, Any]:
    env = {**os.environ, "NORMANDY_ARCHIVE_PATH": str(path)}
    env.update(cfg.pop("env", {}))
    args = json.dumps({"session": session, "seed": seed, "messages": messages, **cfg})
    proc = subprocess.run(
        [sys.executable, "-c", AGENT, args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return report


def _digest(e: Entry) -> tuple[str, str]:
    """Identity and content, as the contract keeps them: a kept entry may be linked to a
    new parent, and a mid-round compaction strips the thinking of the entries it keeps."""
    data = e.without_thinking().model_dump_json(exclude={"parent_id"})
    return (e.id, hashlib.sha256(data.encode()).hexdigest())


def _archived(*paths: Path, session: str) -> set[tuple[str, str]]:
    """:func:`_digest` of every version archived for ``session``, each checked byte for
    byte against the JSON stored."""
    found: set[tuple[str, str]] = set()
    for path in paths:
        if path.exists():
            for item in Archive(path).list(session, limit=10**9):
                assert item.entry.model_dump_json() == item.entry_json
                found.add(_digest(item.entry))
    return found


def _lost(report: dict[str, Any], *paths: Path, session: str) -> set[tuple[str, str]]:
    """Appended entries that are neither in the final conversation nor archived."""
    final = {tuple(x) for x in report["final"]}
    archived = _archived(*paths, session=session)
    return {tuple(x) for x in report["appended"]} - final - archived  # type: ignore[misc]


# -- disk full --------------------------------------------------------------------------


@pytest.mark.parametrize("limit", DISK_FULL_LIMITS)
def test_disk_full_refuses_the_compaction_and_loses_nothing(tmp_path, limit):
    path = tmp_path / "archive.sqlite3"
    report = _agent(path, "full", seed=51, messages=700, fsize=limit)
    committed = [b for b in report["boundaries"] if b["compacted"]]
    refused = [b for b in report["boundaries"] if not b["compacted"]]
    print(f"limit {limit}: {len(committed)} committed, {len(refused)} refused")
    assert committed and refused
    for b in refused:
        assert "database or disk is full" in b["error"], b["error"]
        assert "cannot rollback" not in b["error"]
        assert "conversation is kept" in b["error"]
    assert all(not b["hook_errors"] for b in committed)
    assert _lost(report, path, session="full") == set()
    # every compaction that happened is archived whole
    archived = _archived(path, session="full")
    for b in committed:
        assert {tuple(x) for x in b["dropped"]} <= archived


@pytest.mark.parametrize("limit", DISK_FULL_LIMITS)
def test_disk_full_best_effort_counts_every_lost_entry(tmp_path, limit):
    path = tmp_path / "archive.sqlite3"
    report = _agent(
        path,
        "full",
        seed=51,
        messages=700,
        fsize=limit,
        env={"NORMANDY_ARCHIVE_REQUIRED": "0"},
    )
    assert report["boundaries"] and all(b["compacted"] for b in report["boundaries"])
    failed = [b for b in report["boundaries"] if b["hook_errors"]]
    assert failed
    reported: set[tuple[str, str]] = set()
    for b in failed:
        (err,) = b["hook_errors"]
        assert err["hook"] == "normandy_core.hooks:archive"
        assert f"{len(b['dropped'])} dropped entries were NOT archived" in err["error"]
        assert "database or disk is full" in err["error"]
        assert "cannot rollback" not in err["error"]
        reported |= {tuple(x) for x in b["dropped"]}
    # exactly what was reported is missing (markers the compactor inserted aside)
    appended = {tuple(x) for x in report["appended"]}
    assert _lost(report, path, session="full") == reported & appended


# -- a write lock held by another process -------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    """
)


def _config(session: str) -> AgentConfig:
    return AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt=SYSTEM_PROMPT,
        tools=TOOLS,
        compactor="window_manager",
        session_id=session,
        compactor_opts={
            "context_window": 20_000,
            "reserved_tokens": 1_000,
            "trigger": 0.9,
            "target": 0.5,
            "counter": "cl100k_base",
        },
    )


class Replay:
    """An agent replaying a generated session, one compaction per tool batch."""

    def __init__(self, session: str, seed: int, messages: int) -> None:
        self.acc = _config(session)
        self.session = session
        self.source = iter(generate_session(seed, messages))
        self.appended: list[tuple[str, str]] = []
        self.metas: list[Any] = []

    def next_compaction(self) -> Any:
        """Append until a boundary compacts or refuses; its meta."""
        for e in self.source:
            self.acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
            self.appended.append(_digest(self.acc.memory[e.id]))
            if e.role == "user" and e.tool_results:
                before = self.acc
                self.acc, meta = run_compaction(self.acc, mid_round=True)
                if meta["compacted"] or meta.get("error"):
                    if not meta["compacted"]:
                        assert self.acc is before  # the conversation kept as it was
                    self.metas.append(meta)
                    return meta
        raise AssertionError("the session ended without a compaction")

    def lost(self, *paths: Path) -> set[tuple[str, str]]:
        final = {_digest(e) for e in self.acc.memory}
        return set(self.appended) - final - _archived(*paths, session=self.session)


def test_a_write_lock_held_past_the_busy_wait_refuses_and_loses_nothing(tmp_path):
    path = tmp_path / "archive.sqlite3"
    agent = Replay("locked", seed=52, messages=600)
    with archive_settings(path=path, busy_timeout=0.5):
        assert agent.next_compaction()["compacted"]  # the archive exists and works
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            for _ in range(LOCKED_COMPACTIONS):
                started = time.monotonic()
                meta = agent.next_compaction()
                waited = time.monotonic() - started
                assert not meta["compacted"] and "database is locked" in meta["error"]
                assert "busy_timeout" in meta["error"]
                assert waited < 0.5 + 2.0, waited  # a bounded wait, not 30 s
        finally:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.close()
            holder.wait(timeout=30)
        meta = agent.next_compaction()  # the lock is gone: the next one goes through
        assert meta["compacted"] and "hook_errors" not in meta
    assert agent.lost(path) == set()


# -- the archive deleted or rotated while the agent runs -----------------------------------


@pytest.mark.parametrize("how", ROTATIONS)
def test_a_deleted_or_rotated_archive_is_reopened_and_nothing_is_lost(tmp_path, how):
    path = tmp_path / "archive.sqlite3"
    rotated = tmp_path / "archive.sqlite3.1"
    agent = Replay(how, seed=53, messages=600)
    with archive_settings(path=path):
        first = agent.next_compaction()
        assert first["compacted"]
        if how == "delete":
            path.unlink()
        else:
            path.rename(rotated)
        later = [agent.next_compaction() for _ in range(3)]
    assert all(m["compacted"] and "hook_errors" not in m for m in later)
    after = {_digest(e) for m in later for e in m["dropped"]}
    assert path.exists()  # a new archive at the path, holding what came after
    assert after <= _archived(path, session=how)
    if how == "rotate":  # the rotated file keeps what was written before, whole
        before = {_digest(e) for e in first["dropped"]}
        assert before <= _archived(rotated, session=how)
        assert agent.lost(path, rotated) == set()
    else:  # what was deleted is gone with the file; nothing after it went there
        assert agent.lost(path) == {_digest(e) for e in first["dropped"]}


# -- a read-only archive ------------------------------------------------------------------


def test_a_read_only_archive_refuses_compactions_and_loses_nothing(tmp_path):
    path = tmp_path / "archive.sqlite3"
    mem = list(generate_session(54, 20))
    archive = Archive(path)
    archive.record(mem[:5], session_id="earlier")
    archive.close()
    for p in tmp_path.iterdir():
        p.chmod(0o444)
    for n in range(READ_ONLY_SESSIONS):
        report = _agent(path, f"ro-{n}", seed=55 + n, messages=300, drop_dac=DROP_DAC)
        refused = [b for b in report["boundaries"] if not b["compacted"]]
        assert refused and len(refused) == len(report["boundaries"])
        for b in refused:
            assert "readonly database" in b["error"], b["error"]
        assert _lost(report, path, session=f"ro-{n}") == set()
    assert Archive(path).count() == 5  # untouched

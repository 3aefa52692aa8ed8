"""Scenario helpers of the archive's tests: agents replaying generated sessions.

An agent appends a generated session entry by entry and compacts after every tool batch
with ``window_manager`` (the archive hook installed for real); at the end every entry it
appended must be in its conversation or in the archive (:func:`lost`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from normandy_archive import Archive
from normandy_core import AgentConfig, Entry, run_compaction
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session

#: Run first in a subprocess as root: drop the capabilities that let root ignore file
#: permissions, so a 0400 or 0444 file is read-only for it too (a no-op for other users).
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

#: An agent killed in the middle of a compaction by the crash tests (and
#: ``scripts/archive_soak.py``): ``tag seed messages [window]`` on its command line; it
#: prints ``begin`` before a boundary that compacts, then the compaction's dropped entries
#: (content hash and SHA-256 of the JSON of each) once it is done, and ``end``. Under a
#: umask of 0: whatever it creates must still be owner-only.
CRASH_AGENT = textwrap.dedent(
    """
    import hashlib, json, os, sys
    os.umask(0)
    from normandy_archive.schema import content_hash
    from normandy_core import AgentConfig, get_counter, run_compaction
    from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session
    tag, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    window = int(sys.argv[4]) if len(sys.argv) > 4 else 20_000
    reserved = 1_000
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
                done = [[content_hash(d), hashlib.sha256(d.model_dump_json().encode()).hexdigest()]
                        for d in meta["dropped"]]
                print(json.dumps(done), flush=True)
    print("end", flush=True)
    """
)


def follow(
    proc: subprocess.Popen[str],
    lines: list[str],
    kill_after: int | None = None,
    delay: float = 0.0,
    timeout: float = 60.0,
) -> None:
    """Read the lines of ``proc`` (a :data:`CRASH_AGENT`) into ``lines``; SIGKILL it
    ``delay`` s after the first compaction that begins once ``kill_after`` compactions
    have completed (``None``: never), then wait for it."""
    assert proc.stdout is not None
    completed = 0
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith("["):
            completed += 1
        elif kill_after is not None and line.strip() == "begin" and completed >= kill_after:
            time.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=timeout)


def unsound(path: str | Path) -> list[str]:
    """What is wrong with the SQLite archive at ``path`` after crashes: ``PRAGMA
    integrity_check``'s complaint, and each compaction row without its entries."""
    conn = sqlite3.connect(path)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
        partial = conn.execute(
            "SELECT c.compaction_id FROM compactions c LEFT JOIN entries e "
            "ON e.compaction_id = c.compaction_id GROUP BY c.compaction_id "
            "HAVING count(e.seq) = 0 AND c.entry_count > 0"
        ).fetchall()
    finally:
        conn.close()
    found = [] if check == "ok" else [f"integrity_check: {check}"]
    return found + [f"compaction {c} without its entries" for (c,) in partial]


#: Holds the write lock of the archive named on its command line (``BEGIN IMMEDIATE``)
#: from when it prints ``locked`` until :func:`release`.
LOCK_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
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
    from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session

    def h(e):  # see digest()
        data = e.without_thinking().model_dump_json(include={"role", "content"})
        return hashlib.sha256(data.encode()).hexdigest()

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


def agent(path: Path, session: str, seed: int, messages: int, **cfg: Any) -> dict[str, Any]:
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


def digest(e: Entry) -> str:
    """An entry's content as the contract keeps it: a mid-round compaction strips the
    thinking of the entries it keeps (and may link them to a new parent), and the archive
    stores each content once, under the id it had when first dropped."""
    data = e.without_thinking().model_dump_json(include={"role", "content"})
    return hashlib.sha256(data.encode()).hexdigest()


def archived(*paths: Path) -> set[str]:
    """:func:`digest` of every entry archived in the files ``paths`` (each checked byte
    for byte against the JSON stored)."""
    found: set[str] = set()
    for path in paths:
        if path.exists():
            for item in Archive(path).list(limit=10**9):
                assert item.entry.model_dump_json() == item.entry_json
                found.add(digest(item.entry))
    return found


def lost(report: dict[str, Any], *paths: Path) -> set[str]:
    """Appended entries that are neither in the final conversation nor archived."""
    return set(report["appended"]) - set(report["final"]) - archived(*paths)


def config(session: str) -> AgentConfig:
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
        self.acc = config(session)
        self.session = session
        self.source = iter(generate_session(seed, messages))
        self.appended: list[str] = []
        self.metas: list[Any] = []

    def next_compaction(self) -> Any:
        """Append until a boundary compacts or refuses; its meta."""
        for e in self.source:
            self.acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
            self.appended.append(digest(self.acc.memory[e.id]))
            if e.role == "user" and e.tool_results:
                before = self.acc
                self.acc, meta = run_compaction(self.acc, mid_round=True)
                if meta["compacted"] or meta.get("error"):
                    if not meta["compacted"]:
                        assert self.acc is before  # the conversation kept as it was
                    self.metas.append(meta)
                    return meta
        raise AssertionError("the session ended without a compaction")

    def lost(self, *paths: Path) -> set[str]:
        """Appended entries that are neither in the conversation nor archived."""
        final = {digest(e) for e in self.acc.memory}
        return set(self.appended) - final - archived(*paths)


def python(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``script`` run by this interpreter with ``args``, its output captured (at most 60 s)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def start_holder(script: str, path: Path, ready: str) -> subprocess.Popen[str]:
    """``script`` started on ``path``, once it printed ``ready``; :func:`release` ends it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == ready
    return holder


def release(holder: subprocess.Popen[str]) -> int:
    """Let a :func:`start_holder` script go on (a line on its input); its exit status."""
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.close()
    return holder.wait(timeout=30)


_CONCEPTS = {
    "money": ("money", "invoice", "billing", "payment", "charge"),
    "failure": ("trouble", "failed", "declined", "error", "problem"),
    "storage": ("disk", "storage", "volume", "full", "space"),
}


class Concepts:
    """A test embedder: a unit vector over a few concepts (synonym sets)."""

    key = "concepts-test:1"

    def __init__(self) -> None:
        self.embedded: list[str] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.embedded += texts
        out = []
        for text in texts:
            words = set(re.findall(r"[a-z]+", text.lower()))
            v = [float(len(words & set(ws))) for ws in _CONCEPTS.values()] + [0.1]
            n = math.sqrt(sum(x * x for x in v))
            out.append([x / n for x in v])
        return out


#: The fact the recall-by-meaning tests find: it shares no word with "money problem".
MEANING_FACT = "INV-204: the card was declined when we charged the invoice"


def meaning_entries() -> list[Entry]:
    """Four entries of which one (:data:`MEANING_FACT`) is about money trouble, one about
    a full disk, two about a README: what the recall-by-meaning tests archive."""
    return [
        Entry(id="u1", role="user", content="Please tidy the README headings."),
        Entry(id="a1", role="assistant", content=MEANING_FACT),
        Entry(id="u2", role="user", content="The volume ran out of space last night."),
        Entry(id="a2", role="assistant", content="Headings tidied; README renders fine."),
    ]

"""Disk use under sustained compaction: the log bounded, retention holding for file and log.

One agent adds 1k-token messages to a 3k window and compacts at every boundary, about
100 compactions a second (5 ms between boundaries) and back to back, for a minute each:
the write-ahead log stays under :attr:`Archive.WAL_MAX_BYTES` (plus one compaction's
write) whatever the rate, and with ``max_bytes`` the archive's file and log together stay
within 10 % of it (sessions change every few compactions, as agents' runs do: retention
never removes the newest session).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from normandy_archive import Archive, archive_settings, maintenance
from normandy_core import AgentConfig, run_compaction

#: Seconds each rate is kept up, and the pause between boundaries of the first.
SECONDS = 60.0
PAUSE = 0.005
#: Compactions a second the run must reach at least (about 100 at 5 ms, several hundred
#: back to back on an idle machine; two busy cores shared with other work give less).
MIN_RATE = 30
#: Compactions per session (one agent run), and the retention limit tried.
PER_SESSION = 10
MAX_BYTES = 1_000_000
#: What one compaction writes at most here, beyond the log's bound (a few 1k-token entries).
ONE_WRITE = 256 * 1024

_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]


def _message(n: int) -> str:
    """About 1,000 tokens, distinct for each ``n`` (so each compaction stores new content)."""
    return f"message {n}: " + " ".join(f"{_WORDS[(n + i) % 6]}{n}x{i}" for i in range(200))


def _sizes(path: Path) -> tuple[int, int]:
    found = []
    for p in (path, Path(f"{path}-wal")):
        try:
            found.append(os.stat(p).st_size)
        except FileNotFoundError:
            found.append(0)
    return found[0], found[1]


def _run(path: Path, pause: float, max_bytes: int | None) -> dict[str, int]:
    """Compact for :data:`SECONDS`; the largest log, file and both together seen."""
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={"context_window": 3_000, "reserved_tokens": 200, "counter": "cl100k_base"},
    )
    top = {"wal": 0, "main": 0, "disk": 0, "compactions": 0}
    deadline = time.monotonic() + SECONDS
    n = 0
    while time.monotonic() < deadline:
        n += 1
        session = f"run-{top['compactions'] // PER_SESSION}"
        with archive_settings(path=path, session=session, max_bytes=max_bytes):
            acc.memory.add_message("user", _message(n), id=f"m{n}")
            acc, meta = run_compaction(acc, mid_round=False)
        assert "error" not in meta and not meta.get("hook_errors"), meta
        top["compactions"] += bool(meta["compacted"])
        main, wal = _sizes(path)
        top["wal"], top["main"] = max(top["wal"], wal), max(top["main"], main)
        top["disk"] = max(top["disk"], main + wal)
        if pause:
            time.sleep(pause)
    assert maintenance.drain(60)
    return top


@pytest.mark.slow
@pytest.mark.parametrize("pause", [PAUSE, 0.0], ids=["100 per second", "back to back"])
def test_the_log_stays_bounded_at_any_rate(tmp_path, pause):
    top = _run(tmp_path / "a.sqlite3", pause, None)
    print(top)
    assert top["compactions"] >= SECONDS * MIN_RATE
    assert top["wal"] <= Archive.WAL_MAX_BYTES + ONE_WRITE, top


@pytest.mark.slow
@pytest.mark.parametrize("pause", [PAUSE, 0.0], ids=["100 per second", "back to back"])
def test_max_bytes_holds_for_the_file_and_the_log_together(tmp_path, pause):
    top = _run(tmp_path / "a.sqlite3", pause, MAX_BYTES)
    print(top)
    assert top["compactions"] >= SECONDS * MIN_RATE
    assert top["disk"] <= MAX_BYTES * 1.1, top

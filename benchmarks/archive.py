"""The archive (issue 14): a compacting boundary with the archive on and off, write throughput,
and re-compaction archiving nothing twice.

``python -m benchmarks.archive [--quick|--full] [--json]`` runs it alone; ``run.py`` runs
it in a subprocess, because ``python -m benchmarks`` disables the archive hook for every
other figure (``NORMANDY_DISABLE_PLUGINS=archive``) and this one needs it loaded as an
installed plugin, as an agent has it.

* ``boundaries``: an agent replays a generated session and, at every tool batch, the
  same boundary (the same config and memory) is run twice, once with the archive on (a
  fresh SQLite file, required, ``sync=normal``) and once off (``path="off"``: the hook is
  loaded and says so), in alternating order; the session goes on with the compacted
  memory. Only compacting boundaries are reported. Two windows (24k and 128k tokens), and
  each with the boundaries back to back (the worst case: the background writer gets no
  pause, and competes with the next boundaries) or with a 50 ms pause after each
  compaction standing for the model call that follows it (real ones take seconds).
* ``throughput``: ``Archive.record`` of batches of distinct entries: the durable write
  (what a boundary waits for), the indexing that follows (the background writer's work),
  and the durable write with ``sync=full``.
* ``recompaction``: ``compact()`` of one transcript three times, each call from scratch
  (``fresh=True``) and a new session: the rows the archive holds after each call, and the
  time of each call against the same call with the archive off.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import append, clock, median, settle, workload

COUNTER = "cl100k_base"


def _rows(path: Path) -> dict[str, int]:
    """Entries and compactions the archive holds, in its tables or still in its journal or
    spool (read as every reader reads them: read-only, the journal's rows and spooled
    frames included)."""
    from normandy_archive import Archive

    archive = Archive(path)
    try:
        return {
            "entries": archive.count(),
            "compactions": len(archive.compactions(limit=10**9)),
        }
    finally:
        archive.close()


def boundaries(messages: int, window: int, pause: float, seed: int = 13) -> dict[str, Any]:
    """Per compacting boundary: archive on vs off, medians and their ratio."""
    from normandy_archive import archive_settings, base, maintenance
    from normandy_core import AgentConfig, AgentMemory, run_compaction

    wl = workload(60, extra=messages, seed=seed)
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={
            "counter": COUNTER,
            "context_window": window,
            "reserved_tokens": 1_000,
            "target": 0.5,
        },
        memory=AgentMemory.from_entries(wl.history),
    )
    directory = Path(tempfile.mkdtemp(prefix="normandy-bench-archive-"))
    path = directory / "archive.sqlite3"
    on: list[float] = []
    off: list[float] = []
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    dropped: list[int] = []
    ready = [0, 0]  # dropped entries found serialized ahead, of all dropped
    try:
        for n, batch in enumerate(wl.batches()):
            append(acc.memory, batch)
            results: dict[str, Any] = {}
            for arm in ("on", "off") if n % 2 == 0 else ("off", "on"):
                if arm == "on":  # what the background writer has serialized ahead by now
                    with base._prepared_lock:
                        ahead = {k: v.entry for k, v in base._prepared.items()}
                with archive_settings(path=path if arm == "on" else "off", required=True):
                    c0 = time.thread_time()
                    t0 = clock()
                    out = run_compaction(acc, mid_round=True)
                    results[arm] = (out, clock() - t0, time.thread_time() - c0)
            result, spent, _ = results["on"]
            if result.meta.compacted:
                assert not result.meta.hook_errors and results["off"][0].meta.compacted
                on.append(spent)
                off.append(results["off"][1])
                for arm in ("on", "off"):
                    cpu[arm].append(results[arm][2])
                dropped.append(len(result.meta.dropped))
                ready[0] += sum(ahead.get(id(e)) is e for e in result.meta.dropped)
                ready[1] += len(result.meta.dropped)
            acc = result.acc
            if pause and result.meta.compacted:
                time.sleep(pause)  # the model call: the background writer's turn
        assert maintenance.drain(60)
        stored = _rows(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "window": window,
        "pause": pause,
        "compactions": len(on),
        "dropped": median(dropped),
        "on": median(on),
        "off": median(off),
        "ratio": median(on) / median(off),
        "on_cpu": median(cpu["on"]),
        "off_cpu": median(cpu["off"]),
        "cpu_ratio": median(cpu["on"]) / median(cpu["off"]),
        "prepared_ahead": ready[0] / ready[1] if ready[1] else None,
        "stored": stored,
    }


def throughput(entries: int, batch: int) -> dict[str, Any]:
    """Entries per second: durable writes, indexing, durable writes with sync=full."""
    from normandy_archive import Archive
    from normandy_core import Entry

    source = workload(entries, extra=0, seed=23).history
    out: dict[str, Any] = {"entries": len(source), "batch": batch}
    for sync in ("normal", "full"):
        directory = Path(tempfile.mkdtemp(prefix="normandy-bench-archive-"))
        try:
            archive = Archive(directory / "archive.sqlite3", sync=sync)
            rows = [
                Entry(id=e.id, role=e.role, content=e.content, turn_id=e.turn_id) for e in source
            ]
            size = sum(len(e.model_dump_json()) for e in rows)
            settle()
            t0 = clock()
            for i in range(0, len(rows), batch):
                archive.record(rows[i : i + batch], session_id="bench", index=False)
            durable = clock() - t0
            t0 = clock()
            indexed = archive.index()
            index_time = clock() - t0
            assert indexed == archive.count()  # distinct content (a few entries repeat)
            archive.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        out[sync] = {
            "durable_per_s": len(rows) / durable,
            "mb_per_s": size / durable / 1e6,
            "per_batch": durable / -(-len(rows) // batch),
            "index_per_s": len(rows) / index_time,
        }
    return out


def recompaction(messages: int) -> dict[str, Any]:
    """``compact()`` of one transcript three times, a new session each: rows and times."""
    from normandy_archive import archive_settings
    from normandy_core import compact
    from normandy_core.formats import to_openai
    from normandy_core.workload import generate_session

    transcript = to_openai(generate_session(29, messages))
    directory = Path(tempfile.mkdtemp(prefix="normandy-bench-archive-"))
    path = directory / "archive.sqlite3"
    calls: list[dict[str, Any]] = []
    try:
        for _ in range(3):
            times: dict[str, float] = {}
            for arm in ("off", "on"):
                with archive_settings(path=path if arm == "on" else "off"):
                    settle()
                    t0 = clock()
                    # from scratch: the same list again would be a continuation of the
                    # call before, which drops nothing new
                    result = compact(transcript, window=128_000, model="gpt-4o", fresh=True)
                    times[arm] = clock() - t0
            note = result.note("archive") or {}
            calls.append(
                {
                    "dropped": len(result.dropped),
                    "stored": note.get("stored"),
                    "existing": note.get("existing"),
                    "rows": _rows(path),
                    "on": times["on"],
                    "off": times["off"],
                }
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"messages": len(transcript), "calls": calls}


MODES = {
    "quick": {
        "boundaries": [(1_500, 24_000), (3_000, 128_000)],
        "pause": 0.05,
        "throughput": 4_000,
        "recompaction": 2_000,
    },
    "full": {
        "boundaries": [(3_000, 24_000), (6_000, 128_000)],
        "pause": 0.05,
        "throughput": 20_000,
        "recompaction": 10_000,
    },
}


def measure(mode: str) -> dict[str, Any]:
    """Every figure of ``mode`` (``quick`` or ``full``)."""
    m = MODES[mode]
    found: dict[str, Any] = {"boundaries": [], "throughput": [], "recompaction": None}
    for messages, window in m["boundaries"]:
        for pause in (0.0, m["pause"]):
            found["boundaries"].append(boundaries(messages, window, pause))
    for batch in (20, 200):
        found["throughput"].append(throughput(m["throughput"], batch))
    found["recompaction"] = recompaction(m["recompaction"])
    return found


def run_in_subprocess(mode: str) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter with the archive hook loaded."""
    env = {k: v for k, v in os.environ.items() if k != "NORMANDY_DISABLE_PLUGINS"}
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.archive", f"--{mode}", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        check=True,
    )
    data: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return data


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def report(found: dict[str, Any]) -> str:
    """The markdown section."""
    from benchmarks.common import fmt_time

    rows = []
    for b in found["boundaries"]:
        rows.append(
            [
                f"{b['window']:,}",
                "back to back" if not b["pause"] else f"{b['pause'] * 1000:.0f} ms pause",
                f"{b['compactions']:,}",
                f"{b['dropped']:.0f}",
                fmt_time(b["off"]),
                fmt_time(b["on"]),
                f"{b['ratio']:.2f}x",
                f"{fmt_time(b['off_cpu'])} / {fmt_time(b['on_cpu'])} ({b['cpu_ratio']:.2f}x)",
                "" if b.get("prepared_ahead") is None else f"{b['prepared_ahead']:.0%}",
            ]
        )
    text = (
        _table(
            [
                "window (tokens)",
                "boundaries",
                "compactions",
                "dropped per compaction (median)",
                "archive off",
                "archive on (required)",
                "ratio",
                "CPU of the boundary's thread, off / on (ratio)",
                "dropped entries serialized ahead",
            ],
            rows,
        )
        + "\n\nThe same boundary (same config and memory) run with the archive on and off, "
        "in alternating order, medians over the compacting boundaries. *On*: the hook "
        "commits the dropped entries (new content only) in the boundary, `sync=normal`: one "
        "frame appended to the process's spool file; moving it into the archive, indexing, "
        "checkpoints, pruning and serializing the entries the next compaction drops follow "
        "in the background writer, in the pause after each compaction. *Off*: "
        "`NORMANDY_ARCHIVE_PATH=off` (the hook is loaded and notes it). Target: <= 1.5x. "
        "The CPU column is the CPU time of the thread running the boundary "
        "(`time.thread_time`, medians): it leaves out the time the thread waited for a core "
        "on a loaded machine, and the time it waited for the background writer's lock "
        "or for the disk. The last column is the share of the dropped entries the "
        "background writer had serialized before the compaction (the others are "
        "serialized in the boundary: those appended since the last compaction, and any "
        "it had no time for).\n\n"
    )
    rows = []
    for t in found["throughput"]:
        for sync in ("normal", "full"):
            r = t[sync]
            rows.append(
                [
                    f"{t['batch']}",
                    sync,
                    f"{r['durable_per_s']:,.0f}",
                    f"{r['mb_per_s']:.1f}",
                    fmt_time(r["per_batch"]),
                    f"{r['index_per_s']:,.0f}",
                ]
            )
    text += (
        _table(
            [
                "entries per compaction",
                "sync",
                "durable writes (entries/s)",
                "JSON MB/s",
                "per compaction",
                "indexing afterwards (entries/s)",
            ],
            rows,
        )
        + f"\n\n`Archive.record` of {found['throughput'][0]['entries']:,} distinct generated "
        "entries, a compaction at a time, into a fresh file.\n\n"
    )
    rc = found["recompaction"]
    rows = []
    for n, c in enumerate(rc["calls"], 1):
        rows.append(
            [
                str(n),
                f"{c['dropped']:,}",
                f"{c['stored']:,}",
                f"{c['existing']:,}",
                f"{c['rows']['entries']:,} / {c['rows']['compactions']:,}",
                fmt_time(c["off"]),
                fmt_time(c["on"]),
            ]
        )
    text += (
        _table(
            [
                "compact() call",
                "dropped",
                "stored",
                "already archived",
                "rows after (entries / compactions)",
                "archive off",
                "archive on",
            ],
            rows,
        )
        + f"\n\n`compact()` of one {rc['messages']:,}-message OpenAI transcript to a 128k "
        "window, three times, each call from scratch (`fresh=True`) and a new session with "
        "new entry ids: content is stored once, so the second and third calls store "
        "nothing."
    )
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.archive``: print the section (or ``--json``)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.archive", description=__doc__)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true")
    g.add_argument("--full", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    found = measure("full" if args.full else "quick")
    print(json.dumps(found) if args.json else report(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The archive (issue 14): a compacting boundary with the archive on and off, write throughput,
and re-compaction archiving nothing twice.

``python -m benchmarks.archive [--quick|--full] [--json]`` runs it alone; ``run.py`` runs
it in a subprocess, because ``python -m benchmarks`` disables the archive hook for every
other figure (``NORMANDY_DISABLE_PLUGINS=archive``) and this one needs it loaded as an
installed plugin, as an agent has it.

* ``boundaries``: an agent replays a generated session, compacting at every tool batch,
  in passes: with the archive on (a fresh SQLite file per pass, required,
  ``sync=normal``) and off (``path="off"``: the hook is loaded and says so, and no
  background writer runs), alternating (:data:`PASSES`). Each pass has its own memory, so
  each counts the tokens of what it appended, as an agent's boundary does (two arms
  sharing one memory would share its token counts: the arm run second would find them
  counted). Only compacting boundaries are reported. Two windows (24k and 128k tokens),
  and each with the boundaries back to back (the worst case: the background writer gets
  no pause, and competes with the next boundaries) or with a 50 ms pause after each
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import append, clock, median, settle, workload

COUNTER = "cl100k_base"


def _rows(path: Path) -> dict[str, int]:
    """Entries and compactions the archive holds (read as every reader reads them:
    read-only, the rows not indexed yet included)."""
    from normandy_archive import Archive

    archive = Archive(path)
    try:
        return {
            "entries": archive.count(),
            "compactions": len(archive.compactions(limit=10**9)),
        }
    finally:
        archive.close()


def _pass(
    wl: Any, window: int, path: Path | str, pause: float
) -> dict[str, list[float] | list[int]]:
    """One replay of the session from its start, every compacting boundary timed."""
    from normandy_archive import archive_settings, base, maintenance
    from normandy_core import AgentConfig, AgentMemory, run_compaction

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
    on = path != "off"
    found: dict[str, Any] = {"wall": [], "cpu": [], "dropped": [], "ahead": []}
    with archive_settings(path=path, required=True):
        for batch in wl.batches():
            append(acc.memory, batch)
            # what the background writer has serialized ahead by now (outside the timer;
            # the copy takes 10 to 30 us, a fraction of a percent of the time between two
            # compactions, so it gives that writer no measurable head start)
            if on:
                with base._prepared_lock:
                    ahead = {k: v.entry for k, v in base._prepared.items()}
            c0 = time.thread_time()
            t0 = clock()
            result = run_compaction(acc, mid_round=True)
            spent, cpu = clock() - t0, time.thread_time() - c0
            if result.meta.compacted:
                assert not result.meta.hook_errors
                found["wall"].append(spent)
                found["cpu"].append(cpu)
                found["dropped"].append(len(result.meta.dropped))
                if on:
                    found["ahead"].append(sum(ahead.get(id(e)) is e for e in result.meta.dropped))
                if pause:
                    time.sleep(pause)  # the model call: the background writer's turn
            acc = result.acc
    if on:
        assert maintenance.drain(60)
    return found


#: The order of the passes (each a replay of the whole session), off and on alternating
#: so that a drift of the machine's speed during the run weighs on both alike.
PASSES = ("off", "on", "on", "off")


def boundaries(
    messages: int, window: int, pause: float, seed: int = 13, passes: Sequence[str] = PASSES
) -> dict[str, Any]:
    """Per compacting boundary: archive on vs off, medians and their ratio."""
    wl = workload(60, extra=messages, seed=seed)
    directory = Path(tempfile.mkdtemp(prefix="normandy-bench-archive-"))
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    stored: dict[str, int] = {}
    try:
        for n, arm in enumerate(passes):
            path = directory / f"archive-{n}.sqlite3"
            runs[arm].append(_pass(wl, window, path if arm == "on" else "off", pause))
            if arm == "on":
                stored = _rows(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    def pooled(arm: str, key: str) -> list[float]:
        return [x for r in runs[arm] for x in r[key]]

    on, off = median(pooled("on", "wall")), median(pooled("off", "wall"))
    on_cpu, off_cpu = median(pooled("on", "cpu")), median(pooled("off", "cpu"))
    dropped = pooled("on", "dropped")
    assert dropped == pooled("off", "dropped")[: len(dropped)]  # the same compactions
    ahead = sum(pooled("on", "ahead"))
    # the harness's own error: the first off pass against the last, the same work
    offs = [median(r["wall"]) for r in runs["off"]]
    return {
        "window": window,
        "pause": pause,
        "passes": len(passes),
        "compactions": len(runs["on"][0]["wall"]),
        "dropped": median(dropped),
        "on": on,
        "off": off,
        "ratio": on / off,
        "on_cpu": on_cpu,
        "off_cpu": off_cpu,
        "cpu_ratio": on_cpu / off_cpu,
        "off_vs_off": offs[0] / offs[-1],
        "prepared_ahead": ahead / sum(dropped) if dropped else None,
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
    from normandy_core.app.workload import generate_session
    from normandy_core.transcripts.chat import to_openai

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
                f"{b['off_vs_off']:.2f}x",
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
                "off / off",
                "CPU of the boundary's thread, off / on (ratio)",
                "dropped entries serialized ahead",
            ],
            rows,
        )
        + "\n\nThe session replayed from its start in passes, each with its own memory (and "
        "so its own token counts) and, with the archive on, a fresh archive file: "
        f"{found['boundaries'][0]['passes']} passes, off and on alternating (off, on, on, "
        "off), medians over the compacting boundaries of every pass of each arm. *On*: "
        "the hook commits the dropped entries (new content only) in the boundary, "
        "`sync=normal`: one transaction into the archive's tables; indexing, checkpoints, "
        "pruning and serializing the entries the next "
        "compaction drops follow in the background writer (back to back, it competes with "
        "the next boundaries; with a pause, it works in the pause after each compaction). "
        "*Off*: `NORMANDY_ARCHIVE_PATH=off` (the hook is loaded and notes it), no "
        "background writer. Target: <= 1.5x. *Off / off*: the first off pass against the "
        "last, the same work twice: how far the harness itself is from 1.00x on this "
        "machine. The CPU column is the CPU time of the thread running the boundary "
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

"""Instructions of the compacting boundaries alone, archive on or off (issue 14), for
callgrind: a noise-free cross-check of ``benchmarks.archive``'s boundary figures.

``valgrind --tool=callgrind --toggle-collect=sys_call_tracing python -m
benchmarks.archive_callgrind on|off [window] [messages]`` (with ``NORMANDY_ARCHIVE_PATH``
set to a scratch path). Every boundary of a generated session is first run untraced with
the archive off; one that compacts is run again inside ``sys.call_tracing``, the only
code callgrind counts, with the archive ``on`` (a fresh SQLite file, required) or
``off``; the first compaction (which opens the archive) is not counted. The background
writer's work (preparing the next entries, the move, indexing) runs after each
compaction, untraced, where the pause after a compaction would let it run. Divide the
instructions callgrind reports by the count printed (``measured N``); run the two arms as
two processes.
"""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import append, workload


def main(argv: list[str] | None = None) -> int:
    """Run the boundaries of one arm; print how many were counted."""
    args = sys.argv[1:] if argv is None else argv
    arm = args[0]
    if arm not in ("on", "off"):
        raise SystemExit("usage: python -m benchmarks.archive_callgrind on|off [window] [messages]")
    window = int(args[1]) if len(args) > 1 else 24_000
    messages = int(args[2]) if len(args) > 2 else 700

    import normandy_archive.maintenance as maintenance
    from normandy_archive import archive_settings
    from normandy_core import AgentConfig, AgentMemory, run_compaction

    pending: list[tuple[Any, ...]] = []

    def later(archive: Any, limits: Any = None, upcoming: Any = ()) -> None:
        pending.append((archive, limits, upcoming))

    maintenance.schedule = later  # type: ignore[assignment]  # the hooks import it at use
    wl = workload(60, extra=messages, seed=13)
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={
            "counter": "cl100k_base",
            "context_window": window,
            "reserved_tokens": 1_000,
            "target": 0.5,
        },
        memory=AgentMemory.from_entries(wl.history),
    )
    directory = Path(tempfile.mkdtemp(prefix="normandy-bench-archive-cg-"))
    path = directory / "archive.sqlite3"
    counted, first = 0, True
    try:
        for batch in wl.batches():
            append(acc.memory, batch)
            with archive_settings(path="off", required=True):
                probe = run_compaction(acc, mid_round=True)
            if not probe.meta.compacted:
                acc = probe.acc
                continue
            with archive_settings(path=path if arm == "on" else "off", required=True):
                if first:
                    out = run_compaction(acc, mid_round=True)
                    first = False
                else:
                    boundary = functools.partial(run_compaction, acc, mid_round=True)
                    out = sys.call_tracing(boundary, ())
                    counted += 1
            assert out.meta.compacted and not out.meta.hook_errors
            for work in pending:
                maintenance._writer.serve(*work)
            pending.clear()
            acc = out.acc
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print("measured", counted)
    return 0


if __name__ == "__main__":
    sys.exit(main())

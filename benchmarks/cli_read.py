"""How ``normandy compact`` reads a transcript as it grows: linear, not quadratic (issue 13).

``cli_read_scaling`` writes OpenAI transcripts of 11k, 22k and 44k messages as the
command writes them (indented JSON, about ten lines a message: the workload's session,
repeated) and times ``read_source`` on each, the median of ``repeat`` reads, in wall-clock
and in CPU time (the process's own, steadier than the wall clock on a shared machine).
Each doubling should cost about 2x; the quadratic reader cost 3.7x, then 5.4x.

Run alone: ``python -m benchmarks.cli_read``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import clock, fmt_time, median, settle
from normandy_core.app.cli import read_source, render
from normandy_core.app.workload import generate_session
from normandy_core.transcripts.chat import to_openai

#: The transcript sizes timed, in messages (each the double of the one before).
SIZES = (11_000, 22_000, 44_000)


def _messages(count: int) -> list[dict[str, Any]]:
    """``count`` OpenAI messages: the workload's session, repeated as often as needed."""
    base = to_openai(generate_session(7, messages=2_000))
    return [base[i % len(base)] for i in range(count)]


def _ratio(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def cli_read_scaling(sizes: Sequence[int] = SIZES, repeat: int = 3) -> dict[str, Any]:
    """Seconds to read each size (median of ``repeat``), and the ratio per doubling.

    Returns ``{"rows": [{"messages", "bytes", "lines", "seconds", "ratio", "cpu",
    "cpu_ratio"}], "table"}``: ``seconds`` and ``cpu`` the medians of wall-clock and CPU
    time, each ratio the time against the previous size (``None`` for the first), and
    ``table`` the rows as markdown.
    """
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="normandy-bench-read-") as tmp:
        for n in sizes:
            path = Path(tmp) / f"transcript-{n}.json"
            text = render(_messages(n), "json")
            path.write_text(text, encoding="utf-8")
            samples: list[float] = []
            cpu: list[float] = []
            for _ in range(repeat):
                settle()
                t0, c0 = clock(), time.process_time()
                src = read_source(str(path))
                samples.append(clock() - t0)
                cpu.append(time.process_time() - c0)
                if len(src.data) != n or src.lines is None or len(src.lines) != n:
                    raise AssertionError(f"read {len(src.data)} messages of {n}")
            seconds, cpu_seconds = median(samples), median(cpu)
            rows.append(
                {
                    "messages": n,
                    "bytes": len(text.encode("utf-8")),
                    "lines": text.count("\n"),
                    "seconds": seconds,
                    "ratio": seconds / rows[-1]["seconds"] if rows else None,
                    "cpu": cpu_seconds,
                    "cpu_ratio": cpu_seconds / rows[-1]["cpu"] if rows else None,
                }
            )
            path.unlink()
    head = (
        "| messages | size | lines | read | against the previous size | CPU time | against "
        "the previous size |\n|---|---|---|---|---|---|---|"
    )
    body = "\n".join(
        f"| {r['messages']:,} | {r['bytes'] / 1e6:.1f} MB | {r['lines']:,} | "
        f"{fmt_time(r['seconds'])} | {_ratio(r['ratio'])} | "
        f"{fmt_time(r['cpu'])} | {_ratio(r['cpu_ratio'])} |"
        for r in rows
    )
    return {"rows": rows, "table": f"{head}\n{body}"}


if __name__ == "__main__":  # pragma: no cover
    import sys

    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(cli_read_scaling(repeat=reps)["table"])

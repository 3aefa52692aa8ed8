"""Run the project's fuzz campaign (issue 12) for a while and report what it found.

    uv run python scripts/fuzz.py --seed 1 --duration 300 --out out/fuzz-findings.jsonl
    make fuzz SEED=1 DURATION=300

Cases are numbered from ``--start`` (default 0); case ``i`` of seed ``s`` is the same on
every machine, so a finding is reproduced with ``--seed s --start i --max-cases 1``.
Prints progress every ``--every`` seconds (cases per second, cases per compactor and
format, findings so far), then a table of the cases run and the findings grouped by
check. Exits 1 when anything was found. The ``archive`` hook is disabled and pointed at
a temporary file, so the campaign never writes to the user's archive.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

ROOT = Path(__file__).resolve().parent.parent

if TYPE_CHECKING:
    from fuzz.campaign import CaseReport, Finding


def _isolate() -> tempfile.TemporaryDirectory[str]:
    """Disable the archive hook and point its path at a temporary directory."""
    scratch = tempfile.TemporaryDirectory(prefix="normandy-fuzz-")
    deny = [n for n in os.environ.get("NORMANDY_DISABLE_PLUGINS", "").split(",") if n.strip()]
    os.environ["NORMANDY_DISABLE_PLUGINS"] = ",".join([*deny, "archive"])
    os.environ["NORMANDY_ARCHIVE_PATH"] = str(Path(scratch.name) / "archive.sqlite3")
    return scratch


_SHORT = {
    "window_manager/oldest_first": "wm/oldest",
    "window_manager/sliding_window": "wm/sliding",
    "window_manager/summarize": "wm/summarize",
    "clear_tool_results": "clear",
    "pipeline": "pipeline",
    "noop": "noop",
}


def _matrix(
    counts: Counter[tuple[str, str]],
    compactors: tuple[str, ...],
    formats: tuple[str, ...],
    rows: str = "compactor",
) -> str:
    width = max(len(c) for c in (*compactors, rows))
    head = f"  {rows:<{width}}  " + "  ".join(f"{f:>9}" for f in formats) + "      total"
    lines = [head]
    for comp in compactors:
        row = [counts[(comp, f)] for f in formats]
        lines.append(
            f"  {comp:<{width}}  " + "  ".join(f"{n:>9,}" for n in row) + f"  {sum(row):>9,}"
        )
    cols = [sum(counts[(c, f)] for c in compactors) for f in formats]
    lines.append(
        f"  {'total':<{width}}  " + "  ".join(f"{n:>9,}" for n in cols) + f"  {sum(cols):>9,}"
    )
    return "\n".join(lines)


def _progress(
    out: TextIO,
    elapsed: float,
    n: int,
    counts: Counter[tuple[str, str]],
    by_check: Counter[str],
    formats: tuple[str, ...],
) -> None:
    rate = n / elapsed if elapsed else 0.0
    found = ", ".join(f"{k} {v}" for k, v in by_check.most_common()) or "none"
    cells = " ".join(
        f"{_SHORT.get(c, c)}={'/'.join(str(counts[(c, f)]) for f in formats)}"
        for c in sorted({c for c, _ in counts})
    )
    print(f"[{elapsed:7.1f}s] {n:,} cases ({rate:.1f}/s); findings: {found}", file=out)
    print(f"           per compactor ({'/'.join(formats)}): {cells}", file=out, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the campaign; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--max-cases", type=int, default=None)
    parser.add_argument("--start", type=int, default=0, help="index of the first case")
    parser.add_argument("--out", type=Path, default=None, help="write findings as JSON lines")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between progress lines")
    args = parser.parse_args(argv)

    scratch = _isolate()
    sys.path.insert(0, str(ROOT / "tests"))
    logging.disable(logging.CRITICAL)  # compactor errors are findings or outcomes here
    from fuzz.campaign import COMPACTORS, run_indexed
    from fuzz.generators import FORMATS
    from fuzz.known import classify

    counts: Counter[tuple[str, str]] = Counter()
    outcomes: Counter[tuple[str, str]] = Counter()
    modes: Counter[tuple[str, str]] = Counter()
    calls = continued = 0
    by_check: Counter[str] = Counter()
    groups: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    slowest: CaseReport | None = None
    ratios: list[float] = []
    sink = None
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        sink = args.out.open("w", encoding="utf-8")
    print(
        f"normandy fuzz campaign: seed {args.seed}, {args.duration:g} s"
        + (f", at most {args.max_cases:,} cases" if args.max_cases else ""),
        flush=True,
    )
    t0 = time.perf_counter()
    last = t0
    n = 0
    index = args.start
    try:
        while True:
            now = time.perf_counter()
            if now - t0 >= args.duration or (args.max_cases and n >= args.max_cases):
                break
            report = run_indexed(args.seed, index)
            index += 1
            n += 1
            counts[(report.compactor, report.format)] += 1
            outcomes[(report.compactor, report.outcome)] += 1
            modes[(report.mode, report.format)] += 1
            calls += report.calls
            continued += report.continued
            if report.est_ratio is not None:
                ratios.append(report.est_ratio)
            if slowest is None or report.seconds > slowest.seconds:
                slowest = report
            for f in report.findings:
                by_check[f.check] += 1
                groups[(f.check, f.compactor)].append(f)
                if sink is not None:
                    sink.write(f.to_json() + "\n")
            if now - last >= args.every:
                last = now
                _progress(sys.stdout, now - t0, n, counts, by_check, FORMATS)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        if sink is not None:
            sink.close()
        scratch.cleanup()
    elapsed = time.perf_counter() - t0
    labels = tuple(c for c in COMPACTORS if any(counts[(c, f)] for f in FORMATS)) or COMPACTORS
    print(
        f"\n{n:,} cases in {elapsed:.1f} s ({n / elapsed if elapsed else 0:.1f} cases/s), "
        f"seed {args.seed}, indices {args.start}..{index - 1}"
    )
    print("\ncases per compactor and format:")
    print(_matrix(counts, labels, FORMATS))
    kinds = ("compacted", "skipped", "error", "raised", "rejected")
    print("\noutcomes per compactor:")
    print(_matrix(outcomes, labels, kinds))
    print("\ncases per mode and format (continuation sequences: compact() at every request):")
    print(_matrix(modes, ("single", "continue-full", "continue-replace"), FORMATS, "mode"))
    print(
        f"continuation sequences: {calls:,} compact() calls, {continued:,} compacted as the "
        "continuation of the call before"
    )
    if ratios:
        over = sum(1 for r in ratios if r > 1.0)
        print(
            f"\nown size estimate of compacted outputs (3 chars/token, 1,600/image) against "
            f"the usable window: max {max(ratios):.2f}, {over} of {len(ratios)} over 1.0 "
            "(logged, not a check: counters differ)"
        )
    if slowest is not None:
        print(
            f"slowest case: index {slowest.index} ({slowest.compactor}, {slowest.format}) "
            f"{slowest.seconds:.2f} s"
        )
    if not by_check:
        print("\nno findings")
        return 0
    print(f"\nfindings: {sum(by_check.values()):,}")
    for check, total in by_check.most_common():
        print(f"\n{check}: {total}")
        for (chk, comp), items in sorted(groups.items()):
            if chk != check:
                continue
            formats = ", ".join(sorted({f.format for f in items}))
            known = sorted({classify(f) or "UNKNOWN" for f in items})
            print(f"  {comp} x{len(items)} (formats: {formats}; defects: {', '.join(known)})")
            first = items[0]
            print(f"    e.g. {first.reproducer()[:400]}")
            print(f"         {first.message[:300]}")
    if args.out is not None:
        print(f"\nfindings written to {args.out}")
    return 1


if __name__ == "__main__":
    sys.exit(main())

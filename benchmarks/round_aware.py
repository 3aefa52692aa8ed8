"""Round-aware compaction (issue 34 item 2): what the model keeps of its reasoning, and the cost.

    uv run --no-sync python -m benchmarks.round_aware [--windows 48000 128000] [--seeds 11] [--cost]

Replays the bundled demo session and the generated sessions of ``--seeds``
(:func:`benchmarks.cost.generated_session`) through the real turn loop with
``window_manager``, once with ``round_aware`` off (the old default) and once at the
defaults, the two arms alternated per session and window. For each it prints the
compactions (turn start / mid-round), the model calls made with thinking disabled, the
cache-aware input cost (and its ratio to the arm with ``round_aware`` off), the tokens
sent and the peak context. ``--cost`` compares ``schedule="cost"`` weighing the cache alone
(``thinking_value`` 0) with weighing the reasoning too (the default ``thinking_value``).
Nothing is timed: every figure is a count.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from benchmarks.cost import generated_session
from normandy_core.app.demo import DemoReport, DemoSession, load_session, replay

ARMS: dict[str, Mapping[str, Any]] = {
    "round_aware off": {"round_aware": False},
    "defaults (round_aware on)": {},
}
#: ``--cost``: ``schedule="cost"`` weighing the cache alone against weighing the reasoning too.
COST_ARMS: dict[str, Mapping[str, Any]] = {
    "cost, cache alone": {"schedule": "cost", "thinking_value": 0.0},
    "cost, reasoning weighed": {"schedule": "cost"},
}


def row(report: DemoReport) -> dict[str, Any]:
    """The figures of one replay."""
    calls = len(report.billed)
    starts = sum(1 for b in report.compactions if not b.mid_round)
    return {
        "compactions": f"{starts} / {len(report.compactions) - starts}",
        "thinking disabled": (
            f"{report.thinking_disabled} ({100 * report.thinking_disabled / calls:.1f} %)"
        ),
        "cost": report.cost,
        "sent": sum(report.sent),
        "peak": report.peak,
        "window": report.window,
        "calls": calls,
    }


def run(
    sessions: Mapping[str, DemoSession],
    windows: list[int],
    arms: Mapping[str, Mapping[str, Any]] = ARMS,
) -> None:
    """Print one table row per session, window and arm (the first arm is the base)."""
    print(
        "| session | window | options | compactions (turn start / mid-round) "
        f"| calls with thinking disabled | cache-aware cost | vs {next(iter(arms))} "
        "| tokens sent | peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, session in sessions.items():
        for window in windows:
            base = None
            for arm, opts in arms.items():
                r = row(replay(session, opts=dict(opts), window=window))
                base = r["cost"] if base is None else base
                print(
                    f"| {name} | {window // 1000}k | {arm} | {r['compactions']} "
                    f"| {r['thinking disabled']} | ${r['cost']:.2f} | {r['cost'] / base:.2f}x "
                    f"| {r['sent'] / 1e6:.1f} M | {r['peak']:,} |",
                    flush=True,
                )


def main() -> None:
    """Parse the options and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[48_000, 128_000])
    parser.add_argument("--seeds", type=int, nargs="*", default=[11])
    parser.add_argument(
        "--cost", action="store_true", help="schedule='cost': the cache alone against reasoning"
    )
    args = parser.parse_args()
    sessions = {"demo": load_session()}
    for seed in args.seeds:
        sessions[f"generated seed {seed}"] = generated_session(seed)
    run(sessions, args.windows, COST_ARMS if args.cost else ARMS)


if __name__ == "__main__":
    main()

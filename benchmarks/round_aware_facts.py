"""Round-aware compaction (issue 34): the facts the model has at need time, off against on.

    uv run --no-sync python -m benchmarks.round_aware_facts [--quick] [--windows 32000 128000]
        [--seeds 1 3]

Replays the quality benchmark's sessions (:func:`benchmarks.quality.sessions.default_sessions`,
``--quick`` for the small ones; ``--seeds``: instead the generated sessions of those
seeds, 1,000 messages each, as the benchmark generates its own) with the subject
``window_manager oldest_first``, once with ``round_aware`` off and once at the defaults,
at each window, recall off and on, by the quality benchmark's own replay
(:func:`benchmarks.quality.replay.replay`). Prints one row per session, window and recall
setting, and the totals: facts available, billed cost, calls with thinking disabled.
``--cost`` compares ``schedule="cost"`` weighing the cache alone (``thinking_value`` 0)
with weighing the reasoning too. Nothing is timed: every figure is a count.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.quality.replay import Run, Subject, replay
from benchmarks.quality.sessions import default_sessions, generated

ARMS: dict[str, Mapping[str, Any]] = {
    "round_aware off": {"strategy": "oldest_first", "round_aware": False},
    "defaults": {"strategy": "oldest_first"},
}
#: ``--cost``: ``schedule="cost"`` weighing the cache alone against weighing the reasoning too.
COST_ARMS: dict[str, Mapping[str, Any]] = {
    "cost, cache alone": {"strategy": "oldest_first", "schedule": "cost", "thinking_value": 0.0},
    "cost, reasoning weighed": {"strategy": "oldest_first", "schedule": "cost"},
}


def _cell(runs: Sequence[Run]) -> str:
    """Facts available of needs, billed dollars and calls with thinking disabled."""
    available = sum(r.available for r in runs)
    needs = sum(len(r.results) for r in runs)
    cost = sum(r.billing.cost for r in runs)
    disabled = sum(r.thinking_disabled or 0 for r in runs)
    return f"{available}/{needs}, ${cost:.2f}, {disabled} disabled"


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the options and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick sessions")
    parser.add_argument("--windows", type=int, nargs="+", default=[32_000, 128_000])
    parser.add_argument(
        "--seeds", type=int, nargs="+", help="generated sessions of these seeds instead"
    )
    parser.add_argument(
        "--cost", action="store_true", help="schedule='cost': the cache alone against reasoning"
    )
    args = parser.parse_args(argv)
    arms = COST_ARMS if args.cost else ARMS
    sessions = (
        [generated(seed, 1_000) for seed in args.seeds]
        if args.seeds
        else default_sessions(quick=args.quick)
    )
    runs: dict[tuple[str, int, bool, str], Run] = {}
    print("| session | window | recall | " + " | ".join(arms) + " |")
    print("|---|---|---|" + "---|" * len(arms))
    with tempfile.TemporaryDirectory(
        prefix="normandy-round-facts-", ignore_cleanup_errors=True
    ) as tmp:
        for session in sessions:
            for window in args.windows:
                for recall in (False, True):
                    cells = []
                    for arm, opts in arms.items():
                        subject = Subject("window_manager oldest_first", "window_manager", opts)
                        run = replay(session, subject, window, recall=recall, archive_dir=Path(tmp))
                        runs[(session.name, window, recall, arm)] = run
                        cells.append(_cell([run]))
                    print(
                        f"| {session.name} | {window // 1000}k | {'on' if recall else 'off'} | "
                        + " | ".join(cells)
                        + " |",
                        flush=True,
                    )
    for window in args.windows:
        for recall in (False, True):
            cells = [
                _cell([r for k, r in runs.items() if k[1:] == (window, recall, arm)])
                for arm in arms
            ]
            print(
                f"| all | {window // 1000}k | {'on' if recall else 'off'} | "
                + " | ".join(cells)
                + " |"
            )


if __name__ == "__main__":
    main()

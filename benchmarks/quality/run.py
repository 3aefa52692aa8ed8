"""The quality benchmark's command: replay every session with every subject, print the tables.

``python -m benchmarks.quality [--quick] [--out FILE] [--plot PNG] [--dump-sessions DIR]
[--no-peers] [--frameworks] [--subject TEXT]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.quality.replay import (
    CACHE_READ,
    CACHE_WRITE,
    INPUT_PRICE,
    MODEL,
    RESERVED,
    Run,
    Subject,
    Where,
    replay,
    subjects,
)
from benchmarks.quality.sessions import Need, QualitySession, default_sessions, dump

__all__ = ["Row", "aggregate", "main", "need_timings", "plot", "run_all", "tables", "timing_table"]

#: The two window sizes (tokens): a tight one and a common one.
WINDOWS = (32_000, 128_000)


@dataclass
class Row:
    """One subject at one window, recall on or off, summed over the sessions."""

    subject: str
    window: int
    recall: bool
    runs: list[Run] = field(default_factory=list)

    def total(self, attr: str) -> int:
        """The sum of an integer attribute of the runs (or of their billing)."""
        return sum(
            getattr(r, attr) if hasattr(r, attr) else getattr(r.billing, attr) for r in self.runs
        )

    @property
    def needs(self) -> int:
        """Needs met over all sessions."""
        return sum(len(r.results) for r in self.runs)

    @property
    def share(self) -> float:
        """Share of needed facts available at need time."""
        return self.total("available") / self.needs if self.needs else 1.0

    def count(self, where: Where) -> int:
        """Needs met by ``where`` (``context``, ``summary``, ``recall``) over the sessions."""
        return sum(r.count(where) for r in self.runs)

    @property
    def thinking_disabled(self) -> int | None:
        """Requests sent with thinking disabled over the sessions (``None``: a peer)."""
        counts = [r.thinking_disabled for r in self.runs]
        return None if None in counts else sum(c or 0 for c in counts)

    def thinking_text(self) -> str:
        """The calls with thinking disabled, and their share of the requests (``-``: a peer)."""
        disabled = self.thinking_disabled
        if disabled is None:
            return "-"
        requests = self.total("requests")
        return f"{disabled} ({_pct(disabled / requests if requests else 0.0)})"

    @property
    def cost(self) -> float:
        """Billed input dollars with caching, over the sessions."""
        return sum(r.billing.cost for r in self.runs)

    @property
    def uncached(self) -> float:
        """The same input without caching."""
        return sum(r.billing.uncached_cost for r in self.runs)


def run_all(
    sessions: Sequence[QualitySession],
    chosen: Sequence[Subject],
    windows: Sequence[int],
    archive_dir: Path,
    progress: bool = True,
) -> list[Run]:
    """Every session by every subject at every window, with recall off and (ours) on."""
    runs: list[Run] = []
    for session in sessions:
        for window in windows:
            for subject in chosen:
                for recall in (False, True) if subject.peer is None else (False,):
                    t0 = time.perf_counter()
                    run = replay(session, subject, window, recall=recall, archive_dir=archive_dir)
                    runs.append(run)
                    if progress:
                        print(
                            f"  {session.name[:40]:40} {window:>7,} {subject.label[:46]:46} "
                            f"recall={'on ' if recall else 'off'} {run.available}/"
                            f"{len(run.results)} {time.perf_counter() - t0:5.1f} s",
                            file=sys.stderr,
                        )
    return runs


def aggregate(runs: Sequence[Run]) -> list[Row]:
    """Rows in run order, one per subject, window and recall setting."""
    rows: dict[tuple[str, int, bool], Row] = {}
    for r in runs:
        key = (r.subject, r.window, r.recall)
        rows.setdefault(key, Row(*key)).runs.append(r)
    return sorted(
        rows.values(), key=lambda x: (x.window, list(rows).index((x.subject, x.window, x.recall)))
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def tables(rows: Sequence[Row], sessions: Sequence[QualitySession]) -> str:
    """The markdown tables: totals per subject, then availability per session."""
    needs = sum(len(s.needs) for s in sessions)
    out = [
        "Sessions: "
        + "; ".join(
            f"{s.name}: {s.calls:,} model calls, {len(s.facts)} facts, {len(s.needs)} needs"
            for s in sessions
        )
        + f" ({needs} needs in all). Model {MODEL}, {RESERVED:,} tokens reserved for the reply; "
        f"cost is the input of every request at ${INPUT_PRICE:.2f}/M tokens, cache reads "
        f"{CACHE_READ}x, cache writes {CACHE_WRITE}x.",
        "",
        "| window | subject | recall | facts available | calls with thinking disabled | "
        "in context / summary / recall | task kept | requests | tokens sent | compactions | "
        "over window | cost, cached | cost, no cache |",
        "|---:|---|:---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        requests = r.total("requests")
        kept = requests - r.total("task_missing")
        out.append(
            f"| {r.window // 1000}k | {r.subject} | {'on' if r.recall else 'off'} | "
            f"**{_pct(r.share)}** ({r.total('available')}/{r.needs}) | {r.thinking_text()} | "
            f"{r.count('context')} / {r.count('summary')} / {r.count('recall')} | "
            f"{_pct(kept / requests if requests else 1)} | {requests:,} | "
            f"{r.total('sent') / 1e6:,.2f} M | {r.total('compactions'):,} | "
            f"{r.total('over_window'):,} | ${r.cost:,.2f} | ${r.uncached:,.2f} |"
        )
    out += [
        "",
        "Facts available per session (recall off / on; the peers have no recall):",
        "",
        "| window | subject | " + " | ".join(s.name for s in sessions) + " |",
        "|---:|---|" + "---:|" * len(sessions),
    ]
    by: dict[tuple[str, int], dict[str, list[str]]] = {}
    for r in rows:
        cell = by.setdefault((r.subject, r.window), {})
        for run in r.runs:
            share = run.available / len(run.results) if run.results else 1.0
            cell.setdefault(run.session, []).append(_pct(share))
    for (subject, window), cells in by.items():
        out.append(
            f"| {window // 1000}k | {subject} | "
            + " | ".join(" / ".join(cells.get(s.name, ["-"])) for s in sessions)
            + " |"
        )
    return "\n".join(out)


def need_timings(session: QualitySession) -> dict[Need, str]:
    """Each need of ``session`` as ``early``, ``late`` or ``task``: the task's needs are
    ``task``; of another fact's two needs (:func:`~benchmarks.quality.sessions.plant`),
    the first (one to six calls after it was planted) is ``early``, the second (a quarter
    to two thirds of the remaining calls on) ``late``."""
    task = session.facts[0].id if session.facts else None
    out: dict[Need, str] = {}
    seen: set[str] = set()
    for n in sorted(session.needs, key=lambda n: (n.turn, n.call)):
        out[n] = "task" if n.fact == task else ("late" if n.fact in seen else "early")
        seen.add(n.fact)
    return out


_TIMINGS = ("early", "late", "task")


def _timing_cells(row: Row, timing: dict[tuple[str, Need], str]) -> list[str]:
    cells = []
    for kind in _TIMINGS:
        wheres = [
            res.where
            for run in row.runs
            for res in run.results
            if timing.get((run.session, res.need)) == kind
        ]
        got = [wheres.count(w) for w in ("context", "summary", "recall", "missing")]
        cells.append(" / ".join(str(n) for n in got) + f" of {len(wheres)}")
    return cells


def timing_table(rows: Sequence[Row], sessions: Sequence[QualitySession]) -> str:
    """Per subject and window, the needs by timing (:func:`need_timings`): in context /
    in a summary / by recall / missing; then requests over the window and with the task."""
    timing = {(s.name, n): kind for s in sessions for n, kind in need_timings(s).items()}
    out = [
        "Needs by timing (early: 1 to 6 calls after the fact; late: a quarter to two thirds "
        "of the remaining calls on; task: the task's constraint), each as in context / in a "
        "summary / by recall / missing:",
        "",
        "| window | subject | recall | early | late | task | over window | task kept |",
        "|---:|---|:---:|---|---|---|---:|---:|",
    ]
    for r in rows:
        requests = r.total("requests")
        kept = requests - r.total("task_missing")
        out.append(
            f"| {r.window // 1000}k | {r.subject} | {'on' if r.recall else 'off'} | "
            + " | ".join(_timing_cells(r, timing))
            + f" | {r.total('over_window'):,} / {requests:,} | "
            f"{_pct(kept / requests if requests else 1)} |"
        )
    return "\n".join(out)


def plot(rows: Sequence[Row], path: Path) -> Path:
    """A PNG: facts available and billed cost per subject, both windows, recall off/on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = sorted({r.window for r in rows})
    names = list(dict.fromkeys(r.subject for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.55 * len(names) + 2.2), sharey=True)
    height = 0.8 / (2 * len(windows))
    colors = {False: ("#c9a227", "#8a6d0b"), True: ("#3b7dd8", "#1d4e91")}
    for i, name in enumerate(names):
        for j, window in enumerate(windows):
            for k, recall in enumerate((False, True)):
                row = next(
                    (
                        r
                        for r in rows
                        if r.subject == name and r.window == window and r.recall == recall
                    ),
                    None,
                )
                if row is None:
                    continue
                y = i + (2 * j + k - len(windows) + 0.5) * height
                color = colors[recall][j]
                label = f"{window // 1000}k, recall {'on' if recall else 'off'}" if i == 0 else None
                axes[0].barh(y, 100 * row.share, height=height, color=color, label=label)
                axes[1].barh(y, row.cost, height=height, color=color)
    axes[0].set_yticks(range(len(names)), names)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("needed facts available at need time (%)")
    axes[0].set_xlim(0, 100)
    axes[0].axvline(99, color="#666", lw=0.8, ls="--")
    axes[1].set_xlabel("billed input cost with prompt caching ($, all sessions)")
    fig.legend(loc="lower center", ncol=2 * len(windows), fontsize=9, frameon=False)
    fig.suptitle("Quality benchmark: what the model can still see, and what it costs")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def chosen_subjects(
    peers: bool, text: str | Sequence[str] | None, frameworks: bool = False, offload: bool = False
) -> list[Subject]:
    """The subjects a run replays: all of them (the framework subjects with
    ``frameworks``), or those whose label contains ``text`` (one of the texts)."""
    texts = [text] if isinstance(text, str) else list(text or ())
    return [
        s
        for s in subjects(peers=peers, frameworks=frameworks, offload=offload)
        if not texts or any(t in s.label for t in texts)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sessions (a minute)")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    parser.add_argument("--plot", type=Path, help="write the chart to this PNG")
    parser.add_argument("--no-peers", action="store_true", help="leave LangChain and Strands out")
    parser.add_argument(
        "--frameworks",
        action="store_true",
        help="also the Strands, LlamaIndex and Google ADK subjects: Normandy's adapters "
        "and the frameworks' own managers (issue 37)",
    )
    parser.add_argument(
        "--offload",
        action="store_true",
        help="also offload at arrival: clear_tool_results' offload_tokens and Strands' "
        "ContextOffloader in Strands' own loop (issue 35 item 3)",
    )
    parser.add_argument(
        "--dump-sessions", type=Path, metavar="DIR", help="write each session as JSON to DIR"
    )
    parser.add_argument(
        "--subject",
        metavar="TEXT",
        action="append",
        help="only the subjects whose label contains TEXT (e.g. summarize); repeatable, "
        "a subject matching any of them runs",
    )
    args = parser.parse_args(argv)
    chosen = chosen_subjects(
        peers=not args.no_peers, text=args.subject, frameworks=args.frameworks, offload=args.offload
    )
    if not chosen:  # before the sessions are built or dumped: nothing is written
        shown = args.subject[0] if len(args.subject) == 1 else args.subject
        parser.error(f"--subject {shown!r}: no subject's label contains it")
    sessions = default_sessions(quick=args.quick)
    if args.dump_sessions:
        args.dump_sessions.mkdir(parents=True, exist_ok=True)
        for n, s in enumerate(sessions):
            dump(s, args.dump_sessions / f"session-{n}.json")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="normandy-quality-") as tmp:
        runs = run_all(sessions, chosen, WINDOWS, Path(tmp))
    rows = aggregate(runs)
    text = tables(rows, sessions) + "\n\n" + timing_table(rows, sessions)
    footer = (
        f"\n\n`python -m benchmarks.quality{' --quick' if args.quick else ''}"
        f"{' --no-peers' if args.no_peers else ''}"
        f"{' --frameworks' if args.frameworks else ''}"
        f"{' --offload' if args.offload else ''}"
        f"{''.join(f' --subject {t!r}' for t in args.subject or ())}` at commit "
        f"{_commit()}, {time.perf_counter() - started:.0f} s."
    )
    print(text + footer)
    if args.out:
        args.out.write_text(text + footer + "\n", encoding="utf-8")
    if args.plot:
        plot(rows, args.plot)
    return 0

"""``normandy demo``: the presentation of :func:`normandy_core.app.demo.replay`.

A progress bar on stderr, one line per compaction, a closing table, and a chart of the
context size per boundary: a PNG with ``--plot PATH`` (matplotlib, the ``plot`` extra)
or a terminal sparkline.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from normandy_core.app.console import ProgressBar, format_table, sparkline
from normandy_core.app.demo import Boundary, DemoReport, load_session, replay

__all__ = ["plot_report", "run_demo", "summary_rows"]


def _pct(part: float, whole: float | None) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def summary_rows(report: DemoReport, reference_window: int | None = None) -> list[list[str]]:
    """The closing table's rows: ``[metric, value]``.

    ``reference_window`` is the window a compactor that needs none (``noop``) is compared
    with, to show what the session would have sent without compaction.
    """
    comps = report.compactions
    starts = sum(1 for b in report.boundaries if not b.mid_round)
    window = report.window
    before = sum(b.before for b in comps)
    after = sum(b.after for b in comps)
    history = report.final_tokens + report.tokens_removed
    rows: list[list[str]] = [
        [
            "boundaries",
            f"{len(report.boundaries):,} ({starts} turn starts, "
            f"{report.batches} after tool batches)",
        ],
        [
            "compactions",
            f"{len(comps):,}" + (f" ({len(report.errors)} errors)" if report.errors else ""),
        ],
        [
            "tokens before -> after",
            f"{before // len(comps):,} -> {after // len(comps):,} per compaction on average"
            if comps
            else "-",
        ],
        ["entries dropped", f"{report.dropped:,}"],
        [
            "peak context sent",
            f"{report.peak:,} of a {window:,}-token window ({_pct(report.peak, window)})"
            if window
            else f"{report.peak:,}"
            + (
                f" ({report.peak / reference_window:.1f}x a {reference_window:,}-token "
                "window: the request would be refused)"
                if reference_window and report.peak > reference_window
                else ""
            ),
        ],
        [
            "history replayed",
            f"{history:,} tokens" + (f" ({history / window:.1f}x the window)" if window else ""),
        ],
        [
            "time compacting",
            f"{report.compact_seconds * 1000:,.0f} ms "
            f"({report.compact_seconds * 1e6 / max(len(report.boundaries), 1):,.0f} µs per "
            f"boundary); replay {report.total_seconds:.2f} s",
        ],
    ]
    if report.billed:
        rows.append(["input cost (cache-aware)", _cost_text(report)])
    if report.thinking_disabled:
        rows.append(
            [
                "thinking disabled",
                f"{report.thinking_disabled} model calls (the rest of a round whose thinking "
                "a mid-round compaction stripped)",
            ]
        )
    if comps:
        rows.insert(
            5,
            [
                "peak before compaction",
                f"{report.peak_before:,} (a tool batch may overshoot; "
                "the boundary brings it back before the next call)",
            ],
        )
    return rows


def _money(report: DemoReport, value: float) -> str:
    return f"${value:,.2f}" if report.input_price else f"{value:,.0f} billed tokens"


def _cost_text(report: DemoReport) -> str:
    """The closing table's cost row: cumulative input cost with prompt caching."""
    calls = len(report.billed)
    rates = f"cache read {report.cache_read:.3g}x, write {report.cache_write:.3g}x"
    price = f" at ${report.input_price:g}/M input, {rates}" if report.input_price else f", {rates}"
    return (
        f"{_money(report, report.cost)} over {calls:,} model calls{price} "
        f"({_money(report, report.uncached_cost)} without caching)"
    )


def _compaction_line(b: Boundary) -> str:
    where = f"turn {b.turn:>2} " + ("after a tool batch" if b.mid_round else "at turn start   ")
    meta = b.meta
    strategy = meta.get("strategy", "?")
    extra = ""
    if meta.get("shortened"):
        extra = f", {len(meta['shortened'])} tool results shortened"
    if "summary_id" in meta:
        extra += ", summary inserted"
    return (
        f"  compaction {where}: {b.before:>7,} -> {b.after:>7,} tokens "
        f"({strategy}, {int(meta.get('dropped_count', 0)):>3} entries dropped{extra})"
    )


def run_demo(args: argparse.Namespace, opts: dict[str, Any]) -> int:
    """Replay the bundled session with ``args.compactor`` and ``opts``; print the report."""
    session = load_session()
    window = opts.get("context_window", args.window)
    turns = session.turns if args.turns is None else session.turns[: args.turns]
    batches = sum(len(t.replies) - 1 for t in turns)
    desc = args.compactor + (
        " " + " ".join(f"{k}={v}" for k, v in sorted(opts.items())) if opts else ""
    )
    print(
        f"Replaying a recorded coding-agent session: {len(turns)} turns, {batches} tool "
        f"batches, through normandy_core.turn.run_turn\nwith compactor {desc} and model "
        f"{args.model}" + (f", against a {window:,}-token window." if window else ".")
    )
    bar = ProgressBar(batches, label="replaying", enabled=args.progress)

    def on_boundary(b: Boundary, done: int, total: int) -> None:
        if b.compacted and not args.quiet:
            bar.write(_compaction_line(b))
        elif "error" in b.meta:
            bar.write(f"  compactor error at turn {b.turn}: {b.meta['error']}")
        bar.update(done, f"context {b.after:,}")

    report = replay(
        session,
        compactor=args.compactor,
        opts=opts,
        window=args.window,
        model=args.model,
        turns=args.turns,
        on_boundary=on_boundary,
        survival=getattr(args, "survival", None),
    )
    bar.close()
    print()
    print(format_table(summary_rows(report, args.window), ["", "result"]))
    print()
    print(_chart_text(report))
    if args.plot:
        try:
            path = plot_report(report, args.plot)
        except ModuleNotFoundError:
            print(
                "normandy demo: --plot needs matplotlib: pip install 'normandy-core[plot]'",
                file=sys.stderr,
            )
            return 2
        print(f"\nchart written to {path}")
    _print_hooks(report)
    return 1 if report.errors else 0


def _print_hooks(report: DemoReport) -> None:
    """Say which after_compact hooks saw the dropped entries (nothing is lost silently)."""
    from normandy_core.contract.plugins import list_plugins

    hooks = [r.name for r in list_plugins() if r.kind == "hook" and r.status == "loaded"]
    dropped = report.dropped
    if not hooks or not dropped:
        return
    print(f"after_compact hooks that received the {dropped:,} dropped entries: {', '.join(hooks)}")
    path = os.environ.get("NORMANDY_ARCHIVE_PATH")
    if "archive" in hooks and path:
        print(
            f"every dropped entry is recallable from {path}, for example:\n"
            f"  normandy archive --path {path} search rounding"
        )


def _chart_text(report: DemoReport) -> str:
    values = [b.before for b in report.boundaries]
    top = max([*values, report.window or 0]) or 1
    line = sparkline(values, width=72, top=top)
    text = f"context per boundary (before compaction; full block = {top:,} tokens):\n{line}"
    cumulative = report.cumulative_cost
    if cumulative:
        spent = sparkline(cumulative, width=72, top=cumulative[-1] or 1)
        text += (
            f"\ncumulative input cost per call (full block = "
            f"{_money(report, cumulative[-1])}):\n{spent}"
        )
    return text


def plot_report(report: DemoReport, path: str | Path) -> Path:
    """Write a PNG of the context size per boundary, compactions marked; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    xs: list[float] = []
    ys: list[float] = []
    for b in report.boundaries:
        xs += [b.index, b.index]
        ys += [b.before / 1000, b.after / 1000]
    comps = report.compactions
    fig, ax = plt.subplots(figsize=(11, 5.2), dpi=150)
    ax.fill_between(xs, ys, color="#4C72B0", alpha=0.12, linewidth=0)
    ax.plot(xs, ys, color="#4C72B0", linewidth=1.3, label="context sent to the model")
    if report.window:
        ax.axhline(report.window / 1000, color="#C44E52", linestyle="--", linewidth=1.4)
        ax.text(
            0.995,
            report.window / 1000,
            f"window {report.window:,}",
            transform=ax.get_yaxis_transform(),
            ha="right",
            va="bottom",
            color="#C44E52",
            fontsize=9,
        )
    threshold = _trigger_line(report)
    if threshold is not None:
        ax.axhline(threshold / 1000, color="#8C8C8C", linestyle=":", linewidth=1.2)
        ax.text(
            0.995,
            threshold / 1000,
            f"compaction threshold {threshold:,}",
            transform=ax.get_yaxis_transform(),
            ha="right",
            va="top",
            color="#6B6B6B",
            fontsize=8.5,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5},
            zorder=5,
        )
    for b in comps:
        ax.vlines(b.index, b.after / 1000, b.before / 1000, color="#DD8452", linewidth=1.8)
    ax.scatter(
        [b.index for b in comps],
        [b.before / 1000 for b in comps],
        marker="v",
        s=26,
        color="#DD8452",
        zorder=3,
    )
    starts = [b.index for b in report.boundaries if not b.mid_round]
    for s in starts:
        ax.axvline(s, color="#999999", linewidth=0.4, alpha=0.35, zorder=0)
    strategy = next((str(b.meta.get("strategy")) for b in comps if b.meta.get("strategy")), "")
    title = f"{report.compactor}" + (f" ({strategy})" if strategy else "")
    ax.set_title(
        f"Context size per boundary: {len(report.boundaries)} boundaries, "
        f"{len(comps)} compactions, {title}",
        fontsize=12,
        loc="left",
    )
    ax.set_xlabel("boundary (turn starts and tool batches, in order; grey lines mark turns)")
    ax.set_ylabel("tokens (thousands)")
    ax.set_xlim(0, max(len(report.boundaries) - 1, 1))
    ax.set_ylim(0, max([y for y in ys] + [(report.window or 0) / 1000]) * 1.12)
    ax.grid(axis="y", alpha=0.3)
    for side in ("top", "right") if not report.billed else ("top",):
        ax.spines[side].set_visible(False)
    handles = [
        Line2D([], [], color="#4C72B0", linewidth=1.5, label="context (prompt + history)"),
        Line2D([], [], color="#DD8452", marker="v", linewidth=1.8, label="compaction"),
    ]
    if report.window:
        handles.append(Line2D([], [], color="#C44E52", linestyle="--", label="context window"))
    cumulative = report.cumulative_cost
    if cumulative:
        # calls and boundaries pair one to one: each boundary precedes one model call
        cost_ax = ax.twinx()
        calls = list(range(len(cumulative)))
        cost_ax.plot(calls, cumulative, color="#55A868", linewidth=1.6)
        cost_ax.set_ylabel(
            "cumulative input cost ($)" if report.input_price else "cumulative billed tokens"
        )
        cost_ax.set_ylim(0, max(cumulative[-1], 1e-9) * 1.12)
        cost_ax.spines["top"].set_visible(False)
        handles.append(
            Line2D(
                [],
                [],
                color="#55A868",
                linewidth=1.6,
                label=f"cumulative cost ({_money(report, report.cost)})",
            )
        )
    ax.legend(handles=handles, loc="upper left", frameon=False, fontsize=9, ncol=4)
    history = report.final_tokens + report.tokens_removed
    ax.text(
        0.99,
        0.02,
        f"history replayed: {history:,} tokens; peak sent {report.peak:,}; "
        f"{report.dropped:,} entries dropped",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=8.5,
        color="#555555",
    )
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _trigger_line(report: DemoReport) -> int | None:
    """The context level at which ``window_manager`` compacts, when that is the compactor."""
    if report.compactor != "window_manager" or not report.window:
        return None
    if report.opts.get("schedule") == "cost":
        return None  # it compacts by cost, not at a threshold
    reserved = int(report.opts.get("reserved_tokens", 4096))
    trigger = float(report.opts.get("trigger", 1.0))
    return int(trigger * (report.window - reserved))

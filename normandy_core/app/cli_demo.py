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
from typing import TYPE_CHECKING, Any

from normandy_core.app.console import ProgressBar, format_table, marks, sparkline
from normandy_core.app.demo import Boundary, DemoReport, load_session, replay

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D

__all__ = ["plot_report", "run_demo", "summary_rows"]


def _pct(part: float, whole: float | None) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def summary_rows(report: DemoReport, reference_window: int | None = None) -> list[list[str]]:
    """The closing table's rows: ``[metric, value]``.

    ``reference_window`` is the window a compactor that needs none (``noop``) is compared
    with, to show what the session would have sent without compaction.
    """
    compactions = report.compactions
    errors = f" ({len(report.errors)} errors)" if report.errors else ""
    rows: list[list[str]] = [
        ["boundaries", _boundaries_text(report)],
        ["compactions", f"{len(compactions):,}{errors}"],
        ["tokens before -> after", _average_text(compactions)],
        ["entries dropped", f"{report.dropped:,}"],
        ["peak context sent", _peak_text(report, reference_window)],
    ]
    if compactions:
        rows.append(
            [
                "peak before compaction",
                f"{report.peak_before:,} (a tool batch may overshoot; "
                "the boundary brings it back before the next call)",
            ]
        )
    rows += [
        ["history replayed", _history_text(report)],
        ["time compacting", _time_text(report)],
    ]
    if report.billed:
        rows.append(["input cost (cache-aware)", _cost_text(report)])
    if report.billed:
        rows.append(["thinking disabled", _thinking_text(report)])
    return rows


def _thinking_text(report: DemoReport) -> str:
    """The calls sent with thinking disabled, of all the calls, and the mid-round
    compactions that stripped it."""
    calls = len(report.billed)
    stripped = sum(1 for b in report.compactions if b.mid_round and b.thinking_stripped)
    disabled = report.thinking_disabled
    text = f"{disabled:,} of {calls:,} model calls ({_pct(disabled, calls)})"
    if disabled:
        text += (
            f": the rest of a round whose thinking a mid-round compaction stripped "
            f"({stripped} mid-round compaction{'s' if stripped != 1 else ''} stripped it)"
        )
    return text


def _boundaries_text(report: DemoReport) -> str:
    """How many boundaries, at turn starts and after tool batches."""
    starts = sum(1 for boundary in report.boundaries if not boundary.mid_round)
    return f"{len(report.boundaries):,} ({starts} turn starts, {report.batches} after tool batches)"


def _average_text(compactions: list[Boundary]) -> str:
    """The context before and after a compaction, on average (``-`` without any)."""
    if not compactions:
        return "-"
    before = sum(boundary.before for boundary in compactions) // len(compactions)
    after = sum(boundary.after for boundary in compactions) // len(compactions)
    return f"{before:,} -> {after:,} per compaction on average"


def _peak_text(report: DemoReport, reference_window: int | None) -> str:
    """The largest context sent, against the window (or the reference window it exceeds)."""
    window = report.window
    if window:
        return f"{report.peak:,} of a {window:,}-token window ({_pct(report.peak, window)})"
    if reference_window and report.peak > reference_window:
        return (
            f"{report.peak:,} ({report.peak / reference_window:.1f}x a {reference_window:,}-token "
            "window: the request would be refused)"
        )
    return f"{report.peak:,}"


def _history_text(report: DemoReport) -> str:
    """The tokens the whole session held, also as a multiple of the window."""
    history = report.final_tokens + report.tokens_removed
    window = report.window
    return f"{history:,} tokens" + (f" ({history / window:.1f}x the window)" if window else "")


def _time_text(report: DemoReport) -> str:
    """The time the boundaries took, in all and per boundary, beside the replay's."""
    per_boundary = report.compact_seconds * 1e6 / max(len(report.boundaries), 1)
    return (
        f"{report.compact_seconds * 1000:,.0f} ms ({per_boundary:,.0f} µs per boundary); "
        f"replay {report.total_seconds:.2f} s"
    )


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


def _compaction_line(boundary: Boundary) -> str:
    """The line ``normandy demo`` prints for a compaction."""
    where = f"turn {boundary.turn:>2} " + (
        "after a tool batch" if boundary.mid_round else "at turn start   "
    )
    meta = boundary.meta
    strategy = meta.get("strategy", "?")
    extra = ""
    if meta.get("shortened"):
        extra = f", {len(meta['shortened'])} tool results shortened"
    if "summary_id" in meta:
        extra += ", summary inserted"
    if boundary.mid_round and boundary.thinking_stripped:
        extra += ", thinking stripped: the round goes on without it"
    return (
        f"  compaction {where}: {boundary.before:>7,} -> {boundary.after:>7,} tokens "
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

    def on_boundary(boundary: Boundary, done: int, total: int) -> None:
        if boundary.compacted and not args.quiet:
            bar.write(_compaction_line(boundary))
        elif "error" in boundary.meta:
            bar.write(f"  compactor error at turn {boundary.turn}: {boundary.meta['error']}")
        bar.update(done, f"context {boundary.after:,}")

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
    disabled = [b.thinking_disabled for b in report.boundaries]
    if any(disabled):
        text += (
            "\nthinking disabled (! = the call after a boundary in that column went without "
            f"thinking; {report.thinking_disabled:,} calls):\n{marks(disabled, width=72)}"
        )
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

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(11, 5.2), dpi=150)
    context = _plot_context(ax, report)
    _plot_levels(ax, report)
    _plot_compactions(ax, report)
    _plot_thinking(ax, report)
    _label_axes(ax, report, context)
    handles = _legend_handles(report)
    cost = _plot_cost(ax, report)
    if cost is not None:
        handles.append(cost)
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


#: The colour of the calls sent with thinking disabled.
_THINKING = "#8172B2"


def _plot_context(ax: Axes, report: DemoReport) -> list[float]:
    """The context before and after each boundary, a saw-tooth; returns its heights
    (thousands of tokens)."""
    indexes: list[float] = []
    context: list[float] = []
    for boundary in report.boundaries:
        indexes += [boundary.index, boundary.index]
        context += [boundary.before / 1000, boundary.after / 1000]
    ax.fill_between(indexes, context, color="#4C72B0", alpha=0.12, linewidth=0)
    ax.plot(indexes, context, color="#4C72B0", linewidth=1.3, label="context sent to the model")
    return context


def _plot_levels(ax: Axes, report: DemoReport) -> None:
    """The window and the compaction threshold, as labelled horizontal lines."""
    if report.window:
        ax.axhline(report.window / 1000, color="#C44E52", linestyle="--", linewidth=1.4)
        _label_level(
            ax, report.window, f"window {report.window:,}", va="bottom", color="#C44E52", fontsize=9
        )
    threshold = _trigger_line(report)
    if threshold is not None:
        ax.axhline(threshold / 1000, color="#8C8C8C", linestyle=":", linewidth=1.2)
        _label_level(
            ax,
            threshold,
            f"compaction threshold {threshold:,}",
            va="top",
            color="#6B6B6B",
            fontsize=8.5,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5},
            zorder=5,
        )


def _label_level(ax: Axes, tokens: int, text: str, **style: Any) -> None:
    """``text`` at the right end of the horizontal line at ``tokens``."""
    ax.text(0.995, tokens / 1000, text, transform=ax.get_yaxis_transform(), ha="right", **style)


def _plot_compactions(ax: Axes, report: DemoReport) -> None:
    """Each compaction as a drop from before to after; each turn start as a grey line."""
    compactions = report.compactions
    for boundary in compactions:
        ax.vlines(
            boundary.index,
            boundary.after / 1000,
            boundary.before / 1000,
            color="#DD8452",
            linewidth=1.8,
        )
    ax.scatter(
        [boundary.index for boundary in compactions],
        [boundary.before / 1000 for boundary in compactions],
        marker="v",
        s=26,
        color="#DD8452",
        zorder=3,
    )
    for boundary in report.boundaries:
        if not boundary.mid_round:
            ax.axvline(boundary.index, color="#999999", linewidth=0.4, alpha=0.35, zorder=0)


def _plot_thinking(ax: Axes, report: DemoReport) -> None:
    """A tick on the axis under each boundary whose call went without thinking."""
    disabled = [boundary.index for boundary in report.boundaries if boundary.thinking_disabled]
    if disabled:
        ax.scatter(
            disabled,
            [0.0] * len(disabled),
            marker="|",
            s=60,
            color=_THINKING,
            clip_on=False,
            zorder=4,
        )


def _label_axes(ax: Axes, report: DemoReport, context: list[float]) -> None:
    """The title, the axes' labels and limits, the grid and the frame."""
    compactions = report.compactions
    strategy = next(
        (
            str(boundary.meta.get("strategy"))
            for boundary in compactions
            if boundary.meta.get("strategy")
        ),
        "",
    )
    title = f"{report.compactor}" + (f" ({strategy})" if strategy else "")
    ax.set_title(
        f"Context size per boundary: {len(report.boundaries)} boundaries, "
        f"{len(compactions)} compactions, {title}",
        fontsize=12,
        loc="left",
    )
    ax.set_xlabel("boundary (turn starts and tool batches, in order; grey lines mark turns)")
    ax.set_ylabel("tokens (thousands)")
    ax.set_xlim(0, max(len(report.boundaries) - 1, 1))
    ax.set_ylim(0, max([*context, (report.window or 0) / 1000]) * 1.12)
    ax.grid(axis="y", alpha=0.3)
    for side in ("top", "right") if not report.billed else ("top",):
        ax.spines[side].set_visible(False)


def _legend_handles(report: DemoReport) -> list[Line2D]:
    """The legend's entries for the context, the compactions and the window."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color="#4C72B0", linewidth=1.5, label="context (prompt + history)"),
        Line2D([], [], color="#DD8452", marker="v", linewidth=1.8, label="compaction"),
    ]
    if report.window:
        handles.append(Line2D([], [], color="#C44E52", linestyle="--", label="context window"))
    if report.thinking_disabled:
        label = f"call without thinking ({report.thinking_disabled:,} of {len(report.billed):,})"
        handles.append(Line2D([], [], color=_THINKING, marker="|", linestyle="none", label=label))
    return handles


def _plot_cost(ax: Axes, report: DemoReport) -> Line2D | None:
    """The cumulative input cost on a second axis, when the replay billed its calls;
    returns its legend entry."""
    from matplotlib.lines import Line2D

    cumulative = report.cumulative_cost
    if not cumulative:
        return None
    # calls and boundaries pair one to one: each boundary precedes one model call
    cost_ax = ax.twinx()
    calls = list(range(len(cumulative)))
    cost_ax.plot(calls, cumulative, color="#55A868", linewidth=1.6)
    cost_ax.set_ylabel(
        "cumulative input cost ($)" if report.input_price else "cumulative billed tokens"
    )
    cost_ax.set_ylim(0, max(cumulative[-1], 1e-9) * 1.12)
    cost_ax.spines["top"].set_visible(False)
    return Line2D(
        [],
        [],
        color="#55A868",
        linewidth=1.6,
        label=f"cumulative cost ({_money(report, report.cost)})",
    )


def _trigger_line(report: DemoReport) -> int | None:
    """The context level at which ``window_manager`` compacts, when that is the compactor."""
    if report.compactor != "window_manager" or not report.window:
        return None
    if report.opts.get("schedule") == "cost":
        return None  # it compacts by cost, not at a threshold
    reserved = int(report.opts.get("reserved_tokens", 4096))
    trigger = float(report.opts.get("trigger", 1.0))
    return int(trigger * (report.window - reserved))

"""Session cost with prompt caching, per strategy, schedule and window (issue 17).

    NORMANDY_ARCHIVE_PATH=/tmp/bench-archive.sqlite3 \\
        uv run --no-sync python -m benchmarks.cost [--windows 48000 128000] [--out FILE]

Two parts, both deterministic (counts, not timings), both billing every model call against
the one before it (:mod:`normandy_core.conversation.cost`: the unchanged prefix read at 0.1x the
input price, the rest written at 1.25x; Claude Sonnet 4.5's $3/M input):

* **planted** (``--parts planted``): each configuration replays a session through the real
  turn loop (:func:`normandy_core.app.demo.replay`). Sessions: the bundled demo session
  (seed 7) and one generated with seed 11, with planted facts: a fact line is added to a
  user message or a tool output, and *needed* 5, 15, 30 or 60 calls later; a fact counts
  as available when the call at need time was sent its text (no recall).
* **quality** (``--parts quality``): the quality benchmark's sessions (two generated
  ~1,000-message sessions and the demo session, :func:`benchmarks.quality.sessions.
  default_sessions`) replayed by :func:`benchmarks.quality.replay.replay`, facts counted
  its way: in context, in a marker or summary, or returned by the model's ``recall`` query
  against a real SQLite archive (recall on and off for Normandy's compactors).

Beside Normandy's compactors, on the same calls: LangChain's ``trim_messages`` (per call,
on the full history, as its docs show) and Strands' ``SlidingWindowConversationManager``
(proactive compression and the reduce-and-retry of its event loop). The tables say whether
``schedule="cost"`` meets the issue's target against the default on each run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any

from normandy_core import Entry
from normandy_core.app.demo import DemoSession, DemoTurn, load_session, replay
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session
from normandy_core.conversation.cost import DEFAULT_RATES, billed
from normandy_core.transcripts.anthropic import block_to_anthropic

PRICE = 3.0  # claude-sonnet-4-5, dollars per million input tokens
DELAYS = (5, 15, 30, 60)


def configs(window: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (compactor, options) at ``window``; ``clear_tool_results`` clears from 60 %
    of the window (its default trigger, 100,000 tokens, is over a 48,000-token window)."""
    clear = {"trigger_tokens": int(0.6 * window)}
    return {
        "window_manager (default: threshold, target 0.6)": ("window_manager", {}),
        "window_manager schedule=cost": ("window_manager", {"schedule": "cost"}),
        "window_manager schedule=cost horizon=10": (
            "window_manager",
            {"schedule": "cost", "horizon": 10},
        ),
        "window_manager schedule=cost target=0.6": (
            "window_manager",
            {"schedule": "cost", "target": 0.6},
        ),
        "window_manager target=0.4": ("window_manager", {"target": 0.4}),
        "window_manager schedule=cost target=0.4": (
            "window_manager",
            {"schedule": "cost", "target": 0.4},
        ),
        "window_manager trigger=0.9 target=0.9": (
            "window_manager",
            {"target": 0.9, "trigger": 0.9},
        ),
        "clear_tool_results (trigger 0.6 window)": ("clear_tool_results", clear),
        "clear_tool_results schedule=cost": ("clear_tool_results", {**clear, "schedule": "cost"}),
        "pipeline clear -> window_manager": (
            "pipeline",
            {
                "steps": [
                    {"compactor": "clear_tool_results", "opts": clear},
                    {"compactor": "window_manager", "opts": {}},
                ]
            },
        ),
        "pipeline clear -> window_manager schedule=cost": (
            "pipeline",
            {
                "schedule": "cost",
                "steps": [
                    {"compactor": "clear_tool_results", "opts": clear},
                    {"compactor": "window_manager", "opts": {}},
                ],
            },
        ),
    }


@dataclasses.dataclass
class Facts:
    """Planted facts: where each is planted (call index) and its text."""

    planted: list[tuple[int, str]]
    needed: dict[int, list[str]]  # call index -> fact texts needed then


def generated_session(seed: int, messages: int = 1000) -> DemoSession:
    """A session of ``generate_session(seed)`` in the demo's recorded form."""
    memory = generate_session(seed, messages=messages)
    turns: list[DemoTurn] = []
    current: dict[str, Any] | None = None
    for e in memory.entries():
        if e.role == "system":
            continue
        if e.role == "user" and isinstance(e.content, str):
            if current is not None:
                turns.append(_turn(current))
            current = {"turn_id": e.turn_id, "user": e.content, "replies": [], "outputs": []}
            continue
        assert current is not None
        if e.role == "assistant":
            current["replies"].append({"content": [block_to_anthropic(b) for b in e.blocks]})
        else:
            for r in e.tool_results:
                current["outputs"].append(
                    {"tool_use_id": r.tool_use_id, "content": r.text(), "is_error": r.is_error}
                )
    if current is not None:
        turns.append(_turn(current))
    # a turn must end with a reply that calls no tool
    return DemoSession(SYSTEM_PROMPT, tuple(TOOLS), tuple(t for t in turns if _complete(t)))


def _turn(rec: dict[str, Any]) -> DemoTurn:
    return DemoTurn(rec["turn_id"], rec["user"], tuple(rec["replies"]), tuple(rec["outputs"]))


def _complete(turn: DemoTurn) -> bool:
    last = turn.replies[-1]["content"] if turn.replies else []
    return bool(turn.replies) and not any(b.get("type") == "tool_use" for b in last)


def plant(session: DemoSession, seed: int) -> tuple[DemoSession, Facts]:
    """``session`` with a fact in every other turn's user message or first tool output."""
    rng = random.Random(seed)
    turns: list[DemoTurn] = []
    planted: list[tuple[int, str]] = []
    needed: dict[int, list[str]] = {}
    call = 0
    for n, t in enumerate(session.turns):
        user, outputs = t.user, list(t.outputs)
        if n % 2 == 0 and n > 0:
            fact = f"FACT-{n:03d}: the release key is {rng.getrandbits(40):010x}"
            if n % 4 == 0 or not outputs:
                user = f"{user}\n{fact}"
                at = call
            else:
                outputs[0] = {**outputs[0], "content": f"{outputs[0]['content']}\n{fact}"}
                at = call + 1
            planted.append((at, fact))
            for d in DELAYS:
                needed.setdefault(at + d, []).append(fact)
        turns.append(DemoTurn(t.turn_id, user, t.replies, tuple(outputs)))
        call += len(t.replies)
    return DemoSession(session.system, session.tools, tuple(turns)), Facts(planted, needed)


def _texts(messages: Sequence[Any]) -> str:
    parts: list[str] = []
    for e in messages:
        parts.append(e.text() if hasattr(e, "text") else str(e))
        for b in getattr(e, "tool_results", ()):
            parts.append(b.text())
    return "\n".join(parts)


@dataclasses.dataclass
class Row:
    """One configuration's figures on one session and window."""

    name: str
    cost: float
    compactions: int
    peak: int
    over: int
    facts: int
    facts_total: int
    cumulative: list[float] = dataclasses.field(default_factory=list)
    #: Model calls sent with thinking disabled (``None``: a peer, which runs no turn loop).
    thinking_disabled: int | None = None
    #: Model calls in all.
    calls: int = 0

    def thinking_text(self) -> str:
        """The calls sent with thinking disabled, of all calls (``-`` for a peer)."""
        if self.thinking_disabled is None:
            return "-"
        share = 100 * self.thinking_disabled / self.calls if self.calls else 0.0
        return f"{self.thinking_disabled} of {self.calls} ({share:.1f} %)"


def run_config(name: str, session: DemoSession, facts: Facts, window: int) -> Row:
    """Replay ``session`` with configuration ``name`` at ``window`` and bill it."""
    compactor, opts = configs(window)[name]
    found = 0
    total = 0

    def on_call(index: int, messages: Sequence[Any]) -> None:
        nonlocal found, total
        wanted = facts.needed.get(index)
        if not wanted:
            return
        text = _texts(messages)
        for f in wanted:
            total += 1
            found += f in text

    report = replay(session, compactor=compactor, opts=opts, window=window, on_call=on_call)
    if report.errors:
        raise RuntimeError(f"{name}: {report.errors[0].meta.get('error')}")
    reserved = int(opts.get("reserved_tokens", 4096))
    over = sum(1 for s in report.sent if s > window - reserved)
    return Row(
        name,
        report.cost,
        len(report.compactions),
        max(report.sent),
        over,
        found,
        total,
        report.cumulative_cost,
        thinking_disabled=report.thinking_disabled,
        calls=len(report.billed),
    )


def run_langchain(session: DemoSession, facts: Facts, window: int) -> Row | None:
    """``trim_messages`` before every call on the no-compaction replay's requests."""
    try:
        from langchain_core.messages import trim_messages
    except ImportError:
        return None
    from benchmarks.peers import _lc_convert, _lc_exact_counter

    requests: list[tuple[Entry, ...]] = []
    replay(
        session,
        compactor="noop",
        window=None,
        on_call=lambda _i, msgs: requests.append(tuple(msgs)),
    )
    prompt = _prompt(session)
    budget = window - 4096 - prompt
    cost = 0.0
    cumulative: list[float] = []
    previous: list[Any] = []
    found = total = 0
    peak = over = 0
    exact = _lc_exact_counter()
    # Without compaction each request extends the one before: convert the last once and
    # take each request's messages as a prefix of it; count each message once.
    per, back = _lc_convert(requests[-1])
    ends: list[int] = []
    n = 0
    for group in per:
        n += len(group)
        ends.append(n)
    flat_all = [m for group in per for m in group]
    sizes: dict[int, int] = {}

    def lc_count(messages: Sequence[Any]) -> int:
        out = 0
        for m in messages:
            hit = sizes.get(id(m))
            if hit is None:
                hit = sizes[id(m)] = exact([m])
            out += hit
        return out

    for i, msgs in enumerate(requests):
        flat = flat_all[: ends[len(msgs) - 1]]
        view = trim_messages(
            flat,
            max_tokens=budget,
            token_counter=lc_count,
            strategy="last",
            include_system=True,
            start_on="human",
            end_on=("human", "tool"),
            allow_partial=False,
        )
        kept = [back[id(m)] for m in view if id(m) in back]
        sent_keys = [(e.id, part) for e, part in kept]
        size = prompt + lc_count(view)
        same = 0
        for a, b in zip(previous, sent_keys, strict=False):
            if a != b:
                break
            same += 1
        cached_tokens = 0
        if previous:
            cached_tokens = prompt + lc_count(view[:same])
        cost += billed(cached_tokens, size, DEFAULT_RATES)
        cumulative.append(cost * PRICE / 1e6)
        previous = sent_keys
        peak = max(peak, size)
        over += size > window - 4096
        wanted = facts.needed.get(i)
        if wanted:
            text = "\n".join(str(m.content) for m in view)
            for f in wanted:
                total += 1
                found += f in text
    return Row(
        "LangChain trim_messages (per call)",
        cost * PRICE / 1e6,
        len(requests),
        peak,
        over,
        found,
        total,
        cumulative,
    )


def run_strands(session: DemoSession, facts: Facts, window: int) -> Row | None:
    """Strands' ``SlidingWindowConversationManager`` before every call, fed the messages of
    the no-compaction replay as an agent appends them (the quality benchmark's driver)."""
    try:
        import strands  # noqa: F401
    except ImportError:
        return None
    import json

    from benchmarks.quality.replay import RESERVED, Billing, _strands
    from normandy_core import get_counter

    requests: list[tuple[Entry, ...]] = []
    replay(
        session,
        compactor="noop",
        window=None,
        on_call=lambda _i, msgs: requests.append(tuple(msgs)),
    )
    counter = get_counter("cl100k_base")
    fixed = counter.count_text(session.system) + counter.count_text(json.dumps(session.tools))
    bill = Billing(counter, fixed)
    fit = _strands(window, window - RESERVED - fixed, counter, fixed)
    cumulative: list[float] = []
    found = total = over = reductions = 0
    seen = 0
    for i, msgs in enumerate(requests):
        body = [e for e in msgs if e.role != "system"]
        view, n = fit(list(body[seen:]))
        seen = len(body)
        reductions += n
        size = bill.request(view)
        cumulative.append(bill.cost)
        over += size > window - RESERVED
        wanted = facts.needed.get(i)
        if wanted:
            text = _texts(view)
            for f in wanted:
                total += 1
                found += f in text
    return Row(
        "Strands SlidingWindowConversationManager",
        bill.cost,
        reductions,
        bill.peak,
        over,
        found,
        total,
        cumulative,
    )


def _prompt(session: DemoSession) -> int:
    from normandy_core import AgentConfig

    return AgentConfig(system_prompt=session.system, tools=session.tools).prompt_tokens


def plot(rows: Sequence[Row], title: str, path: str) -> None:
    """Cumulative input cost per call of each configuration (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.2), dpi=120)
    for r in rows:
        ax.plot(range(1, len(r.cumulative) + 1), r.cumulative, linewidth=1.4, label=r.name)
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel("model call")
    ax.set_ylabel("cumulative input cost ($, cache-aware)")
    ax.grid(alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def table(rows: Sequence[Row], baseline: str) -> str:
    base = next(r for r in rows if r.name == baseline)
    out = [
        "| configuration | input cost | vs default | compactions | peak sent | over window "
        "| facts available | calls with thinking disabled |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.name} | ${r.cost:.2f} | {r.cost / base.cost:.2f}x | {r.compactions} "
            f"| {r.peak:,} | {r.over} | {r.facts}/{r.facts_total} | {r.thinking_text()} |"
        )
    return "\n".join(out)


DEFAULT = "window_manager (default: threshold, target 0.6)"
COST = "window_manager schedule=cost"
#: The issue's target: schedule="cost" at most this share of the default's cost.
TARGET_RATIO = 0.80


def verdict(cost: Row, base: Row, usable: int) -> str:
    """Whether ``cost`` meets the target against ``base``: cheaper by 20 % or more, never
    over the usable window, no fewer facts available."""
    ratio = cost.cost / base.cost
    checks = [
        (ratio <= TARGET_RATIO, f"{ratio:.2f}x the default's cost"),
        (cost.over == 0 and cost.peak <= usable, f"peak {cost.peak:,} of {usable:,} usable"),
        (cost.facts >= base.facts, f"facts {cost.facts}/{cost.facts_total} vs {base.facts}"),
    ]
    failed = [text for ok, text in checks if not ok]
    said = "; ".join(text for _, text in checks)
    return f"**{'met' if not failed else 'not met'}** ({said})"


def quality_subjects() -> list[Any]:
    """The quality part's subjects: the default, the cost schedule, the two peers."""
    from benchmarks.quality.replay import Subject

    return [
        Subject(DEFAULT, "window_manager"),
        Subject(COST, "window_manager", {"schedule": "cost"}),
        Subject(
            "window_manager schedule=cost target=0.6",
            "window_manager",
            {"schedule": "cost", "target": 0.6},
        ),
        Subject("LangChain trim_messages (per call)", peer="langchain"),
        Subject("Strands SlidingWindowConversationManager", peer="strands"),
    ]


def run_quality(windows: Sequence[int], quick: bool = False) -> list[str]:
    """The quality benchmark's sessions billed per subject and window; one table each, with
    the target's verdict for recall off and on."""
    import tempfile
    from pathlib import Path

    from benchmarks.quality.replay import RESERVED, replay
    from benchmarks.quality.sessions import default_sessions

    parts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="normandy-cost-") as tmp:
        for session in default_sessions(quick=quick):
            for window in windows:
                rows: dict[tuple[str, bool], Row] = {}
                wheres: dict[tuple[str, bool], str] = {}
                for subject in quality_subjects():
                    for recall in (False, True) if subject.peer is None else (False,):
                        run = replay(session, subject, window, recall=recall, archive_dir=Path(tmp))
                        b = run.billing
                        rows[subject.label, recall] = Row(
                            subject.label,
                            b.cost,
                            run.compactions,
                            b.peak,
                            run.over_window,
                            run.available,
                            len(run.results),
                            thinking_disabled=run.thinking_disabled,
                            calls=b.requests,
                        )
                        wheres[subject.label, recall] = " / ".join(
                            str(run.count(w)) for w in ("context", "summary", "recall")
                        )
                usable = window - RESERVED
                out = [
                    f"### {session.name}, {session.calls:,} calls, {window:,}-token window",
                    "",
                    "| configuration | recall | input cost | vs default | compactions | peak sent "
                    "| over window | facts available | calls with thinking disabled "
                    "| in context / summary / recall |",
                    "|---|:---:|---:|---:|---:|---:|---:|---:|---:|---|",
                ]
                for (name, recall), r in rows.items():
                    base = rows[DEFAULT, recall]
                    out.append(
                        f"| {name} | {'on' if recall else 'off'} | ${r.cost:.2f} "
                        f"| {r.cost / base.cost:.2f}x | {r.compactions} | {r.peak:,} | {r.over} "
                        f"| {r.facts}/{r.facts_total} | {r.thinking_text()} "
                        f"| {wheres[name, recall]} |"
                    )
                out.append("")
                for recall in (False, True):
                    v = verdict(rows[COST, recall], rows[DEFAULT, recall], usable)
                    out.append(f"- recall {'on' if recall else 'off'}: {v}")
                parts.append("\n".join(out))
                print(parts[-1] + "\n", flush=True)
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[48_000, 128_000])
    parser.add_argument("--sessions", nargs="+", default=["demo", "seed11"])
    parser.add_argument("--configs", nargs="*", default=None)
    parser.add_argument(
        "--parts", nargs="+", choices=["planted", "quality"], default=["planted", "quality"]
    )
    parser.add_argument("--quick", action="store_true", help="the quality part's quick sessions")
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None, help="PNG of the first session and window")
    parser.add_argument(
        "--plot-configs",
        nargs="*",
        default=[
            "window_manager (default: threshold, target 0.6)",
            "window_manager schedule=cost",
            "window_manager schedule=cost target=0.4",
            "window_manager target=0.4",
            "LangChain trim_messages (per call)",
            "Strands SlidingWindowConversationManager",
        ],
    )
    args = parser.parse_args(argv)
    if "NORMANDY_ARCHIVE_PATH" not in os.environ:
        print("set NORMANDY_ARCHIVE_PATH to a scratch file first", file=sys.stderr)
        return 2
    sessions: dict[str, Callable[[], DemoSession]] = {
        "demo": load_session,
        "seed11": lambda: generated_session(11),
    }
    parts: list[str] = []
    for sname in args.sessions if "planted" in args.parts else ():
        session, facts = plant(sessions[sname](), seed=1)
        for window in args.windows:
            names = args.configs or list(configs(window))
            rows = [run_config(n, session, facts, window) for n in names]
            for peer in (run_langchain, run_strands):
                row = peer(session, facts, window)
                if row is not None:
                    rows.append(row)
            calls = sum(len(t.replies) for t in session.turns)
            head = f"### {sname} session ({calls} calls), {window:,}-token window"
            text = table(rows, rows[0].name)
            by = {r.name: r for r in rows}
            if DEFAULT in by and COST in by:
                c, d = by[COST], by[DEFAULT]
                ok = c.cost / d.cost <= TARGET_RATIO and c.over == 0
                text += (
                    f"\n\n- cost and window: **{'met' if ok else 'not met'}** "
                    f"({c.cost / d.cost:.2f}x the default's cost, peak {c.peak:,} of "
                    f"{window - 4096:,} usable); facts in the request {c.facts}/{c.facts_total} "
                    f"against the default's {d.facts} (no recall in this part: the target's "
                    "fact measure is the quality part's)"
                )
            parts.append(head + "\n\n" + text)
            print(parts[-1] + "\n", flush=True)
            if args.plot and len(parts) == 1:
                chosen = [r for r in rows if r.name in args.plot_configs]
                plot(chosen, f"{sname} session, {window:,}-token window", args.plot)
    if "quality" in args.parts:
        parts += run_quality(args.windows, quick=args.quick)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write("\n\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

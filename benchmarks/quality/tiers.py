"""Recall by query tier (issue 35 item 4): a benchmark that cannot be passed by construction.

``python -m benchmarks.quality.tiers [--quick] [--out FILE] [--embedder NAME]
[--vectors FILE] [--only TEXT]``

Each :mod:`~benchmarks.quality.tiered` session is replayed through the real turn loop
(:func:`normandy_core.turn.run_turn`, ``AgentConfig(recall=True)``, the SQLite archive in
a temporary directory) by ``window_manager`` (``oldest_first``), ``clear_tool_results``
and the ``pipeline`` at a 32k and a 128k window. At every call that needs a fact the
scripted model calls ``recall`` once per query tier, whatever the request holds: it does
not know the answer, and does not look. Whether the fact was in the request is recorded
beside, never used. The score reads the recall tool's result as the model gets it: the
fact anywhere in it, in its first entry, and before every distractor and stale value.
"""

from __future__ import annotations

import argparse
import pickle
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from benchmarks.quality.replay import (
    COUNTER,
    MODEL,
    Subject,
    locate,
    recorded_tools,
    reply_blocks,
    seeded_ids,
)
from benchmarks.quality.tiered import (
    TIERS,
    Tier,
    TieredFact,
    TieredNeed,
    TieredSession,
    Timing,
    default_sessions,
)
from normandy_core import (
    AgentConfig,
    RecallSettings,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.clients.scripted import ScriptedRequest
from normandy_core.conversation.entries import Block
from normandy_core.turn import run_turn

__all__ = [
    "EMBEDDER_GROUP",
    "SUBJECTS",
    "SharedVectors",
    "WINDOWS",
    "Outcome",
    "Score",
    "check_embedder",
    "main",
    "replay_tiers",
    "score",
    "tables",
]

WINDOWS = (32_000, 128_000)
SUBJECTS = (
    Subject("window_manager oldest_first", "window_manager", {"strategy": "oldest_first"}),
    Subject("clear_tool_results", "clear_tool_results"),
    Subject("pipeline clear_tool_results -> window_manager", "pipeline"),
)
#: Where embedder distributions register (``normandy-embed-bert``: ``bert``).
EMBEDDER_GROUP = "normandy_core.embedders"
_TIMINGS: tuple[Timing, ...] = ("late", "early", "task")
_ENTRY_END = re.compile(r"</entry-[0-9a-f]+>")


@dataclass(frozen=True)
class Score:
    """What one recall result gave: the fact anywhere, in its first entry, before every
    distractor and stale value, and (settings only) the latest value before the stale."""

    returned: bool
    first: bool
    before_rivals: bool
    latest_first: bool | None


def score(result: str, fact: TieredFact) -> Score:
    """Score recall result ``result`` (the tool result's text) for ``fact``."""
    latest: bool | None = None if not fact.stale else False
    at = result.find(fact.text)
    if at < 0:
        return Score(False, False, False, latest)
    end = _ENTRY_END.search(result)
    first = end is None or at < end.start()

    def after(rivals: Sequence[str]) -> bool:
        return all(result.find(r) < 0 or result.find(r) > at for r in rivals)

    if fact.stale:
        latest = after(fact.stale)
    return Score(True, first, after((*fact.distractors, *fact.stale)), latest)


@dataclass(frozen=True)
class Outcome:
    """One recall call at one need: the tier asked, what came back, what was visible."""

    session: str
    subject: str
    window: int
    need: TieredNeed
    kind: str
    tier: Tier
    visible: bool  # the fact was in the request (in context or a summary) at need time
    score: Score
    compactions: int  # compactions between the fact's plant point and the need


@dataclass
class _Replay:
    """The state of one replay that the scripted model and the event hook share."""

    session: TieredSession
    subject: str
    window: int
    compactions: int = 0
    at_call: dict[tuple[int, int], int] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)

    def on_event(self, event: dict[str, Any]) -> None:
        """Count the compactions (the turn loop's boundary events)."""
        if event.get("type") == "boundary" and event["meta"].get("compacted"):
            self.compactions += 1


class _Asker:
    """The scripted model of one turn: recorded replies, and at a need one recall call per
    tier before them. It never checks whether the fact is already in the request."""

    def __init__(
        self, state: _Replay, t: int, replies: Sequence[tuple[Block, ...]], tool: str
    ) -> None:
        self.state, self.t, self.replies, self.tool = state, t, replies, tool
        self.c = 0
        self.pending: dict[str, tuple[TieredNeed, Tier, bool]] = {}
        self.needs: dict[tuple[int, int], list[TieredNeed]] = {}
        for n in state.session.needs:
            self.needs.setdefault((n.turn, n.call), []).append(n)

    def __call__(self, req: ScriptedRequest) -> ModelReply:
        st = self.state
        st.at_call.setdefault((self.t, self.c), st.compactions)
        if self.pending:
            last = req.messages[-1].blocks if req.messages else ()
            got = {b.tool_use_id: b.text() for b in last if isinstance(b, ToolResultBlock)}
            for call_id, (need, tier, visible) in self.pending.items():
                self._record(need, tier, visible, got.get(call_id, ""))
            self.pending = {}
        elif self.needs.get((self.t, self.c)):
            return self._ask(req)
        blocks = self.replies[self.c]
        self.c += 1
        return ModelReply(content=blocks)

    def _ask(self, req: ScriptedRequest) -> ModelReply:
        uses = []
        for i, need in enumerate(self.needs[(self.t, self.c)]):
            fact = self.state.session.fact(need.fact)
            visible = locate(fact.text, req.system, req.messages) != "missing"
            for tier in TIERS:
                call_id = f"recall_{self.t}_{self.c}_{i}_{tier}"
                self.pending[call_id] = (need, tier, visible)
                uses.append(
                    ToolUseBlock(id=call_id, name=self.tool, input={"query": fact.queries[tier]})
                )
        thinking = ThinkingBlock(
            thinking="Look up what this step needs.", signature=f"sig-{self.t}-{self.c}"
        )
        return ModelReply(content=(thinking, *uses))

    def _record(self, need: TieredNeed, tier: Tier, visible: bool, result: str) -> None:
        st = self.state
        fact = st.session.fact(need.fact)
        since = st.at_call[(need.turn, need.call)] - st.at_call[st.session.plant_call(fact)]
        st.outcomes.append(
            Outcome(
                st.session.name, st.subject, st.window, need, fact.kind, tier, visible,
                score(result, fact), since,
            )
        )  # fmt: skip


def _agent(
    session: TieredSession, subject: Subject, window: int, embedder: str | None = None
) -> AgentConfig:
    """The agent under test, on the public API: the compactor pinned to ``window``,
    recall ranking with ``embedder`` fused in (``None``: keywords only)."""
    opts = {**subject.options(window), "context_window": window}
    return AgentConfig(
        model=MODEL,
        system_prompt=session.base.system,
        tools=session.base.tools,
        compactor=subject.compactor,
        compactor_opts=opts,
        # with an embedder, no bound on the wait: the scripted model asks at once, where
        # a real one leaves the background writer seconds to embed; the ranking is what
        # is measured here, the embedding's cost apart (benchmarks/recall_latency.py)
        recall=RecallSettings(embedder=embedder or "off", timeout=None if embedder else 10.0),
    )


def replay_tiers(
    session: TieredSession,
    subject: Subject,
    window: int,
    archive_dir: Path,
    embedder: str | None = None,
) -> list[Outcome]:
    """Replay ``session`` with ``subject`` at ``window``, recall on; one outcome per need
    and tier. The archive is a new SQLite file in ``archive_dir``, removed after."""
    import normandy_archive

    state = _Replay(session, subject.label, window)
    path = archive_dir / f"{uuid.uuid4().hex}.sqlite3"
    with normandy_archive.archive_settings(path=str(path)), seeded_ids(window):
        acc = _agent(session, subject, window, embedder)
        assert acc.recall_settings is not None
        tool = acc.recall_settings.tool_name
        for t, turn in enumerate(session.base.turns):
            replies = [reply_blocks(r) for r in turn.replies]
            asker = _Asker(state, t, replies, tool)
            client = ScriptedClient([asker] * (2 * len(turn.replies) + 1), model=MODEL)
            acc = run_turn(
                acc,
                turn.user,
                client=client,
                tools=recorded_tools(turn),
                turn_id=turn.turn_id,
                thinking=2048,
                max_iterations=4 * len(turn.replies) + 4,
                counter=COUNTER,
                on_event=state.on_event,
            ).acc
    # the background writer indexes and checkpoints after the last turn: let it finish
    # before the file goes, or it writes a new one
    from normandy_archive.maintenance import drain

    drain()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return state.outcomes


# -- the report ------------------------------------------------------------------------------


def _pct(hits: int, n: int) -> str:
    return f"{100 * hits / n:.0f} %" if n else "-"


def _row(window: int, subject: str, timing: str, tier: str, group: Sequence[Outcome]) -> str:
    n = len(group)
    settings = [o for o in group if o.score.latest_first is not None]
    cells = [
        _pct(sum(o.visible for o in group), n),
        _pct(sum(o.visible or o.score.returned for o in group), n),
        _pct(sum(o.score.returned for o in group), n),
        _pct(sum(o.score.first for o in group), n),
        _pct(sum(o.score.before_rivals for o in group), n),
        f"{_pct(sum(bool(o.score.latest_first) for o in settings), len(settings))} "
        f"({len(settings)})",
    ]
    return (
        f"| {window // 1000}k | {subject} | {timing} | {tier} | {n} | " + " | ".join(cells) + " |"
    )


def _medians(outcomes: Sequence[Outcome]) -> str:
    parts = []
    for timing in _TIMINGS:
        gaps = [o.compactions for o in outcomes if o.need.timing == timing and o.tier == "exact"]
        if gaps:
            parts.append(f"{timing} needs {statistics.median(gaps):g}")
    return "; ".join(parts)


def tables(outcomes: Sequence[Outcome], sessions: Sequence[TieredSession], ranking: str) -> str:
    """The markdown report: one row per subject, window, need timing and query tier."""
    facts = sum(len(s.facts) for s in sessions)
    needs = sum(len(s.needs) for s in sessions)
    out = [
        f"Sessions: {'; '.join(s.name for s in sessions)} ({facts} facts, {needs} needs, "
        f"each asked in {len(TIERS)} tiers). Ranking: {ranking}. `visible`: the fact was in "
        "the request at need time (not used by the model; recall leaves out what the model "
        "can still see); the next columns score the recall result. `latest first`: "
        "settings only, the latest value before both stale ones (n in brackets).",
        "",
        "| window | subject | needs | tier | n | visible | visible or returned | returned | "
        "first entry | before every rival | latest first (n) |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = dict.fromkeys((o.window, o.subject) for o in outcomes)
    for window, subject in sorted(keys, key=lambda k: k[0]):
        mine = [o for o in outcomes if o.window == window and o.subject == subject]
        for timing in _TIMINGS:
            for tier in TIERS:
                group = [o for o in mine if o.need.timing == timing and o.tier == tier]
                if group:
                    out.append(_row(window, subject, timing, tier, group))
    out += ["", "Median compactions between a fact's plant point and its need:", ""]
    for window, subject in sorted(keys, key=lambda k: k[0]):
        mine = [o for o in outcomes if o.window == window and o.subject == subject]
        out.append(f"- {window // 1000}k, {subject}: {_medians(mine)}")
    return "\n".join(out)


def _by_kind(outcomes: Sequence[Outcome]) -> str:
    """Late needs, fact returned, per kind and tier (every subject and window together)."""
    late = [o for o in outcomes if o.need.timing == "late"]
    kinds = sorted({o.kind for o in late})
    out = [
        "Late needs, fact returned / before every rival, by kind (all subjects and windows):",
        "",
        "| kind | n per tier | " + " | ".join(TIERS) + " |",
        "|---|---:|" + "---:|" * len(TIERS),
    ]
    for kind in kinds:
        cells = []
        for tier in TIERS:
            g = [o for o in late if o.kind == kind and o.tier == tier]
            hits = sum(o.score.returned for o in g)
            cells.append(
                f"{_pct(hits, len(g))} / {_pct(sum(o.score.before_rivals for o in g), len(g))}"
            )
        n = sum(o.kind == kind and o.tier == "exact" for o in late)
        out.append(f"| {kind} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def check_embedder(name: str | None) -> str:
    """The ranking a run measures: lexical, or lexical fused with the embedder ``name``.

    ``SystemExit`` names what is missing (the group, or the name among those installed).
    """
    if name is None:
        return "lexical (the archive's full-text search; no embedder)"
    found = entry_points(group=EMBEDDER_GROUP)
    if not found:
        raise SystemExit(
            f"--embedder {name}: no embedders group installed (no distribution registers "
            f"entry points in {EMBEDDER_GROUP!r}); the meaning tier runs lexical without it"
        )
    if name not in found.names:
        raise SystemExit(f"--embedder {name}: not installed; installed: {sorted(found.names)}")
    return (
        f"lexical fused with the embedder {name!r} (reciprocal rank fusion; vectors kept "
        "in the archive, made at recall time)"
    )


class SharedVectors:
    """Every text's vector, made once for the whole run (and kept in ``path`` between
    runs): the replays of one session archive the same texts, and the model gives the
    same vector of a text every time, so only the first replay pays for it. The ranking
    is what this benchmark measures; the embedding's cost is benchmarks/recall_latency.py's."""

    def __init__(self, name: str, path: Path | None) -> None:
        from normandy_core.contract.recall_embed import embedder_for

        made = embedder_for(name)  # the very object recall uses, made once per name
        assert made is not None
        self.path = path
        self.embed = made.embed
        self.vectors: dict[str, list[float]] = {}
        if path is not None and path.exists():
            with path.open("rb") as f:
                found = pickle.load(f)  # written by save() below, never by anyone else
            if found.get("key") == made.key:
                self.vectors = found["vectors"]
        made.embed = self  # type: ignore[method-assign]
        self.key = made.key

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        todo = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if todo:
            self.vectors.update(zip(todo, self.embed(todo), strict=True))
        return [self.vectors[t] for t in texts]

    def save(self) -> None:
        """Keep the vectors in ``path`` (when given) for the next run."""
        if self.path is not None:
            with self.path.open("wb") as f:
                pickle.dump({"key": self.key, "vectors": self.vectors}, f)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality.tiers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one smaller session")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--embedder", metavar="NAME", help="rank with this embedder (item 2)")
    parser.add_argument("--only", metavar="TEXT", help="the subjects whose label holds TEXT")
    parser.add_argument(
        "--vectors",
        type=Path,
        metavar="FILE",
        help="keep the embedder's vectors of the sessions' texts in FILE between runs",
    )
    args = parser.parse_args(argv)
    ranking = check_embedder(args.embedder)
    shared = SharedVectors(args.embedder, args.vectors) if args.embedder else None
    sessions = default_sessions(quick=args.quick)
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    # ignore_cleanup_errors: the archive's background maintenance may still be closing the
    # last run's SQLite file when the directory goes
    with tempfile.TemporaryDirectory(prefix="normandy-tiers-", ignore_cleanup_errors=True) as tmp:
        for session in sessions:
            for window in WINDOWS:
                for subject in SUBJECTS:
                    if args.only and args.only not in subject.label:
                        continue
                    t0 = time.perf_counter()
                    got = replay_tiers(session, subject, window, Path(tmp), args.embedder)
                    outcomes += got
                    print(
                        f"  {session.name[:36]:36} {window:>7,} {subject.label[:40]:40} "
                        f"{sum(o.score.returned for o in got)}/{len(got)} returned "
                        f"{time.perf_counter() - t0:5.1f} s",
                        file=sys.stderr,
                    )
    if shared is not None:
        shared.save()
    text = tables(outcomes, sessions, ranking) + "\n\n" + _by_kind(outcomes)
    flags = "".join(
        f" {flag}" for flag, on in (
            ("--quick", args.quick),
            (f"--embedder {args.embedder}", args.embedder),
            (f"--only {args.only!r}", args.only),
        ) if on
    )  # fmt: skip
    footer = (
        f"\n\n`python -m benchmarks.quality.tiers{flags}`, {time.perf_counter() - started:.0f} s."
    )
    print(text + footer)
    if args.out:
        args.out.write_text(text + footer + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

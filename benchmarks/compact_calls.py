"""Section 8: ``compact()`` before every request, on a growing list (issue 13, item 3).

A user of another framework keeps the full OpenAI Chat Completions message list and,
before each model request, calls ``normandy_core.compact(messages, window=128_000, ...)``
on it; the list grew by one tool batch since the previous call. At lists of about 1,000,
10,000 and 100,000 messages, each call is timed side by side, in alternating order, with:

* **the floor**: an exact count (raw tiktoken cl100k, no Normandy code) of only the
  messages that batch appended, timed on the same batch just before each call;
* **LangChain** ``trim_messages(strategy="last", max_tokens=128_000, start_on="human",
  end_on=("human", "tool"), include_system=True, allow_partial=False)`` over the same list
  converted once to LangChain messages, with an exact counter without memo (it recounts
  every message it is given) and with one memoised per message.

Every output is judged outside the timers by one exact count over the OpenAI messages it
keeps (budget overruns) and a tool-pairing check (orphaned results, unanswered calls).

``python -m benchmarks.compact_calls [--quick|--full] [--sizes 1000,10000]`` prints the
section; :func:`run` returns it (``run.py`` wires it in).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import BUDGET, clock, fmt_time, median, raw_encoding, settle
from normandy_core import compact
from normandy_core.app.workload import generate_session
from normandy_core.conversation.tokens import MESSAGE_OVERHEAD
from normandy_core.transcripts.chat import to_openai

TITLE = "8. compact() before every request, on a growing list"
#: A cl100k model with a 128k window; the window is pinned anyway (``window=BUDGET``).
MODEL = "gpt-4-turbo"
#: The exact counter, as the peers section pins it; no room reserved, so the usable window
#: is the same 128,000 tokens LangChain is given.
OPTS: dict[str, Any] = {"counter": "cl100k_base", "reserved_tokens": 0}
#: The opt-in offload at arrival (issue 35 item 3), as its own subject: whether a boundary
#: where nothing new is large stays near the floor.
OFFLOAD: dict[str, Any] = {
    "compactor": "pipeline",
    "opts": {
        "counter": "cl100k_base",
        "steps": [
            {"compactor": "clear_tool_results", "opts": {"offload_tokens": 1500}},
            {"compactor": "window_manager", "opts": {"reserved_tokens": 0}},
        ],
    },
}
OURS = "normandy compact()"
OFFLOADING = "normandy compact(), offload at arrival (pipeline, offload_tokens=1500)"
#: Issue 13's target: ``compact()`` per call at most this many times the floor at 10k.
TARGET = 3.0
TARGET_SIZE = 10_000
SEED = 11

Message = Mapping[str, Any]
Log = Callable[[str], None]


@dataclass(frozen=True)
class Mode:
    """Sizes (messages in the list at the first measured call) and calls measured at each."""

    name: str
    calls: dict[int, int]
    #: Seconds of timed calls after which a subject stops being called at that size.
    cap: float


QUICK = Mode("quick", {1_000: 20, 10_000: 8}, cap=40.0)
FULL = Mode("full", {1_000: 50, 10_000: 20, 100_000: 3}, cap=240.0)


# -- the session ----------------------------------------------------------------------------


@dataclass
class Session:
    """An OpenAI message list: the list at the warm-up call, then one tool batch per call."""

    messages: list[dict[str, Any]]
    start: int  # the list of the warm-up call is messages[:start]
    ends: list[int]  # the list of the k-th measured call is messages[:ends[k]]


def _boundaries(messages: Sequence[Message]) -> list[int]:
    """Lengths of the list after each tool batch (where a run of tool messages ends)."""
    last = len(messages) - 1
    return [
        i + 1
        for i, m in enumerate(messages)
        if m["role"] == "tool" and (i == last or messages[i + 1]["role"] != "tool")
    ]


def session(size: int, calls: int, seed: int = SEED) -> Session:
    """A generated session as Chat Completions dicts, at least ``size`` messages long when
    the calls start, with ``calls`` tool batches after that."""
    entries = int(size * 0.65) + 8 * calls + 64
    while True:
        messages = to_openai(generate_session(seed, entries, end_mid_round=True))
        bounds = _boundaries(messages)
        first = next((k for k, b in enumerate(bounds) if b >= size), None)
        if first is not None and len(bounds) - first > calls:
            return Session(messages, bounds[first], bounds[first + 1 : first + 1 + calls])
        entries = entries * 5 // 4 + 64


# -- the exact count: the floor's unit and the judge's --------------------------------------


def _texts(m: Message) -> Iterator[str]:
    """The strings an exact count of a Chat Completions message encodes."""
    content = m.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                yield part
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]
    for call in m.get("tool_calls") or ():
        function = call.get("function") or {}
        yield str(function.get("name") or "")
        yield str(function.get("arguments") or "")


def message_tokens(enc: Any, m: Message) -> int:
    """Exact tokens of one message: the per-message overhead, its texts, its tool calls'
    names and arguments as sent (raw ``encode_ordinary``, no cache)."""
    return MESSAGE_OVERHEAD + sum(len(enc.encode_ordinary(t)) for t in _texts(m) if t)


def pairing_faults(messages: Sequence[Message]) -> int:
    """Tool messages answering no call of the assistant message before their run, plus
    calls left unanswered (the list ends after a tool batch: every call has its answer)."""
    faults = 0
    pending: set[str] = set()
    for m in messages:
        if m.get("role") == "tool":
            call_id = m.get("tool_call_id")
            if call_id in pending:
                pending.discard(call_id)
            else:
                faults += 1
            continue
        faults += len(pending)
        pending = (
            {str(c.get("id")) for c in m.get("tool_calls") or ()}
            if m.get("role") == "assistant"
            else set()
        )
    return faults + len(pending)


class Judge:
    """Exact counts of kept lists, outside the timers; input messages are counted once."""

    def __init__(self) -> None:
        self.enc = raw_encoding()
        self.known: dict[int, tuple[Message, int]] = {}

    def learn(self, messages: Sequence[Message]) -> int:
        """Count the input messages once (by identity); their total."""
        total = 0
        for m in messages:
            n = message_tokens(self.enc, m)
            self.known[id(m)] = (m, n)
            total += n
        return total

    def tokens(self, messages: Sequence[Message]) -> int:
        total = 0
        for m in messages:
            hit = self.known.get(id(m))
            total += hit[1] if hit is not None and hit[0] is m else message_tokens(self.enc, m)
        return total


# -- LangChain ------------------------------------------------------------------------------


def _lc_texts(m: Any) -> Iterator[str]:
    """The same strings as :func:`_texts`, read from a LangChain message."""
    content = m.content
    if isinstance(content, str):
        yield content
    else:
        for part in content:
            if isinstance(part, str):
                yield part
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]
    for call in getattr(m, "tool_calls", None) or ():
        yield call["name"]
        # As the Chat Completions message sends them (``json.dumps`` defaults).
        yield json.dumps(call["args"], ensure_ascii=False)


def lc_counter(memo: bool) -> Callable[[Sequence[Any]], int]:
    """An exact list counter for ``trim_messages`` (the judge's count, raw tiktoken).

    With ``memo`` each message is counted once, keyed by ``id(message)`` (safe here: the
    caller's list keeps every message alive); without, every call recounts.
    """
    enc = raw_encoding()

    def one(m: Any) -> int:
        return MESSAGE_OVERHEAD + sum(len(enc.encode_ordinary(t)) for t in _lc_texts(m) if t)

    if not memo:

        def count(messages: Sequence[Any]) -> int:
            return sum(one(m) for m in messages)

        return count

    cache: dict[int, int] = {}

    def count_memo(messages: Sequence[Any]) -> int:
        total = 0
        for m in messages:
            n = cache.get(id(m))
            if n is None:
                n = cache[id(m)] = one(m)
            total += n
        return total

    return count_memo


# -- the subjects ---------------------------------------------------------------------------


@dataclass
class Subject:
    """One way of fitting the list before a request, and what it did."""

    name: str
    call: Callable[[], Any]
    kept: Callable[[Any], Sequence[Message]]  # its output as the OpenAI messages it keeps
    stateful: bool  # warmed at every size (its state carries over between calls)
    times: list[float] = field(default_factory=list)
    floor_times: list[float] = field(default_factory=list)
    kept_tokens: list[int] = field(default_factory=list)
    overruns: int = 0
    orphaned: int = 0
    spent: float = 0.0
    capped: bool = False


@dataclass
class SizeResult:
    """The calls at one list size."""

    size: int
    first: int  # messages in the list at the first measured call
    last: int  # ... at the last
    tokens: int  # exact tokens of the list at the warm-up call
    calls: int  # calls planned per subject
    subjects: list[Subject]
    floor_all: list[float]
    archive_note: Mapping[str, Any] | None
    archive_drain: list[float]
    compacted: int
    wall: float


def _langchain() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """LangChain's ``convert_to_messages`` and ``trim_messages``, or ``None`` when it is
    not installed (the ``bench`` dependency group)."""
    try:
        from langchain_core.messages import convert_to_messages, trim_messages
    except ImportError:
        return None
    return convert_to_messages, trim_messages


def _drain_archive() -> float:
    """Wait for the archive's background writer (it runs during the model call that
    follows a real compaction); the seconds waited. Nothing when it was never loaded."""
    maintenance = sys.modules.get("normandy_archive.maintenance")
    if maintenance is None:
        return 0.0
    t0 = clock()
    maintenance.drain(60.0)
    return clock() - t0


def measure(size: int, calls: int, cap: float, first_size: bool, log: Log) -> SizeResult:
    """Warm every subject on the starting list, then ``calls`` calls, one tool batch apart."""
    started = clock()
    s = session(size, calls)
    enc = raw_encoding()
    judge = Judge()
    start_tokens = judge.learn(s.messages[: s.start])
    judge.learn(s.messages[s.start : s.ends[-1]])
    live: list[dict[str, Any]] = s.messages[: s.start]
    lc_live: list[Any] = []
    lc_all: list[Any] = []

    def normandy_call() -> Any:
        return compact(live, window=BUDGET, model=MODEL, opts=OPTS)

    def offload_call() -> Any:
        return compact(live, window=BUDGET, model=MODEL, **OFFLOAD)

    ours = Subject(OURS, normandy_call, lambda r: r.messages, True)
    subjects = [ours, Subject(OFFLOADING, offload_call, lambda r: r.messages, True)]
    lc = _langchain()
    if lc is not None:
        convert_to_messages, trim_messages = lc
        lc_all = convert_to_messages(s.messages)
        assert len(lc_all) == len(s.messages)
        source = {id(lm): m for lm, m in zip(lc_all, s.messages, strict=True)}
        lc_live.extend(lc_all[: s.start])

        def lc_subject(name: str, memo: bool) -> Subject:
            counter = lc_counter(memo)

            def call() -> Any:
                return trim_messages(
                    lc_live,
                    max_tokens=BUDGET,
                    token_counter=counter,
                    strategy="last",
                    start_on="human",
                    end_on=("human", "tool"),
                    include_system=True,
                    allow_partial=False,
                )

            return Subject(name, call, lambda out: [source[id(m)] for m in out], memo)

        subjects.append(lc_subject("LangChain trim_messages, exact, no memo", memo=False))
        subjects.append(lc_subject("LangChain trim_messages, exact, memoised", memo=True))
        # The LangChain counter counts what the judge counts, message for message.
        check = lc_counter(memo=False)
        sample = slice(0, s.ends[-1], 97)
        for lm, m in zip(lc_all[sample], s.messages[sample], strict=True):
            assert check([lm]) == judge.tokens([m]), (lm, m)

    # Warm-up on the starting list, untimed: first-call imports and, for the stateful
    # subjects, the state a caller has from its previous requests (the memo; the archive's
    # content; any cache compact() keeps).
    for sub in subjects:
        if sub.stateful or first_size:
            sub.call()
    _drain_archive()
    log(f"  {size:,}: {len(live):,} messages, {start_tokens:,} tokens, warmed")

    floor_all: list[float] = []
    drains: list[float] = []
    note: Mapping[str, Any] | None = None
    compacted = 0
    running = 0
    for k, end in enumerate(s.ends):
        begin = len(live)
        batch = s.messages[begin:end]
        live.extend(batch)
        lc_live.extend(lc_all[begin:end])
        # Alternating order: each subject takes each position in turn.
        shift = k % len(subjects)
        for sub in subjects[shift:] + subjects[:shift]:
            if sub.capped:
                continue
            settle()
            t0 = clock()
            for m in batch:
                running += message_tokens(enc, m)
            floor = clock() - t0
            t0 = clock()
            out = sub.call()
            dt = clock() - t0
            if sub.name.startswith("normandy"):
                # What it archived is indexed here, not inside the next subject's call.
                drain = _drain_archive()
                assert not out.meta.hook_errors, out.meta.hook_errors
            if sub is ours:
                drains.append(drain)
                if out.compacted:
                    if not compacted:
                        note = out.note("archive")
                    compacted += 1
            sub.times.append(dt)
            sub.floor_times.append(floor)
            floor_all.append(floor)
            sub.spent += dt
            kept = sub.kept(out)
            n = judge.tokens(kept)
            sub.kept_tokens.append(n)
            sub.overruns += n > BUDGET
            sub.orphaned += pairing_faults(kept) > 0
            if sub.spent > cap and k + 1 < len(s.ends):
                sub.capped = True
            # Freed here, not inside the next subject's timed call (``compact()``'s result
            # holds every dropped entry).
            del out, kept
        if k == 0 or (k + 1) % 10 == 0 or k + 1 == len(s.ends):
            log(f"  {size:,}: call {k + 1} of {len(s.ends)}, {clock() - started:.0f} s")
    return SizeResult(
        size=size,
        first=s.ends[0],
        last=s.ends[-1],
        tokens=start_tokens,
        calls=len(s.ends),
        subjects=subjects,
        floor_all=floor_all,
        archive_note=note,
        archive_drain=drains,
        compacted=compacted,
        wall=clock() - started,
    )


# -- the report -----------------------------------------------------------------------------


def ratio_text(ratio: float) -> str:
    """A ratio to the floor as the tables show it (``2.37x``, ``4,156x``)."""
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:,.0f}x"


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table of ``rows`` under ``head``."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _archive_status(results: Sequence[SizeResult]) -> str:
    notes = [r.archive_note for r in results if r.compacted]
    if not notes:
        return "no call compacted, so the archive hook had nothing to write"
    note = notes[0]
    if note is None:
        disabled = os.environ.get("NORMANDY_DISABLE_PLUGINS", "")
        if "archive" in [d.strip() for d in disabled.split(",")]:
            return (
                "**off**: the archive hook is disabled (`NORMANDY_DISABLE_PLUGINS=archive`, "
                "as `python -m benchmarks` sets it)"
            )
        return "**off**: no archive hook ran (not installed)"
    path = note.get("path")
    if path is None:
        return f"**off** (the hook is loaded): {note.get('message', '')}"
    drain = median([d for r in results for d in r.archive_drain])
    where = (
        "a temporary SQLite file (set by `benchmarks/common.py`, removed at exit)"
        if str(path).startswith(tempfile.gettempdir())
        else f"the archive the caller chose ({path})"
    )
    return (
        f"**on**: every compacting call archived its dropped entries into {where}, inside "
        "the timed call (content already stored is not written again); its background "
        "writer (indexing) was drained after each call, outside the timers, as the model "
        f"call that follows would let it run (median {fmt_time(drain)} per call)"
    )


def report(results: Sequence[SizeResult], mode: Mode, wall: float) -> str:
    """The section's body (markdown, without its title)."""
    rows: list[list[str]] = []
    verdict = f"not measured (no {TARGET_SIZE:,}-message list in this run)"
    for r in results:
        size = f"{r.first:,} to {r.last:,}"
        rows.append(
            [
                size,
                f"{r.tokens:,}",
                "floor: exact count of the batch's new messages (before every call)",
                f"{len(r.floor_all):,}",
                fmt_time(median(r.floor_all)),
                fmt_time(median(r.floor_all)),
                "1.00x",
                "-",
                "-",
                "-",
            ]
        )
        for sub in r.subjects:
            med, own = median(sub.times), median(sub.floor_times)
            ratio = med / own if own else float("nan")
            measured = f"{len(sub.times):,} of {r.calls:,}"
            if sub.capped:
                measured += f" (capped at {mode.cap:g} s)"
            rows.append(
                [
                    size,
                    f"{r.tokens:,}",
                    sub.name,
                    measured,
                    fmt_time(med),
                    fmt_time(own),
                    ratio_text(ratio),
                    str(sub.overruns),
                    str(sub.orphaned),
                    f"{median([float(n) for n in sub.kept_tokens]):,.0f}",
                ]
            )
            if r.size == TARGET_SIZE and sub.name == OURS:
                met = "met" if ratio <= TARGET else "**not met**"
                verdict = f"{ratio_text(ratio)} ({met})"
    lc_missing = all(len(r.subjects) == 2 for r in results)
    sampled = "; ".join(f"{n:,} calls at {s:,} messages" for s, n in mode.calls.items())
    text = [
        f"Target: `compact()` at most {TARGET:g}x the floor at {TARGET_SIZE:,} messages. "
        f"This run: {verdict}.",
        "",
        markdown_table(
            [
                "list (messages)",
                "list (exact tokens)",
                "subject",
                "calls measured",
                "per call (median)",
                "its floor (median)",
                "ratio to floor",
                "budget overruns",
                "orphaned tool results",
                "kept (exact tokens, median)",
            ],
            rows,
        ),
        "",
        "A user of another framework keeps the whole Chat Completions list (a generated "
        "coding session, `generate_session` then `to_openai`) and, before each model "
        f"request, calls `compact(messages, window={BUDGET:_}, model={MODEL!r}, "
        f"opts={OPTS!r})` (`window_manager`, exact cl100k counter, no reserved room) on "
        "the list, which grew by one tool batch since the previous call; it sends what "
        "comes back and keeps its full list. LangChain gets the same list, converted once "
        "to LangChain messages (`convert_to_messages`, outside the timers, appended batch "
        "by batch), and `trim_messages(strategy='last', max_tokens=128_000, "
        "start_on='human', end_on=('human', 'tool'), include_system=True, "
        "allow_partial=False)` with an exact counter (the same raw tiktoken count as the "
        "floor and the judge), without memo and memoised per message (`id(message)`). "
        f"A second Normandy subject calls `compact(messages, window={BUDGET:_}, "
        f"model={MODEL!r}, **{OFFLOAD!r})`: clear_tool_results offloading at arrival (each tool "
        "result over 1,500 tokens archived at the call that first sees it, a preview in its "
        "place), then `window_manager` as above.",
        "",
        "- **Calls.** At each size the list starts at about that many messages (ending "
        "after a tool batch; its exact tokens in the second column) and every stateful "
        "subject is called once on it, untimed (the memo, the archive's content, any cache "
        "`compact()` keeps: what a caller has from its earlier requests; every subject is "
        "also warmed once at the first size, for first-call imports). Then each subject is "
        f"called once per tool batch appended: {sampled} ({mode.name} mode). A list "
        "of 100,000 messages holds tens of millions of tokens, so that size is sampled "
        f"with a few calls; a subject whose timed calls pass {mode.cap:g} s at one size "
        "stops there (the table says so).",
        "- **Side by side.** At each call the subjects run in rotating order (each takes "
        "each position in turn); before each, garbage is collected, and the floor (raw "
        "`encode_ordinary` of only that batch's new messages, added to a running total) is "
        "timed on the same batch just before the call, so each ratio compares medians "
        'measured under the same machine load ("its floor").',
        "- **Correctness.** Outside the timers, each output is mapped back to the Chat "
        "Completions messages it keeps and judged by one exact count (cl100k, "
        f"{MESSAGE_OVERHEAD} tokens per message, texts, tool names and arguments as sent): "
        f"**budget overruns** are calls whose kept list is over {BUDGET:,} tokens; "
        "**orphaned tool results** are calls whose kept list has a tool message answering "
        "no call of the assistant message before its run, or a call left unanswered. "
        "`window_manager` compacts to its target (0.6 of the window), so it keeps less "
        "than LangChain, which fills the window.",
        f"- **Archive.** {_archive_status(results)}.",
        f"- This run took {wall:,.0f} s.",
    ]
    if lc_missing:
        text.append(
            "- LangChain is not installed here (`uv sync --group bench`): its rows are absent."
        )
    return "\n".join(text)


def run_mode(mode: Mode, sizes: Sequence[int] | None = None, log: Log | None = None) -> str:
    """The section (title and body) for ``mode``, at ``sizes`` (default: the mode's)."""
    say: Log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    started = clock()
    chosen = list(sizes) if sizes else list(mode.calls)
    calls = {s: mode.calls.get(s) or FULL.calls.get(s) or 10 for s in chosen}
    mode = Mode(mode.name, calls, mode.cap)
    results = []
    for i, size in enumerate(chosen):
        say(f"compact_calls {mode.name}: {size:,} messages, {calls[size]} calls")
        results.append(measure(size, calls[size], mode.cap, i == 0, say))
    return f"## {TITLE}\n\n{report(results, mode, clock() - started)}\n"


def run(quick: bool) -> str:
    """Section 8 in markdown: quick (1k and 10k) or full (1k, 10k and 100k messages)."""
    return run_mode(QUICK if quick else FULL)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.compact_calls [--quick|--full] [--sizes 1000,10000]``."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compact_calls", description=__doc__)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="1k and 10k messages (default)")
    g.add_argument("--full", action="store_true", help="1k, 10k and 100k messages")
    ap.add_argument(
        "--sizes",
        help="comma-separated list sizes (messages) instead of the mode's, e.g. 1000,10000",
    )
    args = ap.parse_args(argv)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")] if args.sizes else None
    print(run_mode(FULL if args.full else QUICK, sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())

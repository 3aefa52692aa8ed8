"""Section 8b: ``compact()`` before every request, in every input shape (issue 32, case 8).

Section 8 times the Chat Completions list; this section puts every shape
:func:`normandy_core.compact` reads on the same footing (``benchmarks/shapes.py``): the
plain list of each format beside its requests (Anthropic ``system`` beside ``messages``,
Responses ``instructions`` beside ``input``, a Chat ``{"messages": ...}``) and the same
lists holding the official SDKs' objects. Before issue 32 an Anthropic request was read
in full at every call (209-222x the floor at about 600 messages, 1,800-1,880x at 6,000).

The shapes of one format are timed together, call by call in rotating order (each takes
each position in turn), each call preceded by its own **floor**: raw tiktoken
``encode_ordinary`` of the strings the call's new messages hold (texts, tool names and
arguments, tool inputs and outputs), collected outside the timer. The memo remembers 8
calls, so the formats run one after another (three shapes at a time), each shape on its
own list, grown by one tool batch per call from about the size in the first column.

``python -m benchmarks.compact_shapes [--sizes 1000,10000] [--calls 8] [--cpu]`` prints
the section; :func:`run` returns it. ``--cpu`` times both sides in the calling thread's
CPU time: on a shared machine under load, wall-clock calls are either about 1 ms or, when
the scheduler preempts them, about 10 ms, and a median of 8 or 16 calls falls on either.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from benchmarks.common import BUDGET, clock, fmt_time, median, raw_encoding, settle
from benchmarks.compact_calls import MODEL, OPTS, TARGET, TARGET_SIZE, markdown_table, ratio_text
from benchmarks.shapes import SHAPES, Shape, ShapedSession, sized_session
from normandy_core import compact
from normandy_core.conversation.tokens import MESSAGE_OVERHEAD
from normandy_core.transcripts import continuation

TITLE = "8b. compact() before every request, in every input shape"
SEED = 11
#: Calls timed per shape at each size.
CALLS = {1_000: 20, 10_000: 8}
#: Keys whose strings are not sent as text (identifiers and types).
_NOT_TEXT = frozenset({"type", "role", "id", "call_id", "tool_use_id", "status", "signature"})

Log = Any


def _strings(value: Any, key: str = "") -> Iterator[str]:
    """The strings of a message an exact count encodes; a dict input as its JSON, an SDK
    object (a message, or a block a dict holds) as its JSON dump."""
    if isinstance(value, BaseModel):
        yield from _strings(value.model_dump(mode="json", exclude_none=True), key)
    elif key == "input" and isinstance(value, Mapping):
        yield json.dumps(value, ensure_ascii=False)
    elif isinstance(value, str):
        if key not in _NOT_TEXT and value:
            yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(v, str(k))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item, key)


def batch_texts(messages: Sequence[Any]) -> list[str]:
    """The strings the floor encodes for ``messages`` (SDK objects read as their JSON)."""
    texts: list[str] = []
    for m in messages:
        texts.extend(_strings(m))
    return texts


@dataclass
class Arm:
    """One shape's list, grown call by call, and its timings."""

    session: ShapedSession
    first: int  # index in ``session.ends`` of the list at the warm-up call
    live: list[Any] = field(default_factory=list)
    request: Any = None
    times: list[float] = field(default_factory=list)
    floors: list[float] = field(default_factory=list)
    continued: int = 0
    compacted: int = 0

    def call(self) -> Any:
        """``compact()`` as a caller does before each request."""
        return compact(self.request, window=BUDGET, model=MODEL, opts=OPTS)


def _arms(shapes: Sequence[Shape], size: int, calls: int) -> list[Arm]:
    arms = []
    for shape in shapes:
        session, first = sized_session(shape, size, calls, SEED)
        arm = Arm(session, first)
        arm.live = session.messages[: session.ends[first]]
        arm.request = session.request(arm.live)
        arms.append(arm)
    return arms


def measure(
    shapes: Sequence[Shape], size: int, calls: int, timer: Callable[[], float] = clock
) -> list[Arm]:
    """Warm each shape's memo on its starting list, then ``calls`` calls per shape, one
    tool batch apart, the shapes in rotating order, each side timed with ``timer``."""
    continuation.clear()
    arms = _arms(shapes, size, calls)
    enc = raw_encoding()
    for arm in arms:
        arm.call()  # untimed: what a caller has from its earlier requests
    for k in range(calls):
        shift = k % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            ends = arm.session.ends
            new = arm.session.messages[ends[arm.first + k] : ends[arm.first + k + 1]]
            texts = batch_texts(new)
            arm.live.extend(new)
            settle()
            t0 = timer()
            total = MESSAGE_OVERHEAD * len(new)
            for text in texts:
                total += len(enc.encode_ordinary(text))
            floor = timer() - t0
            t0 = timer()
            out = arm.call()
            arm.times.append(timer() - t0)
            arm.floors.append(floor)
            arm.continued += out.continued
            arm.compacted += out.compacted
            del out
    return arms


def report(results: Sequence[tuple[int, list[Arm]]], calls: Mapping[int, int]) -> str:
    """The section's body (markdown, without its title)."""
    rows: list[list[str]] = []
    worst: tuple[float, str] | None = None
    for size, arms in results:
        for arm in arms:
            med, own = median(arm.times), median(arm.floors)
            ratio = med / own if own else float("nan")
            ends = arm.session.ends
            rows.append(
                [
                    f"{ends[arm.first + 1]:,} to {ends[arm.first + len(arm.times)]:,}",
                    arm.session.shape.name,
                    f"{arm.continued} of {len(arm.times)}",
                    str(arm.compacted),
                    fmt_time(med),
                    fmt_time(own),
                    ratio_text(ratio),
                ]
            )
            if size == TARGET_SIZE and (worst is None or ratio > worst[0]):
                worst = (ratio, arm.session.shape.name)
    if worst is None:
        verdict = f"not measured (no {TARGET_SIZE:,}-message lists in this run)"
    else:
        met = "met" if worst[0] <= TARGET else "**not met**"
        verdict = f"the slowest shape, {worst[1]}, at {ratio_text(worst[0])} ({met})"
    sampled = "; ".join(f"{n:,} calls per shape at {s:,} messages" for s, n in calls.items())
    return "\n".join(
        [
            f"Target: `compact()` at most {TARGET:g}x the floor at {TARGET_SIZE:,} messages "
            f"for every shape. This run: {verdict}.",
            "",
            markdown_table(
                [
                    "list (messages)",
                    "shape",
                    "calls continued",
                    "calls compacted",
                    "per call (median)",
                    "its floor (median)",
                    "ratio to floor",
                ],
                rows,
            ),
            "",
            f"Each shape holds the same generated coding session (seed {SEED}; an Anthropic "
            "list merges a batch's results into one message, so its lists are shorter for "
            f"the same conversation) and is called as `compact(request, window={BUDGET:_}, "
            f"model={MODEL!r}, opts={OPTS!r})` before each request, its list grown in place "
            f"by one tool batch since the previous call ({sampled}), after one untimed call "
            "on the starting list. The shapes of one format run together in rotating order, "
            "each call timed just after its own floor (raw `encode_ordinary` of the strings "
            "the batch's new messages hold, collected outside the timer), so each ratio "
            "compares medians under the same machine load.",
        ]
    )


def run(
    sizes: Sequence[int] = (1_000, 10_000),
    calls: int | None = None,
    log: Log = None,
    cpu: bool = False,
) -> str:
    """Section 8b (title and body) at ``sizes``, in wall-clock or (``cpu``) thread CPU time."""
    timer = time.thread_time if cpu else clock
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    per_size = {s: calls or CALLS.get(s, 8) for s in sizes}
    results: list[tuple[int, list[Arm]]] = []
    started = clock()
    for size in sizes:
        arms: list[Arm] = []
        for fmt in ("openai", "anthropic", "responses"):
            shapes = [s for s in SHAPES if s.format == fmt]
            say(f"compact_shapes: {size:,} messages, {fmt}, {per_size[size]} calls per shape")
            arms.extend(measure(shapes, size, per_size[size], timer))
        results.append((size, arms))
    continuation.clear()
    body = report(results, per_size)
    timed = "thread CPU time" if cpu else "wall-clock time"
    return f"## {TITLE}\n\n{body}\n\nTimed in {timed}; this run took {clock() - started:,.0f} s.\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.compact_shapes [--sizes 1000,10000] [--calls N]``."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compact_shapes", description=__doc__)
    ap.add_argument("--sizes", default="1000,10000", help="comma-separated list sizes")
    ap.add_argument("--calls", type=int, help="calls per shape at every size")
    ap.add_argument("--cpu", action="store_true", help="time in thread CPU time, not wall")
    args = ap.parse_args(argv)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    print(run(sizes, args.calls, cpu=args.cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())

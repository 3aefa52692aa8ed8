"""The replay behind ``normandy demo``: a recorded agent session run through the real turn loop.

:func:`load_session` reads the bundled session (``normandy_core/data/demo_session.jsonl.gz``,
made once by ``scripts/make_demo_session.py``). :func:`replay` runs every recorded turn
with :func:`normandy_core.turn.run_turn`: a :class:`~normandy_core.clients.scripted.ScriptedClient`
answers with the recorded assistant replies, and a tool registry answers every tool
call with its recorded output, so the conversation grows exactly as it did, and the
configured compactor resolves every boundary as it would in a live agent.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from normandy_core.clients.scripted import ScriptedRequest
    from normandy_core.contract.config import AgentConfig
    from normandy_core.conversation.cost import CacheRates
    from normandy_core.conversation.entries import ToolResultBlock
    from normandy_core.turn import Tool

__all__ = [
    "DEMO_MODEL",
    "DEMO_WINDOW",
    "Boundary",
    "DemoReport",
    "DemoSession",
    "DemoTurn",
    "load_session",
    "replay",
]

#: The model the demo agent claims to be (it picks the token counter).
DEMO_MODEL = "claude-sonnet-4-5"
#: The default context window of the demo, small enough to compact often.
DEMO_WINDOW = 48_000

_FORMAT = "normandy.demo-session"


@dataclass(frozen=True)
class DemoTurn:
    """One recorded turn: the user's message, the replies in order, the tool outputs in order."""

    turn_id: str
    user: str
    replies: tuple[Mapping[str, Any], ...]
    outputs: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class DemoSession:
    """A recorded session: system prompt, tool definitions and turns."""

    system: str
    tools: tuple[Mapping[str, Any], ...]
    turns: tuple[DemoTurn, ...]

    @property
    def batches(self) -> int:
        """How many tool batches the session holds."""
        return sum(len(t.replies) - 1 for t in self.turns)


def _bundled() -> Any:
    return resources.files("normandy_core") / "data" / "demo_session.jsonl.gz"


def load_session(path: str | Path | None = None) -> DemoSession:
    """Read a demo session (the bundled one by default); ``ValueError`` names a bad line."""
    source = _bundled() if path is None else Path(path)
    with source.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    turns: list[DemoTurn] = []
    header: dict[str, Any] | None = None
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: line {number}: not valid JSON: {exc.msg}") from exc
        if header is None:
            if record.get("format") != _FORMAT:
                raise ValueError(f"{source}: line 1: not a demo session (format {_FORMAT!r})")
            header = record
            continue
        turns.append(
            DemoTurn(
                turn_id=str(record["turn_id"]),
                user=str(record["user"]),
                replies=tuple({"content": reply} for reply in record["replies"]),
                outputs=tuple(record["outputs"]),
            )
        )
    if header is None:
        raise ValueError(f"{source}: empty demo session")
    return DemoSession(str(header["system"]), tuple(header["tools"]), tuple(turns))


@dataclass(frozen=True)
class Boundary:
    """One boundary of the replay: the context before and after it (prompt included).

    ``after`` is what the next model call was sent (the turn loop's estimate); ``before``
    adds back what the boundary removed (its ``tokens_before - tokens_after``).
    ``thinking_disabled`` says whether that call went without thinking (a mid-round
    compaction, this one or an earlier one of the round, stripped it), and
    ``thinking_disabled_calls`` how many calls of the replay did so far, that one included.
    """

    index: int
    turn: int
    mid_round: bool
    before: int
    after: int
    meta: Mapping[str, Any]
    thinking_disabled: bool = False
    thinking_disabled_calls: int = 0

    @property
    def compacted(self) -> bool:
        """Whether the compactor compacted here."""
        return bool(self.meta.get("compacted"))

    @property
    def thinking_stripped(self) -> bool:
        """Whether the compaction here stripped the thinking of messages it kept."""
        return bool(self.meta.get("thinking_stripped"))


@dataclass
class DemoReport:
    """What a replay did, boundary by boundary, with the totals the closing table shows."""

    compactor: str
    opts: Mapping[str, Any]
    model: str
    window: int | None
    prompt_tokens: int
    boundaries: list[Boundary] = field(default_factory=list)
    turns: int = 0
    batches: int = 0
    compact_seconds: float = 0.0
    total_seconds: float = 0.0
    final_tokens: int = 0
    #: Model calls sent with thinking disabled (the rest of a round whose thinking a
    #: mid-round compaction stripped; the turn loop's ``thinking_disabled`` events).
    thinking_disabled: int = 0
    #: Billed input tokens of each model call, in order, with prompt caching
    #: (:mod:`normandy_core.conversation.cost`: the prefix the previous call sent unchanged read at
    #: the cache-read rate, the rest written at the cache-write rate).
    billed: list[float] = field(default_factory=list)
    #: Tokens each model call sent (system prompt and tools included), in order.
    sent: list[int] = field(default_factory=list)
    #: The model's input price in dollars per million tokens (``None``: not in the catalog).
    input_price: float | None = None
    #: The cache prices the calls were billed at, as multiples of the input price.
    cache_read: float = 0.1
    cache_write: float = 1.25

    @property
    def compactions(self) -> list[Boundary]:
        """The boundaries that compacted."""
        return [b for b in self.boundaries if b.compacted]

    @property
    def errors(self) -> list[Boundary]:
        """The boundaries whose compactor reported an error."""
        return [b for b in self.boundaries if "error" in b.meta]

    @property
    def dropped(self) -> int:
        """Entries dropped over the whole replay."""
        return sum(int(b.meta.get("dropped_count", 0)) for b in self.boundaries)

    @property
    def peak(self) -> int:
        """The largest context (prompt included) any model call was sent."""
        return max((b.after for b in self.boundaries), default=0)

    @property
    def peak_before(self) -> int:
        """The largest context seen at a boundary, before compaction."""
        return max((b.before for b in self.boundaries), default=0)

    @property
    def cumulative_cost(self) -> list[float]:
        """Dollars billed for input after each call (billed tokens without a price)."""
        scale = (self.input_price or 1e6) / 1e6
        out: list[float] = []
        total = 0.0
        for tokens in self.billed:
            total += tokens * scale
            out.append(total)
        return out

    @property
    def cost(self) -> float:
        """Dollars billed for input over the replay (billed tokens without a price)."""
        return self.cumulative_cost[-1] if self.billed else 0.0

    @property
    def uncached_cost(self) -> float:
        """What the same calls would cost without prompt caching (every token at input)."""
        return sum(self.sent) * (self.input_price or 1e6) / 1e6

    @property
    def tokens_removed(self) -> int:
        """Tokens the compactions took out of the conversation, summed."""
        return sum(b.before - b.after for b in self.compactions)


class _Replay:
    """One turn's tool registry and event listener.

    Each tool call is answered with the next recorded output. Each ``boundary`` event is
    paired with the ``model_reply`` that follows it (whose ``estimated_input_tokens`` is
    the context the boundary left) into a :class:`Boundary`. The time from the previous
    event or tool call to a ``boundary`` event is the time the boundary took.
    """

    def __init__(
        self,
        turn: int,
        outputs: Sequence[Mapping[str, Any]],
        report: DemoReport,
        progress: Callable[[Boundary], None],
    ) -> None:
        self.turn = turn
        self.outputs: Iterator[Mapping[str, Any]] = iter(outputs)
        self.report = report
        self.progress = progress
        self.pending: tuple[Mapping[str, Any], bool] | None = None
        self.disabled = False  # the pending boundary's call went without thinking
        self.last = time.perf_counter()

    def tool(self, name: str) -> Tool:
        """The replayed tool ``name``."""

        from normandy_core.conversation.entries import ToolResultBlock

        def call(**_input: Any) -> ToolResultBlock:
            record = next(self.outputs, None)
            if record is None:
                raise RuntimeError(f"the recording has no output left for a {name!r} call")
            self.last = time.perf_counter()
            return ToolResultBlock(
                tool_use_id=str(record["tool_use_id"]),
                content=str(record["content"]),
                is_error=bool(record.get("is_error", False)),
            )

        return call

    def on_event(self, event: dict[str, Any]) -> None:
        """The turn's ``on_event`` listener."""
        kind = event.get("type")
        report = self.report
        if kind == "thinking_disabled":  # reported with the reply, before model_reply
            report.thinking_disabled += 1
            self.disabled = True
        elif kind == "boundary":
            report.compact_seconds += time.perf_counter() - self.last
            self.pending = (event["meta"], bool(event["mid_round"]))
        elif kind == "model_reply" and self.pending is not None:
            meta, mid_round = self.pending
            self.pending = None
            after = int(event["estimated_input_tokens"])
            # What the boundary took out, from the figures every boundary event carries
            # (the turn loop counts them where the compactor and the boundary did not).
            was, now = meta.get("tokens_before"), meta.get("tokens_after")
            removed = was - now if isinstance(was, int) and isinstance(now, int) else 0
            before = after + max(removed, 0)
            boundary = Boundary(
                len(report.boundaries),
                self.turn,
                mid_round,
                before,
                after,
                meta,
                thinking_disabled=self.disabled,
                thinking_disabled_calls=report.thinking_disabled,
            )
            self.disabled = False
            report.boundaries.append(boundary)
            report.batches += int(mid_round)
            self.progress(boundary)
        self.last = time.perf_counter()


class _Biller:
    """Bills each request against the one before it (:mod:`normandy_core.conversation.cost`'s
    model)."""

    def __init__(self, counter: Any, prompt: int, report: DemoReport, rates: CacheRates) -> None:
        self.counter = counter
        self.prompt = prompt
        self.report = report
        self.rates = rates
        self.previous: tuple[Any, ...] = ()
        self.sizes: dict[int, tuple[Any, int]] = {}

    @classmethod
    def for_config(cls, acc: AgentConfig, report: DemoReport) -> _Biller:
        """A biller at the catalog's prices for ``acc.model``; notes them in ``report``."""
        from normandy_core.conversation.catalog import catalog_prices
        from normandy_core.conversation.cost import rates_for

        model = acc.model
        prices = catalog_prices(acc.catalog, model)
        report.input_price = None if prices is None else prices.input
        rates = rates_for(acc.catalog, model)
        report.cache_read, report.cache_write = rates.read, rates.write
        return cls(acc.prepared.counter_for(model, None), acc.prompt_tokens, report, rates)

    def size(self, entry: Any) -> int:
        hit = self.sizes.get(id(entry))
        if hit is None or hit[0] is not entry:
            hit = (entry, self.counter.count_entry(entry))
            self.sizes[id(entry)] = hit
        return hit[1]

    def call(self, messages: Sequence[Any]) -> None:
        from normandy_core.conversation.cost import billed, first_change

        sizes = [self.size(e) for e in messages]
        sent = self.prompt + sum(sizes)
        if self.previous:
            same = first_change(self.previous, messages)
            cached = self.prompt + sum(sizes[: min(same, len(self.previous))])
        else:
            cached = 0
        self.report.billed.append(billed(cached, sent, self.rates))
        self.report.sent.append(sent)
        self.previous = tuple(messages)


def replay(
    session: DemoSession,
    *,
    compactor: str = "window_manager",
    opts: Mapping[str, Any] | None = None,
    window: int | None = DEMO_WINDOW,
    model: str = DEMO_MODEL,
    turns: int | None = None,
    on_boundary: Callable[[Boundary, int, int], None] | None = None,
    survival: Mapping[str, Any] | None = None,
    on_call: Callable[[int, Sequence[Any]], None] | None = None,
) -> DemoReport:
    """Replay ``session`` (its first ``turns`` turns) with ``compactor`` and return the report.

    ``window`` pins ``context_window`` for a compactor that sizes against one (unless
    ``opts`` pin it already). The config is made with the entry point ``normandy demo``,
    so a bad option raises :class:`~normandy_core.OptionsError` before anything runs.
    ``on_boundary(boundary, batches_done, batches_total)`` sees each boundary as it happens.
    ``survival`` sets the survival rules (``None``: the defaults). ``on_call(index,
    messages)`` sees the entries each model call was sent, in order.
    """
    from normandy_core.contract.config import AgentConfig
    from normandy_core.contract.preparation import pin_if_needed

    options = dict(opts or {})
    if "context_window" not in options:
        options = pin_if_needed(compactor, options, window, entry="normandy demo")
    acc = AgentConfig.made_by(
        "normandy demo",
        model=model,
        system_prompt=session.system,
        tools=session.tools,
        compactor=compactor,
        compactor_opts=options,
        survival=survival,
    )
    chosen = session.turns if turns is None else session.turns[:turns]
    total_batches = sum(len(t.replies) - 1 for t in chosen)
    report = DemoReport(
        compactor=compactor,
        opts=options,
        model=model,
        window=acc.resolve_window(),
        prompt_tokens=acc.prompt_tokens,
    )

    def progress(boundary: Boundary) -> None:
        if on_boundary is not None:
            on_boundary(boundary, report.batches, total_batches)

    bill = _Biller.for_config(acc, report)
    tool_names = {str(t["name"]) for t in session.tools}
    started = time.perf_counter()
    for number, turn in enumerate(chosen, 1):
        acc, requests = _replay_turn(acc, number, turn, tool_names, report, progress)
        for request in requests:
            if on_call is not None:
                on_call(len(report.billed), request.messages)
            bill.call(request.messages)
    report.total_seconds = time.perf_counter() - started
    report.final_tokens = report.boundaries[-1].after if report.boundaries else 0
    return report


def _replay_turn(
    acc: AgentConfig,
    number: int,
    turn: DemoTurn,
    tool_names: set[str],
    report: DemoReport,
    progress: Callable[[Boundary], None],
) -> tuple[AgentConfig, list[ScriptedRequest]]:
    """Run the recorded ``turn`` (the ``number``-th) through ``run_turn``; returns the
    config after it and the requests its model calls were sent, in order."""
    from normandy_core.clients.scripted import ScriptedClient
    from normandy_core.turn import run_turn

    recording = _Replay(number, turn.outputs, report, progress)
    client = ScriptedClient.from_records(turn.replies, model=acc.model)
    result = run_turn(
        acc,
        turn.user,
        client=client,
        tools={name: recording.tool(name) for name in tool_names},
        turn_id=turn.turn_id,
        thinking=2048,
        on_event=recording.on_event,
    )
    report.turns += 1
    return result.acc, client.requests

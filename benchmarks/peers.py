"""The peers on the same workload and budget, at every tool-batch boundary of one session.

Each library is asked to fit the history into ``BUDGET`` tokens after every tool batch,
as an agent loop must before its next model call. Only the library's own call is timed;
converting its messages back to Normandy entries, checking tool pairing
(:func:`normandy_core.pairing_problems`) and counting the kept history with the exact
counter are done outside the timer. The floor is an incremental exact counter that
encodes only the new messages with raw tiktoken.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import BUDGET, clock, median, raw_encoding, raw_entry_tokens
from normandy_core import (
    AgentConfig,
    AgentMemory,
    Entry,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    get_counter,
    pairing_problems,
    run_compaction,
)
from normandy_core.app.workload import generate_session
from normandy_core.conversation.tokens import (
    MESSAGE_OVERHEAD,
    PARALLEL_CALLS_OVERHEAD,
    TOOL_CALL_OVERHEAD,
)

#: A kept item: the source entry and, for a partly kept result entry, the kept result ids.
Kept = list[tuple[Entry, frozenset[str] | None]]


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Drive a coroutine that never suspends (the peers' async calls here do no I/O)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("coroutine suspended; it was expected to complete synchronously")


@dataclass
class Outcome:
    """What one library did over the session."""

    name: str
    times: list[float] = field(default_factory=list)
    floor_times: list[float] = field(default_factory=list)
    overruns: int = 0
    orphaned: int = 0  # boundaries whose kept history has a pairing problem
    boundaries: int = 0
    total_boundaries: int = 0
    messages_reached: int = 0
    last_time: float = 0.0
    capped: bool = False
    kept_tokens: list[int] = field(default_factory=list)
    stride: int = 1


class Checker:
    """Exact token counts and pairing checks of kept histories, outside the timers."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.counter = get_counter("cl100k_base")
        self.memory = AgentMemory.from_entries(entries)
        self.memory.tokens(self.counter)
        enc = raw_encoding()
        self.result_tokens: dict[str, int] = {}
        for e in entries:
            for r in e.tool_results:
                self.result_tokens[r.tool_use_id] = len(enc.encode_ordinary(r.text()))

    def tokens(self, kept: Kept) -> int:
        total = 0
        for e, part in kept:
            if part is None:
                total += self.memory.entry_tokens(e, self.counter)
            else:
                # one tool message per kept result
                total += sum(MESSAGE_OVERHEAD + self.result_tokens[i] for i in part)
        return total

    @staticmethod
    def entries(kept: Kept) -> list[Entry]:
        out: list[Entry] = []
        for e, part in kept:
            if part is None:
                out.append(e)
            else:
                assert not isinstance(e.content, str)
                blocks = tuple(
                    b
                    for b in e.content
                    if not isinstance(b, ToolResultBlock) or b.tool_use_id in part
                )
                out.append(e.model_copy(update={"content": blocks}))
        return out

    def check(self, out: Outcome, kept: Kept) -> None:
        n = self.tokens(kept)
        out.kept_tokens.append(n)
        if n > BUDGET:
            out.overruns += 1
        if pairing_problems(self.entries(kept)):
            out.orphaned += 1


def group_kept(kept: list[tuple[Entry, str | None]]) -> Kept:
    """Merge consecutive kept tool results of one entry into one partly kept entry."""
    out: Kept = []
    for e, rid in kept:
        if rid is None:
            out.append((e, None))
            continue
        if out and out[-1][0] is e and out[-1][1] is not None:
            prev = out[-1][1]
            assert prev is not None
            out[-1] = (e, prev | {rid})
        else:
            out.append((e, frozenset({rid})))
    # a fully kept result entry counts as the whole entry
    return [
        (e, None if part is not None and len(part) == len(e.tool_results) else part)
        for e, part in out
    ]


def _thinking(e: Entry) -> str:
    return "\n".join(b.thinking for b in e.blocks if isinstance(b, ThinkingBlock))


def _text(e: Entry) -> str:
    return "\n".join(b.text for b in e.blocks if isinstance(b, TextBlock))


# -- LangChain ------------------------------------------------------------------------------


def _lc_convert(
    entries: Sequence[Entry],
) -> tuple[list[list[Any]], dict[int, tuple[Entry, str | None]]]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    per: list[list[Any]] = []
    back: dict[int, tuple[Entry, str | None]] = {}
    for e in entries:
        msgs: list[Any] = []
        if e.role == "system":
            msgs.append(SystemMessage(content=e.text(), id=e.id))
        elif e.role == "assistant":
            content: list[str | dict[str, Any]] = []
            if _thinking(e):
                content.append({"type": "thinking", "thinking": _thinking(e)})
            if _text(e):
                content.append({"type": "text", "text": _text(e)})
            calls = [
                {"id": u.id, "name": u.name, "args": dict(u.input), "type": "tool_call"}
                for u in e.tool_uses
            ]
            msgs.append(AIMessage(content=content, tool_calls=calls, id=e.id))
        elif e.tool_results:
            for r in e.tool_results:
                m = ToolMessage(content=r.text(), tool_call_id=r.tool_use_id, id=r.tool_use_id)
                back[id(m)] = (e, r.tool_use_id)
                msgs.append(m)
            per.append(msgs)
            continue
        else:
            msgs.append(HumanMessage(content=e.text(), id=e.id))
        back[id(msgs[0])] = (e, None)
        per.append(msgs)
    return per, back


def _lc_exact_counter() -> Callable[[Sequence[Any]], int]:
    """The same exact count as Normandy's (raw tiktoken, per message, no cache).

    A list counter, as ``trim_messages`` calls it: it sums the messages it is given.
    """
    enc = raw_encoding()

    def count_one(message: Any) -> int:
        n = MESSAGE_OVERHEAD
        c = message.content
        if isinstance(c, str):
            n += len(enc.encode_ordinary(c))
        else:
            for b in c:
                if isinstance(b, str):
                    n += len(enc.encode_ordinary(b))
                else:
                    t = b.get("text") or b.get("thinking") or ""
                    n += len(enc.encode_ordinary(t))
        calls = getattr(message, "tool_calls", ()) or ()
        for call in calls:
            n += TOOL_CALL_OVERHEAD + len(enc.encode_ordinary(call["name"]))
            args = json.dumps(call["args"], ensure_ascii=False)
            n += len(enc.encode_ordinary(args))
        if len(calls) > 1:
            n += PARALLEL_CALLS_OVERHEAD
        return n

    def count(messages: Sequence[Any]) -> int:
        return sum(count_one(m) for m in messages)

    return count


# -- Strands --------------------------------------------------------------------------------


def strands_convert(entries: Sequence[Entry]) -> tuple[list[dict[str, Any]], dict[int, Entry]]:
    """The entries as Strands messages (system entries left out), and each message's
    entry by the message's ``id``."""
    msgs: list[dict[str, Any]] = []
    back: dict[int, Entry] = {}
    for e in entries:
        content: list[dict[str, Any]] = []
        if e.role == "system":
            continue  # Strands keeps the system prompt outside the messages
        for b in e.blocks:
            if isinstance(b, ThinkingBlock):
                content.append(
                    {
                        "reasoningContent": {
                            "reasoningText": {"text": b.thinking, "signature": b.signature}
                        }
                    }
                )
            elif isinstance(b, TextBlock):
                content.append({"text": b.text})
            elif isinstance(b, ToolUseBlock):
                content.append(
                    {"toolUse": {"toolUseId": b.id, "name": b.name, "input": dict(b.input)}}
                )
            elif isinstance(b, ToolResultBlock):
                content.append(
                    {
                        "toolResult": {
                            "toolUseId": b.tool_use_id,
                            "content": [{"text": b.text()}],
                            "status": "error" if b.is_error else "success",
                        }
                    }
                )
        m = {"role": "assistant" if e.role == "assistant" else "user", "content": content}
        back[id(m)] = e
        msgs.append(m)
    return msgs, back


def _strands_model(window: int) -> Any:
    from strands.models.model import Model

    class BenchModel(Model):
        """A model that only answers the questions the conversation manager asks."""

        def __init__(self) -> None:
            self.config = {"context_window_limit": window}

        def update_config(self, **model_config: Any) -> None:
            self.config.update(model_config)

        def get_config(self) -> Any:
            return self.config

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    return BenchModel()


# -- AutoGen --------------------------------------------------------------------------------


def _autogen_convert(entries: Sequence[Entry]) -> tuple[list[Any], dict[int, Entry]]:
    from autogen_core import FunctionCall
    from autogen_core.models import (
        AssistantMessage,
        FunctionExecutionResult,
        FunctionExecutionResultMessage,
        SystemMessage,
        UserMessage,
    )

    msgs: list[Any] = []
    back: dict[int, Entry] = {}
    for e in entries:
        m: Any
        if e.role == "system":
            m = SystemMessage(content=e.text())
        elif e.role == "assistant":
            thought = "\n".join(x for x in (_thinking(e), _text(e)) if x) or None
            uses = e.tool_uses
            if uses:
                calls = [
                    FunctionCall(id=u.id, name=u.name, arguments=json.dumps(u.input)) for u in uses
                ]
                m = AssistantMessage(content=calls, thought=thought, source="assistant")
            else:
                m = AssistantMessage(
                    content=_text(e), thought=_thinking(e) or None, source="assistant"
                )
        elif e.tool_results:
            m = FunctionExecutionResultMessage(
                content=[
                    FunctionExecutionResult(
                        content=r.text(), call_id=r.tool_use_id, name="tool", is_error=r.is_error
                    )
                    for r in e.tool_results
                ]
            )
        else:
            m = UserMessage(content=e.text(), source="user")
        back[id(m)] = e
        msgs.append(m)
    return msgs, back


class _AutogenCounter:
    """The ``count_tokens`` AutoGen asks its model client for: exact tiktoken, no cache."""

    def __init__(self) -> None:
        self.enc = raw_encoding()

    def count_tokens(self, messages: Sequence[Any], *, tools: Sequence[Any] = ()) -> int:
        enc = self.enc
        n = 0
        for m in messages:
            n += MESSAGE_OVERHEAD
            c = m.content
            if isinstance(c, str):
                n += len(enc.encode_ordinary(c))
            else:
                for part in c:
                    if hasattr(part, "arguments"):
                        n += len(enc.encode_ordinary(part.name))
                        n += len(enc.encode_ordinary(part.arguments))
                    elif hasattr(part, "call_id"):
                        n += len(enc.encode_ordinary(part.content))
            thought = getattr(m, "thought", None)
            if thought:
                n += len(enc.encode_ordinary(thought))
        return n


# -- the session ----------------------------------------------------------------------------


def session_entries(messages: int, seed: int = 3) -> list[Entry]:
    """The peer session's entries (ending after a tool batch)."""
    return generate_session(seed, messages, end_mid_round=True).entries()


def _batches(entries: Sequence[Entry]) -> list[tuple[int, int]]:
    """``[start, end)`` of what is appended before each tool-batch boundary."""
    out: list[tuple[int, int]] = []
    start = 0
    for i, e in enumerate(entries):
        if e.role == "user" and e.tool_results:
            out.append((start, i + 1))
            start = i + 1
    return out


def floor(entries: Sequence[Entry]) -> list[float]:
    """Per-boundary cost of the incremental exact floor over the session."""
    enc = raw_encoding()
    total = 0
    times: list[float] = []
    for start, end in _batches(entries):
        t0 = clock()
        for e in entries[start:end]:
            total += raw_entry_tokens(enc, e)
        times.append(clock() - t0)
    return times


def run_peer(
    name: str, entries: Sequence[Entry], checker: Checker, cap: float, stride: int = 1
) -> Outcome:
    """Run one library over the session, stopping when its timed cost passes ``cap`` s.

    With ``stride`` k > 1 the library is asked to fit the history at every k-th boundary
    only (the messages in between are still appended), so a slow library reaches the
    large histories within the time cap.
    """
    batches = _batches(entries)
    enc = raw_encoding()
    out = Outcome(name=name, total_boundaries=len(batches), stride=stride)
    # Warm-up on a throwaway instance: first-call imports and caches are not charged.
    warm = _STEPS[name](entries)
    for start, end in batches[:2]:
        warm(start, end)
    step = _STEPS[name](entries)
    spent = 0.0
    first: int | None = None
    waiting = 0
    for k, (start, end) in enumerate(batches):
        if first is None:
            first = start
        waiting += 1
        if (k + 1) % stride and k + 1 < len(batches):
            continue
        # The floor on the same appended messages, timed just before the library's call, so
        # the two share the machine's state: the ratio is measured in the same run. With a
        # stride the messages of ``waiting`` boundaries were appended: their floor, per
        # boundary, is the time divided by that number.
        t0 = clock()
        for e in entries[first:end]:
            raw_entry_tokens(enc, e)
        out.floor_times.append((clock() - t0) / waiting)
        waiting = 0
        dt, kept = step(first, end)
        first = None
        out.times.append(dt)
        out.boundaries += 1
        out.messages_reached = end
        out.last_time = dt
        checker.check(out, kept)
        spent += dt
        if spent > cap and out.boundaries < len(batches):
            out.capped = True
            break
    return out


Step = Callable[[int, int], tuple[float, Kept]]


def _normandy(counter: str) -> Callable[[Sequence[Entry]], Step]:
    def make(entries: Sequence[Entry]) -> Step:
        state = {
            "acc": AgentConfig(
                compactor="window_manager",
                compactor_opts={"context_window": BUDGET, "reserved_tokens": 0, "counter": counter},
            )
        }

        def step(start: int, end: int) -> tuple[float, Kept]:
            acc: AgentConfig = state["acc"]
            for e in entries[start:end]:
                acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
            t0 = clock()
            acc, meta = run_compaction(acc, mid_round=True)
            dt = clock() - t0
            assert "error" not in meta, meta
            state["acc"] = acc
            return dt, [(e, None) for e in acc.memory]

        return step

    return make


def _langchain(pattern: str, approximate: bool) -> Callable[[Sequence[Entry]], Step]:
    def make(entries: Sequence[Entry]) -> Step:
        from langchain_core.messages import trim_messages

        per, back = _lc_convert(entries)
        counter: Any = "approximate" if approximate else _lc_exact_counter()
        history: list[Any] = []

        def step(start: int, end: int) -> tuple[float, Kept]:
            nonlocal history
            new = [m for msgs in per[start:end] for m in msgs]
            history.extend(new)
            t0 = clock()
            view = trim_messages(
                history,
                max_tokens=BUDGET,
                token_counter=counter,
                strategy="last",
                include_system=True,
                start_on="human",
                end_on=("human", "tool"),
                allow_partial=False,
            )
            if pattern == "overwrite":
                history = view
            dt = clock() - t0
            return dt, group_kept([back[id(m)] for m in view])

        return step

    return make


def _strands(entries: Sequence[Entry]) -> Step:
    from strands.agent.conversation_manager import SlidingWindowConversationManager
    from strands.event_loop.event_loop import _estimate_input_tokens

    msgs, back = strands_convert(entries)
    by_entry = {id(e): m for m, e in ((m, back[id(m)]) for m in msgs)}
    counter = get_counter("cl100k_base")
    mem = AgentMemory.from_entries(entries)
    model = _strands_model(BUDGET)
    agent = types.SimpleNamespace(messages=[], model=model)
    manager = SlidingWindowConversationManager(
        window_size=1_000_000, should_truncate_results=False, proactive_compression=True
    )
    sent = {"tokens": 0}

    def step(start: int, end: int) -> tuple[float, Kept]:
        for e in entries[start:end]:
            if e.role == "system":
                continue
            m = by_entry[id(e)]
            if e.role == "assistant":
                # The provider reports what it was sent (the history after the last fit) and
                # what it wrote: Strands takes that as the exact baseline.
                out_t = mem.entry_tokens(e, counter)
                m["metadata"] = {
                    "usage": {
                        "inputTokens": sent["tokens"],
                        "outputTokens": out_t,
                        "totalTokens": sent["tokens"] + out_t,
                    }
                }
            agent.messages.append(m)
        t0 = clock()
        projected = run_sync(_estimate_input_tokens(agent))
        event = types.SimpleNamespace(agent=agent, projected_input_tokens=projected)
        manager._on_before_model_call_threshold(event)
        dt = clock() - t0
        kept: Kept = [(entries[0], None)] + [(back[id(m)], None) for m in agent.messages]
        sent["tokens"] = sum(mem.entry_tokens(e, counter) for e, _ in kept)
        return dt, kept

    return step


def _autogen(kind: str) -> Callable[[Sequence[Entry]], Step]:
    def make(entries: Sequence[Entry]) -> Step:
        from autogen_core.model_context import (
            BufferedChatCompletionContext,
            TokenLimitedChatCompletionContext,
        )

        msgs, back = _autogen_convert(entries)
        ctx: Any
        if kind == "token_limited":
            ctx = TokenLimitedChatCompletionContext(_AutogenCounter(), token_limit=BUDGET)  # type: ignore[arg-type]
        else:
            mem = AgentMemory.from_entries(entries)
            mean = mem.tokens(get_counter("cl100k_base")) / max(len(entries), 1)
            ctx = BufferedChatCompletionContext(buffer_size=max(int(BUDGET / mean), 1))

        def step(start: int, end: int) -> tuple[float, Kept]:
            for m in msgs[start:end]:
                run_sync(ctx.add_message(m))
            t0 = clock()
            view = run_sync(ctx.get_messages())
            dt = clock() - t0
            return dt, [(back[id(m)], None) for m in view]

        return step

    return make


_STEPS: dict[str, Callable[[Sequence[Entry]], Step]] = {
    "normandy window_manager (exact)": _normandy("cl100k_base"),
    "normandy window_manager (estimate)": _normandy("estimate"),
    "LangChain trim_messages, overwrite (exact)": _langchain("overwrite", approximate=False),
    "LangChain trim_messages, overwrite (approximate)": _langchain("overwrite", approximate=True),
    "LangChain trim_messages, keep full (exact)": _langchain("keep_full", approximate=False),
    "Strands SlidingWindow, proactive": _strands,
    "AutoGen BufferedChatCompletionContext": _autogen("buffered"),
    "AutoGen TokenLimitedChatCompletionContext": _autogen("token_limited"),
}

PEERS = list(_STEPS)


def run_all(messages: int, cap: float, strides: dict[str, int] | None = None) -> dict[str, Any]:
    """Every library over one session of ``messages`` messages; per-boundary medians."""
    entries = session_entries(messages)
    checker = Checker(entries)
    floor_times = floor(entries)
    f = median(floor_times)
    results: list[Outcome] = []
    for name in PEERS:
        results.append(run_peer(name, entries, checker, cap, (strides or {}).get(name, 1)))
    return {"messages": len(entries), "floor": f, "results": results}

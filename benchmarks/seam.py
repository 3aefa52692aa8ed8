"""Benchmarks of the contract seam (issue 11): boundaries against the floor, run_turn, memory.

* ``boundaries``: a boundary that does not compact, at both kinds of boundary (turn start
  after a user message, and after a tool batch), against the incremental exact floor,
  the two timed in alternating order (odd boundaries ours first, even ones the floor
  first), so neither warms the caches the other uses.
* ``run_turn_boundaries``: a whole ``run_turn`` (scripted model, tools returning the
  workload's outputs) per boundary, against the floor of counting exactly the messages
  the turn appended, once each.
* ``memory_flat``: traced memory of an agent over 10,000 compacting boundaries, sampled
  along the way: flat when the count cache holds only live entries.
"""

from __future__ import annotations

import tracemalloc
from collections import deque
from typing import Any, NamedTuple

from benchmarks.common import (
    append,
    clock,
    median,
    raw_encoding,
    raw_entry_tokens,
    settle,
    workload,
)
from normandy_core import AgentConfig, AgentMemory, Entry, get_counter, run_compaction

COUNTER = "cl100k_base"


def _config(memory: AgentMemory, **opts: Any) -> AgentConfig:
    base: dict[str, Any] = {"counter": COUNTER}
    base.update(opts)
    return AgentConfig(
        model="gpt-4o", compactor="window_manager", compactor_opts=base, memory=memory
    )


def boundaries(size: int, count: int, repeat: int) -> dict[str, Any]:
    """Per-boundary medians of ours and the floor, at turn start and after a tool batch."""
    enc = raw_encoding()
    counter = get_counter(COUNTER)
    wl = workload(size, extra=count * repeat * 6 + 64)
    memory = AgentMemory.from_entries(wl.history)
    memory.tokens(counter)  # the agent counted its history as it grew
    acc = _config(memory, context_window=10**12, reserved_tokens=0)
    batches = wl.batches()
    samples: dict[str, list[float]] = {
        k: [] for k in ("start", "start_floor", "tool", "tool_floor")
    }
    for _ in range(repeat):
        settle()
        for n in range(count):
            batch = next(batches)
            # A turn start: the user's message (the batch's first entry, as a user turn).
            user = Entry(id=f"u-{n}-{batch[0].id}", role="user", content=batch[-1].text()[:400])
            for kind, entries, mid in (("start", [user], False), ("tool", batch, True)):
                floor_first = n % 2 == 1
                if floor_first:
                    t0 = clock()
                    for e in entries:
                        raw_entry_tokens(enc, e)
                    samples[f"{kind}_floor"].append(clock() - t0)
                append(memory, entries)
                t0 = clock()
                acc, meta = run_compaction(acc, mid_round=mid)
                samples[kind].append(clock() - t0)
                assert not meta["compacted"] and "error" not in meta, meta
                if not floor_first:
                    t0 = clock()
                    for e in entries:
                        raw_entry_tokens(enc, e)
                    samples[f"{kind}_floor"].append(clock() - t0)
    out: dict[str, Any] = {"size": len(wl.history)}
    for kind in ("start", "tool"):
        ours, floor = median(samples[kind]), median(samples[f"{kind}_floor"])
        out[kind] = {"ours": ours, "floor": floor, "ratio": ours / floor}
    return out


class TurnScript(NamedTuple):
    """One scripted turn: the model's replies, the tools' outputs in call order, and the
    messages the turn appends (built beforehand, so the floor can count them first)."""

    turn_id: str
    user: str
    replies: list[Any]
    outputs: list[str]
    expected: list[Entry]


def turn_scripts(turns: int, batches_per_turn: int) -> tuple[Any, list[TurnScript]]:
    """The history's workload and ``turns + 1`` scripted turns (the first a warm-up)."""
    from normandy_core.clients.base import ModelReply
    from normandy_core.conversation.entries import TextBlock, ToolResultBlock

    wl = workload(200, extra=(turns + 1) * batches_per_turn * 6 + 64)
    batches = wl.batches()
    scripts: list[TurnScript] = []
    for t in range(-1, turns):
        user = f"task {t}"
        replies: list[ModelReply] = []
        outputs: list[str] = []
        expected = [Entry(id=f"x{t}-u", role="user", content=user)]
        for b in range(batches_per_turn):
            batch = next(batches)
            # A batch may open with the next user turn: the model's call is the assistant
            # entry, the tools return the recorded outputs in call order.
            at = next(i for i, e in enumerate(batch) if e.role == "assistant" and e.tool_uses)
            # without its thinking: the turns run with thinking off, as the replies do
            calls = batch[at].without_thinking()
            outs = [r.text() for e in batch[at + 1 :] for r in e.tool_results]
            outputs.extend(outs)
            replies.append(ModelReply(content=tuple(calls.blocks), stop_reason="tool_use"))
            results = tuple(
                ToolResultBlock(tool_use_id=u.id, content=o)
                for u, o in zip(calls.tool_uses, outs, strict=True)
            )
            expected.append(Entry(id=f"x{t}-a{b}", role="assistant", content=tuple(calls.blocks)))
            expected.append(Entry(id=f"x{t}-r{b}", role="user", content=results))
        done = (TextBlock(text=f"turn {t} done"),)
        replies.append(ModelReply(content=done))
        expected.append(Entry(id=f"x{t}-f", role="assistant", content=done))
        scripts.append(TurnScript(f"bench-{t}", user, replies, outputs, expected))
    return wl, scripts


def turn_agent(
    turns: int, batches_per_turn: int
) -> tuple[list[TurnScript], deque[str], dict[str, Any], AgentConfig]:
    """The scripted turns, the queue of tool outputs they answer with, the agent's tools
    and its config (its history counted, as an agent's is as it grows).

    The tools: every tool the workload calls, each answering with the recorded output
    next in line (queued by the caller before each turn). One table for every turn, as an
    agent has, so a warm-up turn derives all their definitions (a per-process cost, not a
    boundary's).
    """
    wl, scripts = turn_scripts(turns, batches_per_turn)
    outputs: deque[str] = deque()

    def recorded(**kwargs: Any) -> str:
        return outputs.popleft()

    tools = dict.fromkeys(
        {u.name for e in wl.stream if e.role == "assistant" for u in e.tool_uses}, recorded
    )
    acc = _config(AgentMemory.from_entries(wl.history), context_window=10**12, reserved_tokens=0)
    acc.memory.tokens(acc.prepared.counter_for(acc.model))
    return scripts, outputs, tools, acc


def run_turn_boundaries(turns: int, batches_per_turn: int) -> dict[str, Any]:
    """Seconds per boundary of whole ``run_turn`` calls, and of the floor for the same work.

    The floor counts, with raw tiktoken, every message the turns append (each once): the
    messages are built beforehand from the script, and checked afterwards to count
    exactly what the turn appended. The two are timed in alternating order (odd turns
    the floor first, even ones after the turn), as in :func:`boundaries`, so neither
    warms the caches the other uses; ``ratio_floor_first`` and ``ratio_floor_after``
    are the two halves. One turn runs first, unmeasured: what happens once per process
    (loading the hook plugins, deriving the tool definitions) is not a boundary's cost.
    """
    from normandy_core.clients.scripted import ScriptedClient
    from normandy_core.turn import run_turn

    enc = raw_encoding()
    scripts, outputs, tools, acc = turn_agent(turns, batches_per_turn)
    sums = {"ours": [0.0, 0.0], "floor": [0.0, 0.0], "boundaries": [0, 0]}
    for n, script in enumerate(scripts):
        t = n - 1
        floor_first = t % 2 == 1
        client = ScriptedClient(script.replies, model="gpt-4o")
        outputs.extend(script.outputs)
        before = len(acc.memory)
        settle()
        if floor_first:
            t0 = clock()
            for e in script.expected:
                raw_entry_tokens(enc, e)
            counted = clock() - t0
        t0 = clock()
        result = run_turn(acc, script.user, client=client, tools=tools, turn_id=script.turn_id)
        took = clock() - t0
        acc = result.acc
        if not floor_first:
            t0 = clock()
            for e in script.expected:
                raw_entry_tokens(enc, e)
            counted = clock() - t0
        assert result.reason == "answer" and not outputs, (result.reason, len(outputs))
        added = acc.memory.entries()[before:]
        # the floor counted exactly what the turn appended
        assert [(e.role, raw_entry_tokens(enc, e)) for e in added] == [
            (e.role, raw_entry_tokens(enc, e)) for e in script.expected
        ], script.turn_id
        if t < 0:
            continue  # the warm-up turn
        half = int(floor_first)
        sums["ours"][half] += took
        sums["floor"][half] += counted
        sums["boundaries"][half] += sum(1 for e in result.events if e.get("type") == "boundary")
    boundaries_run = sum(sums["boundaries"])
    ours, floor = sum(sums["ours"]), sum(sums["floor"])
    return {
        "boundaries": boundaries_run,
        "ours": ours / boundaries_run,
        "floor": floor / boundaries_run,
        "ratio": ours / floor,
        "ratio_floor_first": sums["ours"][1] / sums["floor"][1],
        "ratio_floor_after": sums["ours"][0] / sums["floor"][0],
    }


def memory_flat(total: int, window: int, every: int) -> dict[str, Any]:
    """Traced bytes of an agent over ``total`` boundaries that compact against ``window``."""
    wl = workload(50, extra=total * 6 + 64, seed=13)
    batches = wl.batches()
    acc = _config(
        AgentMemory.from_entries(wl.history),
        context_window=window,
        reserved_tokens=1_000,
        target=0.5,
    )
    settle()
    tracemalloc.start()
    samples: list[dict[str, int]] = []
    compactions = 0
    for n in range(1, total + 1):
        append(acc.memory, next(batches))
        acc, meta = run_compaction(acc, mid_round=True)
        compactions += int(meta["compacted"])
        if n % every == 0:
            settle()
            cached = sum(len(c) for c in acc.memory._counts.values())
            samples.append(
                {
                    "boundary": n,
                    "bytes": tracemalloc.get_traced_memory()[0],
                    "live_entries": len(acc.memory),
                    "cached_counts": cached,
                }
            )
    tracemalloc.stop()
    first, last = samples[0]["bytes"], samples[-1]["bytes"]
    return {"samples": samples, "compactions": compactions, "growth": last / first}

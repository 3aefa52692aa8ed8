"""Shared by the shell and client tests: a small correct compactor, a hook, request checks.

Loaded by path from the conftests of tests/turn and tests/clients (not a test module).
The compactor stands in for window_manager until it lands on this branch.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from normandy_core import (
    AgentMemory,
    Entry,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    default_counter_for,
    drop_thinking,
    get_counter,
    group_units,
    hookimpl,
    pairing_problems,
    register_compactor,
    register_hook,
    unregister_compactor,
    unregister_hook,
)
from normandy_core.clients import open_round_start
from normandy_core.conversation.calibration import calibrated_counter, default_calibration

COMPACTOR = "keep_tail_test"
#: (start, end) of every blocking ``sleep`` the compactor did, in perf_counter seconds.
SLEEPS: list[tuple[float, float]] = []


class KeepTail:
    """Drops whole units, oldest first, when over the window; strips thinking when it does.

    Keeps system and pinned entries, the running turn's prompt and the newest unit, and
    never lets the kept conversation start with an assistant message. Options:
    ``context_window`` (pinned window), ``target`` (fraction to compact down to),
    ``sleep`` (seconds to block, to show the async shell keeps the loop free).
    """

    @hookimpl
    def validate_opts(self, opts: dict[str, Any], entry: str) -> None:
        unknown = set(opts) - {"context_window", "target", "sleep", "counter"}
        if unknown:
            raise ValueError(f"{entry}: unknown options {sorted(unknown)}")

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
        if opts.get("sleep"):
            t0 = time.perf_counter()
            time.sleep(float(opts["sleep"]))
            SLEEPS.append((t0, time.perf_counter()))
        spec = opts.get("counter") or default_counter_for(ctx.model)
        counter = calibrated_counter(get_counter(spec), ctx.model)
        mem: AgentMemory = acc.memory
        entries = mem.entries()
        before = counter.memory_tokens(mem)
        if before + ctx.prompt_tokens <= ctx.window:
            return acc, {"compacted": False}
        target = ctx.window * float(opts.get("target", 0.6)) - ctx.prompt_tokens
        units = group_units(entries)
        prompt = next(
            (
                i
                for i, e in enumerate(entries)
                if e.turn_id == ctx.turn_id and e.role == "user" and not e.tool_results
            ),
            None,
        )
        protected = {len(units) - 1}
        for u, (a, b) in enumerate(units):
            if any(entries[i].role == "system" or entries[i].pinned for i in range(a, b)):
                protected.add(u)
            if prompt is not None and a <= prompt < b:
                protected.add(u)
        dropped_idx: set[int] = set()
        total = before
        for u, (a, b) in enumerate(units):
            if total <= target:
                break
            if u in protected:
                continue
            for i in range(a, b):
                dropped_idx.add(i)
                total -= counter.entry_tokens(mem, entries[i])
        kept = [e for i, e in enumerate(entries) if i not in dropped_idx]
        # the conversation must open with a user message
        while True:
            first = next((e for e in kept if e.role != "system"), None)
            if first is None or first.role == "user" or first.pinned:
                break
            j = kept.index(first)
            unit = [first]
            for e in kept[j + 1 :]:
                if e.tool_results:
                    unit.append(e)
                else:
                    break
            for e in unit:
                kept.remove(e)
                dropped_idx.add(entries.index(e))
        if not dropped_idx:
            return acc, {"compacted": False, "error": "nothing can be dropped"}
        dropped = [e for i, e in enumerate(entries) if i in dropped_idx]
        new_mem = drop_thinking(mem.derive(kept))
        after = counter.memory_tokens(new_mem)
        removed = sum(counter.entry_tokens(mem, e) for e in dropped if e.turn_id == ctx.turn_id)
        return acc.with_memory(new_mem), {
            "compacted": True,
            "strategy": "keep_tail_test",
            "tokens_before": before,
            "tokens_after": after,
            "tokens_removed": removed,
            "dropped": dropped,
        }


class DropRecorder:
    """An after_compact hook plugin that keeps what it was shown."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @hookimpl
    def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
        self.calls.append({"mid_round": ctx.mid_round, "dropped": list(meta["dropped"])})


def starts_with_thinking(entry: Entry) -> bool:
    blocks = [b for b in entry.blocks if not (isinstance(b, TextBlock) and not b.text)]
    return bool(blocks) and isinstance(blocks[0], (ThinkingBlock, RedactedThinkingBlock))


def request_problems(messages: list[Entry], thinking_on: bool) -> list[str]:
    """What Anthropic would refuse in a request over ``messages`` (entries)."""
    problems = pairing_problems(messages, allow_pending=False)
    for e in messages:
        if e.role == "assistant" and e.has_thinking and not starts_with_thinking(e):
            problems.append(f"assistant entry {e.id} holds thinking but does not start with it")
    at = open_round_start(messages)
    if at is not None and thinking_on and not starts_with_thinking(messages[at]):
        problems.append("thinking on, but the open round's last assistant lacks thinking")
    if not thinking_on:
        last = [e for e in messages if e.role == "assistant"]
        if last and last[-1].has_thinking:
            problems.append("thinking off, but the final assistant message holds thinking")
    return problems


@pytest.fixture
def keep_tail():
    """The keep-tail test compactor, registered in code for the test; calibration reset."""
    register_compactor(COMPACTOR, KeepTail(), replace=True)
    default_calibration().reset()
    yield COMPACTOR
    unregister_compactor(COMPACTOR)
    default_calibration().reset()


@pytest.fixture
def drops():
    """An after_compact hook registered in code; yields the recorder."""
    rec = DropRecorder()
    qname = register_hook(rec, name=f"drop-recorder-{id(rec)}")
    yield rec
    unregister_hook(qname)

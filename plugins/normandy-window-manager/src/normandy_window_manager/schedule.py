"""``schedule="cost"``: compact when it pays for the cache rewrite it causes.

The billing model is :mod:`normandy_core.conversation.cost`'s: the next call reads from the prompt
cache what the previous call sent (0.1x the input price) up to the first message a compaction
changed, and writes the rest (1.25x). Every call re-reads the whole kept conversation, so
a large kept context costs every call, and a compaction costs one rewrite of what it keeps
after its first change. Between two compactions the conversation grows by ``g`` tokens per
call (:func:`normandy_core.conversation.cost.growth_per_call`, the newest eight calls).

A compaction *plan* leaves ``A`` tokens (prompt included) of which ``K`` stay cached; a
*cycle* is the plan's compaction and the ``n`` calls until the next one. Its billed tokens
per call are (``r`` read, ``w`` write)::

    rate(n) = ((w - r) * (A - K) + r * (n*A + g*n*(n-1)/2) + (w - r) * g * (n-1)) / n

for the best ``n`` (at most ``horizon`` calls, and never past the usable window). The next
call without compacting costs ``r * cached + w * (sent - cached)``. Waiting is worth it
while that call costs less than the best plan's cycle rate: once it costs more, every
further call without compacting costs more than the long-run average with it (the
renewal rule), so the schedule compacts. At a turn start in a turn loop the next call is
charged too the reasoning the coming round would lose if it overflowed the usable window
(its calls after the overflow run with thinking disabled), and each plan that of the round
started from its size (:mod:`normandy_window_manager.reasoning`; ``thinking_value`` 0
weighs the cache alone); the plan chosen is the cheapest of the two together. Since
``rate`` grows with ``A``, the cheapest cycle keeps little: the plans cut to the **floor**.

The floor: the newest ``target`` of the usable window when ``target`` is given, else
:data:`COST_FLOOR` (25 %) of it; with the newest unit, system entries and what the survival
rules keep, always kept. What is cut is archived and recallable (``recall``), and a marker
says where. Two plans are weighed:

* **clear**: clear old tool results, oldest first, until the floor is reached (or none is
  left): the messages and their structure stay, so the cache breaks only at the first
  result cleared. Results in the floor, results a survival rule keeps and the newest
  unit's are never cleared.
* **drop**: drop whole units down to the floor by the configured strategy.

The cheaper plan (by cycle rate) wins. Once it has cut, the schedule weighs its result
again (the growth estimate and the plans change once the history is cut: cleared results
end its intact part) and cuts again while that pays, at most :data:`MAX_ROUNDS` rounds:
given its own output, it waits. Over the usable window the schedule always
compacts (``forced``: the window is never exceeded); at a mid-round boundary under it,
never (the contract). Every boundary it weighs reports in meta ``billed_next_without``
and ``billed_next_with`` (next call), ``cost_rate_without`` and ``cost_rate_with`` (the
next call's and the chosen cycle's billed tokens per call), ``cost_horizon_without`` and
``cost_horizon_with`` (the same over the cycle's calls), ``cost_cycle_calls``,
``cost_plan`` (``"clear"`` or ``"drop"``), ``cost_plans`` (each plan's rate),
``cost_floor``, ``growth_per_call`` and ``cost_decision`` (``"forced"``, ``"pays"`` or ``"waits"``),
all of its first round; a compaction adds ``cost_rounds``. Where the reasoning is weighed,
also ``round_estimate``, ``reasoning_per_call`` (billed tokens), ``disabled_calls_without``
and ``disabled_calls_with`` (the round's calls with thinking disabled, waiting and after the
chosen plan) and ``cost_reasoning_without`` and ``cost_reasoning_with`` (their price).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normandy_core import Entry, ToolResultBlock, group_units
from normandy_core.conversation import keys
from normandy_core.conversation.cost import (
    CacheRates,
    billed,
    cached_until,
    growth_per_call,
    rates_for,
)
from normandy_window_manager.cut import cut_to_target
from normandy_window_manager.reasoning import RoundRisk, reasoning_record, round_risk

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext
    from normandy_window_manager.options import WindowManagerOptions

__all__ = [
    "CLEARED_KEY",
    "CLEARED_TEXT",
    "COST_FLOOR",
    "MAX_ROUNDS",
    "Plan",
    "Priced",
    "cost_schedule",
    "cycle_rate",
    "price_plans",
]

#: Entry metadata key listing the tool-use ids whose results were cleared (the same key
#: ``clear_tool_results`` uses, so either recognises the other's work).
CLEARED_KEY = keys.CLEARED_KEY
#: What a cleared tool result says instead of its content.
CLEARED_TEXT = "[tool result cleared by normandy window_manager to save context; archived]"
#: The share of the usable window the cost schedule always keeps (the newest messages)
#: when ``target`` is not given.
COST_FLOOR = 0.25
#: The most rounds of one boundary: a compaction's result is weighed again (the growth
#: estimate and the plans change once the history is cut) and compacted again while that
#: pays, so that compacting the output once more changes nothing.
MAX_ROUNDS = 8


@dataclass(frozen=True)
class Plan:
    """One way to compact: ``size`` tokens sent after it, ``kept`` of them still cached."""

    name: str  # "clear" or "drop"
    level: int  # the tokens (prompt included) it aims at: the floor
    size: int  # estimated tokens sent after it
    kept: int  # cached tokens it keeps (the prefix before its first change)
    clears: int  # how many of the clearable results it clears
    drops: bool  # whether it drops units (after clearing ``clears`` results)


def cycle_rate(
    size: int, kept: int, growth: float, max_calls: int, rates: CacheRates
) -> tuple[float, int]:
    """The lowest billed tokens per call of a cycle that starts at ``size`` tokens with
    ``kept`` of them cached and grows by ``growth`` per call, over at most ``max_calls``
    calls, and the number of calls that reaches it (see the module)."""
    extra = rates.write - rates.read
    rewrite = max(size - kept, 0)
    g = max(growth, 0.0)

    def rate(n: int) -> float:
        reads = rates.read * (n * size + g * n * (n - 1) / 2)
        return (extra * rewrite + reads + extra * g * (n - 1)) / n

    top = max(max_calls, 1)
    # rate(n) = (extra * (rewrite - g)) / n + read * g * n / 2 + constants: convex in n,
    # lowest at sqrt(2 * extra * (rewrite - g) / (read * g)); the integers around it decide
    if rates.read * g > 0:
        best = math.sqrt(max(2 * extra * (rewrite - g), 0.0) / (rates.read * g))
    else:
        best = float(top)
    candidates = {1, top} | {min(max(int(best) + d, 1), top) for d in (0, 1)}
    calls = min(sorted(candidates), key=rate)
    return rate(calls), calls


@dataclass(frozen=True)
class Priced:
    """A plan with its cycle: ``rate`` billed tokens per call over ``calls`` calls, with
    ``kept`` cached tokens (the plan's, at most what is cached now)."""

    plan: Plan
    rate: float
    calls: int
    kept: int


def price_plans(
    plans: list[Plan],
    *,
    cached: int,
    growth: float,
    usable: int,
    horizon: int,
    rates: CacheRates,
) -> list[Priced]:
    """Each plan's cheapest cycle: at most ``horizon`` calls, and no more than the usable
    window leaves room for at ``growth`` tokens per call."""
    out = []
    for plan in plans:
        kept = min(plan.kept, cached)
        room = max(usable - plan.size, 0)
        calls = horizon if growth <= 0 else min(horizon, int(room / growth) + 1)
        rate, n = cycle_rate(plan.size, kept, growth, calls, rates)
        out.append(Priced(plan, rate, n, kept))
    return out


def cost_schedule(
    acc: AgentConfig, ctx: CompactionContext, opts: WindowManagerOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """The ``cost`` schedule's boundary: wait, or compact the cheapest way, then weigh the
    result again until it waits (see the module)."""
    new_acc, meta, first = _cost_round(acc, ctx, opts)
    rounds = 1
    while meta.get("compacted") and "error" not in meta and rounds < MAX_ROUNDS:
        again_acc, again, _ = _cost_round(new_acc, ctx, opts)
        if not again.get("compacted") or "error" in again:
            break
        # the weighing reported is the first round's: why it compacted
        meta = {**_merged(acc.memory.entries(), meta, again, again_acc), **first}
        new_acc = again_acc
        rounds += 1
    if meta.get("compacted"):
        meta["cost_rounds"] = rounds
    return new_acc, meta


def _merged(
    inputs: list[Entry], first: dict[str, Any], again: dict[str, Any], acc: AgentConfig
) -> dict[str, Any]:
    """The meta of two rounds as one compaction of ``inputs`` that left ``acc``: every input
    entry cleared or dropped by either, once, with its input content; the kept ones changed
    listed in ``shortened``; the rest (target, marker) of the second."""
    kept = {e.id for e in acc.memory.entries()}
    touched = {e.id for e in first.get("dropped", ())} | {e.id for e in again.get("dropped", ())}
    shortened = set(first.get("shortened") or ()) | set(again.get("shortened") or ())
    cleared = list(dict.fromkeys([*(first.get("cleared") or ()), *(again.get("cleared") or ())]))
    out = dict(again)
    out["dropped"] = [e for e in inputs if e.id in touched]
    out["shortened"] = [e.id for e in inputs if e.id in shortened and e.id in kept]
    if not out["shortened"]:
        del out["shortened"]
    if cleared:
        out["cleared"] = cleared
    return out


def _cost_round(
    acc: AgentConfig, ctx: CompactionContext, opts: WindowManagerOptions
) -> tuple[AgentConfig, dict[str, Any], dict[str, Any]]:
    """One weighing: wait, or compact the cheapest way; and the weighing's own meta keys
    (none when the boundary is under the floor)."""
    assert ctx.window is not None
    counter = ctx.counter
    memory = acc.memory
    before = counter.memory_tokens(memory)
    prompt = ctx.prompt_tokens
    usable = ctx.window - opts.reserved_tokens
    sent = before + prompt
    share = opts.target if "target" in opts.model_fields_set else COST_FLOOR
    floor = int(share * usable)
    over = sent > usable
    if sent <= floor or (ctx.mid_round and not over):
        return acc, {"compacted": False}, {}

    entries = memory.entries()
    sizes = [counter.entry_tokens(memory, e) for e in entries]
    rates = rates_for(acc.catalog, ctx.model)
    until = cached_until(entries)
    cached = 0 if until is None else prompt + sum(sizes[:until])
    growth = growth_per_call(entries, sizes)
    clearable = _clearable(acc, ctx, entries, sizes, floor - prompt)
    placeholder = counter.count_text(CLEARED_TEXT)
    plans = _plans(entries, sizes, prompt, sent, usable, floor, clearable, placeholder, ctx)
    priced = price_plans(
        plans, cached=cached, growth=growth, usable=usable, horizon=opts.horizon, rates=rates
    )
    risk = round_risk(memory, ctx, opts, usable, growth)
    lost = (lambda size: 0.0) if risk is None else risk.price
    chosen = min(priced, key=lambda x: x.rate + lost(x.plan.size))
    best = chosen.plan
    wait = billed(cached, sent, rates)
    report = _report(wait, chosen, priced, floor, growth, rates)
    if risk is not None:
        report.update(_reasoning_report(risk, sent, best.size))
    if not over and wait + lost(sent) <= chosen.rate + lost(best.size):
        report["cost_decision"] = "waits"
        return acc, {"compacted": False, **report}, report

    report["cost_decision"] = "forced" if over else "pays"
    cleared_ids = [tool_id for _, tool_id in clearable[: best.clears]]
    note = reasoning_record(memory, ctx, opts)
    new_acc, meta = _apply(acc, ctx, opts, entries, cleared_ids, best, usable, note)
    if not meta.get("compacted"):
        return new_acc, {**meta, **report}, report
    meta.update(report)
    return new_acc, meta, report


def _report(
    wait: float,
    chosen: Priced,
    priced: list[Priced],
    floor: int,
    growth: float,
    rates: CacheRates,
) -> dict[str, Any]:
    """The weighing's cache figures (see the module): waiting's next call ``wait``
    against the ``chosen`` plan's cycle."""
    rate, calls = chosen.rate, chosen.calls
    return {
        "schedule": "cost",
        "billed_next_without": round(wait),
        "billed_next_with": round(billed(chosen.kept, chosen.plan.size, rates)),
        "cost_rate_without": round(wait),
        "cost_rate_with": round(rate),
        "cost_horizon_without": round(wait * calls),
        "cost_horizon_with": round(rate * calls),
        "cost_cycle_calls": calls,
        "cost_plan": chosen.plan.name,
        "cost_plans": {p.plan.name: round(p.rate) for p in priced},
        "cost_floor": floor,
        "growth_per_call": round(growth),
    }


def _reasoning_report(risk: RoundRisk, sent: int, size: int) -> dict[str, Any]:
    """The meta keys of the reasoning weighed: the round's estimate, the calls it would
    make with thinking disabled and their price, waiting and with the plan chosen."""
    return {
        "round_estimate": risk.estimate,
        "reasoning_per_call": round(risk.per_call),
        "disabled_calls_without": risk.disabled_calls(sent),
        "disabled_calls_with": risk.disabled_calls(size),
        "cost_reasoning_without": round(risk.price(sent)),
        "cost_reasoning_with": round(risk.price(size)),
    }


def _clearable(
    acc: AgentConfig,
    ctx: CompactionContext,
    entries: list[Entry],
    sizes: list[int],
    floor_history: int,
) -> list[tuple[int, str]]:
    """The tool results that may be cleared, oldest first, as ``(entry index, tool id)``:
    older than the newest ``floor_history`` tokens, outside the newest unit, in no entry a
    survival rule keeps, not cleared already."""
    units = group_units(entries)
    if not units:
        return []
    protected = ctx.rules.protected(entries)
    # the newest entries that fit floor_history are the floor: never touched
    start = units[-1][0]
    room = floor_history
    for i in range(len(entries) - 1, -1, -1):
        room -= sizes[i]
        if room < 0:
            start = min(start, i + 1)
            break
    else:
        start = 0
    out: list[tuple[int, str]] = []
    for i in range(start):
        e = entries[i]
        if e.role == "system" or e.id in protected or isinstance(e.content, str):
            continue
        done = set(_cleared_ids(e))
        for b in e.content:
            if (
                isinstance(b, ToolResultBlock)
                and b.tool_use_id not in done
                and not b.text().startswith(keys.CLEARED_TAG)
            ):
                out.append((i, b.tool_use_id))
    return out


_cleared_ids = keys.cleared_ids


def _plans(
    entries: list[Entry],
    sizes: list[int],
    prompt: int,
    sent: int,
    usable: int,
    floor: int,
    clearable: list[tuple[int, str]],
    placeholder: int,
    ctx: CompactionContext,
) -> list[Plan]:
    """The plans weighed: ``clear`` (oldest results first, down to the floor or until none
    is left; only when it fits the usable window) and ``drop`` (down to the floor)."""
    counter = ctx.counter
    # where dropping would first cut: the first unit that is not system or kept by a rule
    protected = ctx.rules.protected(entries)
    units = group_units(entries)
    first_drop = len(entries)
    for start, end in units[:-1]:
        if not any(e.role == "system" or e.id in protected for e in entries[start:end]):
            first_drop = start
            break
    out = [Plan("drop", floor, floor, prompt + sum(sizes[:first_drop]), 0, drops=True)]
    if not clearable:
        return out
    size = sent
    clears = 0
    for i, tool_id in clearable:
        if size <= floor:
            break
        e = entries[i]
        assert not isinstance(e.content, str)
        block = next(
            b for b in e.content if isinstance(b, ToolResultBlock) and b.tool_use_id == tool_id
        )
        size -= max(counter.count_text(block.text()) - placeholder, 0)
        clears += 1
    if size <= usable and size < sent:
        kept = prompt + sum(sizes[: clearable[0][0]])
        out.append(Plan("clear", floor, size, kept, clears, drops=False))
    return out


def _apply(
    acc: AgentConfig,
    ctx: CompactionContext,
    opts: WindowManagerOptions,
    entries: list[Entry],
    cleared_ids: list[str],
    plan: Plan,
    usable: int,
    note: dict[str, Any],
) -> tuple[AgentConfig, dict[str, Any]]:
    """Clear ``cleared_ids``, then drop down to the plan's level when it must (``note``:
    the metadata of the marker a drop leaves)."""
    counter = ctx.counter
    memory = acc.memory
    clear = set(cleared_ids)
    new_entries = [_cleared(e, clear).without_thinking() for e in entries]
    rewritten = [e for e, ne in zip(entries, new_entries, strict=True) if _changed(e, ne)]
    # old thinking stripped (not reported: the provider ignores it) is a change too
    changed = any(ne.content is not e.content for e, ne in zip(entries, new_entries, strict=True))
    cleared_acc = acc.with_memory(memory.derive(new_entries))
    after = counter.memory_tokens(cleared_acc.memory)
    if not plan.drops and after + ctx.prompt_tokens <= usable:
        if not changed:
            return acc, {"compacted": False}
        met = after + ctx.prompt_tokens <= plan.level
        return cleared_acc, _clear_meta(ctx, opts, rewritten, cleared_ids, target_met=met)
    plain = opts.model_copy(
        update={"target": min(plan.level / usable, 1.0), "schedule": "threshold"}
    )
    new_acc, meta = cut_to_target(cleared_acc, ctx, plain, counter, after, usable, note or None)
    if "error" in meta and note:
        # the record is bookkeeping: the marker it needs must not make the cut fail
        new_acc, meta = cut_to_target(cleared_acc, ctx, plain, counter, after, usable)
    if "error" in meta:
        return acc, meta
    if not meta.get("compacted"):
        if not changed:
            return acc, meta
        new_acc, meta = cleared_acc, {"compacted": True, "strategy": opts.strategy}
    # every entry cleared or dropped, once, with the content it had in the input
    ids = {e.id for e in rewritten} | {e.id for e in meta.get("dropped", ())}
    meta["dropped"] = [e for e in entries if e.id in ids]
    # kept changed: the results cleared here, and those the plain compaction shortened
    kept = {e.id for e in new_acc.memory.entries()}
    shortened = {e.id for e in rewritten if e.id in kept} | set(meta.get("shortened") or ())
    if shortened:
        meta["shortened"] = [e.id for e in entries if e.id in shortened]
    if cleared_ids:
        meta["cleared"] = cleared_ids
    meta["target"] = round(plain.target, 4)
    return new_acc, meta


def _clear_meta(
    ctx: CompactionContext,
    opts: WindowManagerOptions,
    rewritten: list[Entry],
    cleared_ids: list[str],
    *,
    target_met: bool,
) -> dict[str, Any]:
    """The meta of a compaction that only cleared results (``rewritten``: their entries)."""
    return {
        "compacted": True,
        "strategy": opts.strategy,
        "dropped": rewritten,
        "shortened": [e.id for e in rewritten],
        "cleared": cleared_ids,
        "counter": ctx.counter.name,
        "window": ctx.window,
        "target_met": target_met,
    }


def _changed(old: Entry, new: Entry) -> bool:
    return old.content is not new.content and old.without_thinking().content != new.content


def _cleared(entry: Entry, clear: set[str]) -> Entry:
    """``entry`` with the results of ``clear`` replaced by :data:`CLEARED_TEXT`."""
    if not clear or isinstance(entry.content, str):
        return entry
    hit: list[str] = []
    blocks = list(entry.content)
    for j, b in enumerate(blocks):
        if isinstance(b, ToolResultBlock) and b.tool_use_id in clear:
            blocks[j] = b.model_copy(update={"content": CLEARED_TEXT})
            hit.append(b.tool_use_id)
    if not hit:
        return entry
    metadata = {**entry.metadata, CLEARED_KEY: [*_cleared_ids(entry), *hit]}
    return entry.model_copy(update={"content": tuple(blocks), "metadata": metadata})

"""``schedule="cost"``: compact when it pays for the cache rewrite it causes.

The billing model is :mod:`normandy_core.cost`'s: the next call reads from the prompt cache
what the previous call sent (0.1x the input price) up to the first message a compaction
changed, and writes the rest (1.25x). At a boundary over ``target`` the schedule weighs,
over the next ``horizon`` calls with the conversation growing as it has so far:

* **waiting** (not allowed once the conversation is over the usable window: the window
  is never exceeded; nor before it at a mid-round boundary, as the contract says), and
* **compacting now to one of a few levels** between ``target`` (the deepest: never
  below, so what the threshold schedule keeps is a floor) and the usable window. Each
  level is reached by clearing old tool results first, oldest first (the messages and
  their structure stay, so the cache breaks only at the first result cleared and the
  skeleton before it stays cached), and only then dropping, by the configured strategy.
  Results in the newest ``target`` of the window, results a survival rule keeps and the
  newest unit's are never cleared.

The cheapest option wins (waiting on a tie). Its estimates are in the meta of every
boundary it weighs: ``billed_next_without`` and ``billed_next_with`` (next call),
``cost_horizon_without`` and ``cost_horizon_with`` (the horizon), ``growth_per_call``
and ``cost_decision`` (``"forced"``, ``"pays"`` or ``"waits"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normandy_core import Entry, ToolResultBlock, group_units
from normandy_core.cost import (
    CacheRates,
    billed,
    cached_until,
    growth_per_call,
    horizon_cost,
    rates_for,
)

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext
    from normandy_window_manager.options import WindowManagerOptions

__all__ = ["CLEARED_KEY", "CLEARED_TEXT", "cost_schedule"]

#: Entry metadata key listing the tool-use ids whose results were cleared (the same key
#: ``clear_tool_results`` uses, so either recognises the other's work).
CLEARED_KEY = "normandy.cleared_tool_uses"
#: What a cleared tool result says instead of its content.
CLEARED_TEXT = "[tool result cleared by normandy window_manager to save context; archived]"

#: How many levels between ``target`` and the usable window are weighed.
LEVELS = 4


@dataclass(frozen=True)
class _Option:
    level: int  # tokens (prompt included) the option compacts to
    size: int  # estimated tokens sent after it
    kept: int  # cached tokens it keeps (the prefix before its first change)
    clears: int  # how many of the clearable results it clears
    drops: bool  # whether clearing alone does not reach the level
    cost: float = 0.0


def cost_schedule(
    acc: AgentConfig, ctx: CompactionContext, o: WindowManagerOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """The ``cost`` schedule's boundary: wait, or compact the cheapest way (see the module)."""
    from normandy_window_manager.compactor import _compact

    assert ctx.window is not None
    counter = ctx.counter
    memory = acc.memory
    before = counter.memory_tokens(memory)
    prompt = ctx.prompt_tokens
    usable = ctx.window - o.reserved_tokens
    sent = before + prompt
    floor = int(o.target * usable)
    over = sent > usable
    if sent <= floor or (ctx.mid_round and not over):
        return acc, {"compacted": False}

    entries = memory.entries()
    sizes = [counter.entry_tokens(memory, e) for e in entries]
    rates = rates_for(acc.catalog, ctx.model)
    until = cached_until(entries)
    cached = 0 if until is None else prompt + sum(sizes[:until])
    growth = growth_per_call(entries, sizes)
    clearable = _clearable(acc, ctx, entries, sizes, floor - prompt)
    placeholder = counter.count_text(CLEARED_TEXT)
    options = _options(
        entries, sizes, prompt, sent, usable, floor, clearable, placeholder, ctx, cached
    )
    for i, opt in enumerate(options):
        options[i] = _priced(opt, cached, growth, usable, o.horizon, rates)
    best = min(options, key=lambda x: x.cost)
    wait = horizon_cost(
        sent=sent,
        cached=cached,
        after_size=best.size,
        rewrite=best.size - best.kept,
        growth=growth,
        limit=usable,
        calls=o.horizon,
        rates=rates,
    )
    report: dict[str, Any] = {
        "schedule": "cost",
        "billed_next_without": round(billed(cached, sent, rates)),
        "billed_next_with": round(billed(min(best.kept, cached), best.size, rates)),
        "cost_horizon_without": round(wait),
        "cost_horizon_with": round(best.cost),
        "growth_per_call": round(growth),
    }
    if not over and wait <= best.cost:
        return acc, {"compacted": False, "cost_decision": "waits", **report}

    decision = "forced" if over else "pays"
    cleared_ids = [tool_id for _, tool_id in clearable[: best.clears]]
    new_acc, meta = _apply(acc, ctx, o, counter, entries, cleared_ids, best, usable, _compact)
    if not meta.get("compacted"):
        return new_acc, {**meta, "cost_decision": decision, **report}
    meta.update(cost_decision=decision, **report)
    return new_acc, meta


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
                and b.content != CLEARED_TEXT
            ):
                out.append((i, b.tool_use_id))
    return out


def _cleared_ids(entry: Entry) -> list[str]:
    value = entry.metadata.get(CLEARED_KEY)
    return [str(v) for v in value] if isinstance(value, list) else []


def _options(
    entries: list[Entry],
    sizes: list[int],
    prompt: int,
    sent: int,
    usable: int,
    floor: int,
    clearable: list[tuple[int, str]],
    placeholder: int,
    ctx: CompactionContext,
    cached: int,
) -> list[_Option]:
    """One option per level: clear oldest results until under it, then drop if needed."""
    result_sizes: dict[str, int] = {}
    counter = ctx.counter
    for i, tool_id in clearable:
        e = entries[i]
        assert not isinstance(e.content, str)
        block = next(
            b for b in e.content if isinstance(b, ToolResultBlock) and b.tool_use_id == tool_id
        )
        result_sizes[tool_id] = max(counter.count_text(block.text()) - placeholder, 0)
    # where dropping would first cut: the first unit that is not system or kept by a rule
    protected = ctx.rules.protected(entries)
    units = group_units(entries)
    first_drop = len(entries)
    for start, end in units[:-1]:
        if not any(e.role == "system" or e.id in protected for e in entries[start:end]):
            first_drop = start
            break
    drop_kept = prompt + sum(sizes[:first_drop])
    top = min(usable, sent - 1)
    levels = sorted({floor + (top - floor) * k // LEVELS for k in range(LEVELS)} | {floor})
    out: list[_Option] = []
    for level in levels:
        size = sent
        clears = 0
        for _i, tool_id in clearable:
            if size <= level:
                break
            size -= result_sizes[tool_id]
            clears += 1
        if size <= level:
            first = clearable[0][0] if clears else len(entries)
            kept = prompt + sum(sizes[:first])
            out.append(_Option(level, size, min(kept, cached), clears, drops=False))
        else:
            first = min(first_drop, clearable[0][0]) if clearable else first_drop
            kept = min(prompt + sum(sizes[:first]), drop_kept)
            out.append(_Option(level, level, min(kept, cached), clears, drops=True))
    return out


def _priced(
    opt: _Option, cached: int, growth: float, usable: int, horizon: int, rates: CacheRates
) -> _Option:
    cost = horizon_cost(
        sent=opt.size,
        cached=min(opt.kept, cached),
        after_size=opt.size,
        rewrite=opt.size - opt.kept,
        growth=growth,
        limit=usable,
        calls=horizon,
        rates=rates,
    )
    return _Option(opt.level, opt.size, opt.kept, opt.clears, opt.drops, cost)


def _apply(
    acc: AgentConfig,
    ctx: CompactionContext,
    o: WindowManagerOptions,
    counter: Any,
    entries: list[Entry],
    cleared_ids: list[str],
    opt: _Option,
    usable: int,
    compact: Any,
) -> tuple[AgentConfig, dict[str, Any]]:
    """Clear ``cleared_ids``, then drop down to the option's level when it must."""
    memory = acc.memory
    clear = set(cleared_ids)
    new_entries = [_cleared(e, clear).without_thinking() for e in entries]
    rewritten = [e for e, ne in zip(entries, new_entries, strict=True) if _changed(e, ne)]
    cleared_acc = acc.with_memory(memory.derive(new_entries))
    after = counter.memory_tokens(cleared_acc.memory)
    if not opt.drops and after + ctx.prompt_tokens <= usable:
        if not rewritten:
            return acc, {"compacted": False}
        meta: dict[str, Any] = {
            "compacted": True,
            "strategy": o.strategy,
            "dropped": rewritten,
            "cleared": cleared_ids,
            "counter": counter.name,
            "window": ctx.window,
            "target_met": after + ctx.prompt_tokens <= int(o.target * usable),
        }
        return cleared_acc, meta
    level = max(opt.level / usable, o.target)
    plain = o.model_copy(update={"target": min(level, 1.0), "schedule": "threshold"})
    new_acc, meta = compact(cleared_acc, ctx, plain, counter, after, usable)
    if "error" in meta:
        return acc, meta
    if not meta.get("compacted"):
        if not rewritten:
            return acc, meta
        new_acc, meta = cleared_acc, {"compacted": True, "strategy": o.strategy}
    # every entry cleared or dropped, once, with the content it had in the input
    ids = {e.id for e in rewritten} | {e.id for e in meta.get("dropped", ())}
    meta["dropped"] = [e for e in entries if e.id in ids]
    if cleared_ids:
        meta["cleared"] = cleared_ids
    meta["target"] = round(plain.target, 4)
    return new_acc, meta


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

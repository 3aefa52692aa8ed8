"""The ``clear_tool_results`` compactor: hookimpls and the clearing plan.

Above its trigger it replaces the content of old tool results (and, with
``clear_tool_inputs``, the input of their tool uses) by a short placeholder. Nothing is
removed or moved: every entry keeps its id and position and every tool use keeps its
result, so the conversation's structure (tool pairing) is unchanged. The original
entries are reported in ``meta["dropped"]`` so ``after_compact`` hooks can archive them.

Survival rules (``ctx.rules``): an entry a rule keeps is never rewritten, so a tool use
whose call or result entries hold one is never cleared (in a parallel batch whose
results share one entry, its siblings there are not cleared either). The calls of
``keep_tools`` are not counted toward ``trigger_tool_uses``, as ``exclude_tools``.

Sized to the window it is given: with no trigger option (or ``trigger`` or
``context_window`` given) it clears over ``trigger`` of the usable window at the start
of a turn and over the usable window mid-round, and a result still over the usable
window is reported with ``target_met`` false and the reason in ``target_missed`` (over
the window with nothing it may clear: the error path, with that reason).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normandy_clear_tool_results import CLEARED_KEY, NAME
from normandy_clear_tool_results.offload import Offload, offload
from normandy_clear_tool_results.options import RECALL_PLACEHOLDER, ClearToolResultsOptions
from normandy_core import Entry, OptionsError, ToolResultBlock, ToolUseBlock, hookimpl
from normandy_core.conversation import keys

if TYPE_CHECKING:
    from normandy_core import AgentConfig, Block, CompactionContext, TokenCounter

__all__ = ["maybe_compact", "needs_window", "options_model", "validate_opts"]

log = logging.getLogger("normandy_clear_tool_results")


@hookimpl
def options_model() -> type[ClearToolResultsOptions]:
    """The options are :class:`~normandy_clear_tool_results.options.ClearToolResultsOptions`."""
    return ClearToolResultsOptions


@hookimpl
def needs_window(opts: ClearToolResultsOptions) -> bool:
    """Whether it sizes against the window: with no trigger option, or ``trigger`` or
    ``context_window`` given (only ``trigger_tokens``/``trigger_tool_uses``: no)."""
    return opts.window_trigger is not None


@hookimpl
def validate_opts(opts: ClearToolResultsOptions, window: int | None) -> None:
    """Refuse a window that ``reserved_tokens`` leaves no room in, where the config is made."""
    if window is not None and window <= opts.reserved_tokens:
        raise OptionsError(
            f"option 'reserved_tokens': {opts.reserved_tokens:,} tokens reserved for the "
            f"reply leave nothing of the {window:,}-token context window; lower "
            "reserved_tokens or pin a larger window (option 'context_window')"
        )


@dataclass(frozen=True)
class _Window:
    """The window a boundary sizes against: the usable tokens and the level that triggers."""

    usable: int
    level: int

    @classmethod
    def of(cls, ctx: CompactionContext, opts: ClearToolResultsOptions) -> _Window | None:
        share = opts.window_trigger
        if ctx.window is None or share is None:
            return None
        usable = ctx.window - opts.reserved_tokens
        # mid-round the memory stays unchanged while it fits (the contract)
        return cls(usable, usable if ctx.mid_round else int(share * usable))

    def outcome(self, total: int, cleared_any: bool) -> dict[str, Any]:
        """``target_met`` of a conversation of ``total`` tokens (prompt included), and the
        reason in ``target_missed`` when it is still over the usable window."""
        if total <= self.usable:
            return {"target_met": True}
        what = "clearing every tool result it may" if cleared_any else "nothing it may clear"
        return {
            "target_met": False,
            "target_missed": (
                f"{what} leaves {total:,} tokens (system prompt and tool definitions "
                f"included) against a usable window of {self.usable:,}: the newest "
                f"{'tool uses kept by keep' if cleared_any else 'entries'}, messages and "
                "kept entries are larger than the window; use window_manager (or a "
                "pipeline ending with it) to drop history"
            ),
        }


@dataclass
class _Use:
    """One tool use of the active branch: where it is and where its results are."""

    id: str
    name: str
    use_index: int
    result_indices: list[int]


_cleared_ids = keys.cleared_ids


def _scan(entries: list[Entry]) -> tuple[list[_Use], set[str]]:
    """Every tool use of ``entries`` in order, and the ids already cleared."""
    uses: list[_Use] = []
    by_id: dict[str, _Use] = {}
    cleared: set[str] = set()
    for i, e in enumerate(entries):
        cleared.update(_cleared_ids(e))
        if isinstance(e.content, str):
            continue
        for b in e.content:
            if isinstance(b, ToolUseBlock) and e.role == "assistant":
                u = _Use(b.id, b.name, i, [])
                uses.append(u)
                by_id[b.id] = u
            elif isinstance(b, ToolResultBlock):
                hit = by_id.get(b.tool_use_id)
                if hit is not None:
                    hit.result_indices.append(i)
                if b.text().startswith(keys.CLEARED_TAG):
                    # cleared before, its metadata lost in a wire format
                    cleared.add(b.tool_use_id)
    return uses, cleared


def _block_tokens(block: Block, counter: TokenCounter) -> int:
    return counter.count_entry(Entry(id="_", role="user", content=(block,)))


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: ClearToolResultsOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """Offload the tool results over ``offload_tokens`` that just arrived (when set), then
    clear old tool results when the conversation is over a trigger, or now on a forced
    boundary (``ctx.force``: every trigger and the cost schedule's wait passed over,
    ``keep``, ``exclude_tools``, ``clear_at_least`` and the survival rules still
    honoured); see the module docs."""
    entries = acc.memory.entries()
    settings = acc.recall_settings
    arrived = offload(acc.memory, ctx, opts, None if settings is None else settings.tool_name)
    skipped = {} if arrived.skipped is None else {"offload_skipped": arrived.skipped}
    if arrived.skipped is not None:
        log.warning("clear_tool_results: %s", arrived.skipped)
    if not arrived.ids:
        new_acc, meta = _clear(acc, ctx, opts)
        return new_acc, {**meta, **skipped}
    offloaded = acc.with_memory(acc.memory.derive(_thinking_kept(entries, arrived.entries)))
    new_acc, meta = _clear(offloaded, ctx, opts)
    return _with_offload(acc, ctx, offloaded, new_acc, meta, arrived)


def _thinking_kept(entries: list[Entry], offloaded: list[Entry]) -> list[Entry]:
    """``offloaded`` with its thinking when every result offloaded came after the last
    thinking block (replayed thinking is checked against what precedes it: the usual
    case, results offloaded as they arrive, keeps the open round's reasoning); else
    without any, as the contract asks of a mid-round change."""
    last = max((i for i, e in enumerate(entries) if e.has_thinking), default=-1)
    changed = (i for i, (e, new) in enumerate(zip(entries, offloaded, strict=True)) if e is not new)
    if all(i > last for i in changed):
        return offloaded
    return [e.without_thinking() for e in offloaded]


def _with_offload(
    acc: AgentConfig,
    ctx: CompactionContext,
    offloaded: AgentConfig,
    cleared: AgentConfig,
    meta: dict[str, Any],
    arrived: Offload,
) -> tuple[AgentConfig, dict[str, Any]]:
    """The result of a boundary that offloaded: the clearing's, when it cleared too, else
    the offload alone; ``dropped`` lists the caller's entries as they were (the originals
    of the offloaded results), oldest first."""
    entries = acc.memory.entries()
    original = {e.id: e for e in entries}
    changed = {e.id for e in arrived.entries if set(keys.offloaded_ids(e)) & set(arrived.ids)}
    if meta.get("compacted"):
        changed |= {e.id for e in meta["dropped"]}
        result = cleared
    else:
        result = offloaded
        meta = {
            "compacted": True,
            "strategy": NAME,
            "counter": ctx.counter.name,
            **({"target_met": False, "target_missed": meta["error"]} if "error" in meta else {}),
        }
    dropped = [original[e.id] for e in entries if e.id in changed]
    return result, {
        **meta,
        "dropped": dropped,
        "offloaded": list(arrived.ids),
        "tokens_offloaded": arrived.tokens,
    }


def _clear(
    acc: AgentConfig, ctx: CompactionContext, opts: ClearToolResultsOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """The clearing itself (see :func:`maybe_compact`)."""
    counter = ctx.counter
    memory = acc.memory
    before = counter.memory_tokens(memory)
    window = _Window.of(ctx, opts)
    over_tokens = (
        ctx.force
        or (opts.trigger_tokens is not None and before + acc.prompt_tokens > opts.trigger_tokens)
        or (window is not None and before + ctx.prompt_tokens > window.level)
    )
    if not over_tokens and opts.trigger_tool_uses is None:
        return acc, {"compacted": False}
    entries = memory.entries()
    uses, already = _scan(entries)
    excluded = set(opts.exclude_tools) | set(ctx.rules.keep_tools)
    intact = [u for u in uses if u.name not in excluded and u.id not in already]
    over_uses = opts.trigger_tool_uses is not None and len(intact) > opts.trigger_tool_uses
    if not (over_tokens or over_uses):
        return acc, {"compacted": False}

    text = _placeholder(acc, opts)
    to_clear = _worth_clearing(entries, uses, intact, ctx, opts, text)
    new_entries = [_cleared(e, to_clear, opts, text) for e in entries]
    changed = [(e, new) for e, new in zip(entries, new_entries, strict=True) if new is not e]
    cleared_tokens = sum(
        counter.entry_tokens(memory, old) - counter.count_entry(new) for old, new in changed
    )
    if cleared_tokens < max(opts.clear_at_least, 1):
        return acc, _nothing_cleared(window, before + ctx.prompt_tokens, ctx, opts, cleared_tokens)

    new_memory = memory.derive([e.without_thinking() for e in new_entries])
    after = counter.memory_tokens(new_memory)
    weighed: dict[str, Any] = {}
    if opts.schedule == "cost" and not ctx.force:
        weighed = _weigh(acc, ctx, opts, entries, new_entries, before, after)
        if weighed["cost_decision"] == "waits":
            return acc, {"compacted": False, **weighed}
    # tokens_before, tokens_after and tokens_removed are computed by the boundary.
    meta: dict[str, Any] = {
        "compacted": True,
        "strategy": NAME,
        "tokens_cleared": cleared_tokens,
        "cleared": [u.id for u in uses if u.id in to_clear],
        "trigger": "forced" if ctx.force else "tokens" if over_tokens else "tool_uses",
        "counter": counter.name,
        "dropped": [old for old, _new in changed],
        **weighed,
        **({} if window is None else window.outcome(after + ctx.prompt_tokens, True)),
    }
    log.debug(
        "clear_tool_results: %d tool uses cleared, %d -> %d tokens",
        len(to_clear),
        before,
        after,
    )
    return acc.with_memory(new_memory), meta


def _nothing_cleared(
    window: _Window | None,
    total: int,
    ctx: CompactionContext,
    opts: ClearToolResultsOptions,
    clearable: int,
) -> dict[str, Any]:
    """The skip path (on a forced boundary with why in ``declined``), or the error path
    when the conversation is over the usable window and nothing (or less than
    ``clear_at_least``, of the ``clearable`` tokens) can be cleared."""
    if window is not None and total > window.usable:
        return {"compacted": False, "error": window.outcome(total, False)["target_missed"]}
    if not ctx.force:
        return {"compacted": False}
    why = (
        f"nothing worth clearing: {clearable:,} tokens could be cleared, under "
        f"clear_at_least ({max(opts.clear_at_least, 1):,}); the newest {opts.keep} tool "
        "uses, the unanswered round, excluded tools and entries a survival rule keeps stay"
    )
    return {"compacted": False, "declined": why}


def _worth_clearing(
    entries: list[Entry],
    uses: list[_Use],
    intact: list[_Use],
    ctx: CompactionContext,
    opts: ClearToolResultsOptions,
    text: str,
) -> set[str]:
    """The ids of the ``intact`` tool uses to clear: not among the ``keep`` newest nor in
    the round the model has not answered yet, in no entry a survival rule keeps, and
    larger than the placeholder ``text`` (and the empty input, with
    ``clear_tool_inputs``)."""
    counter = ctx.counter
    protected = {u.id for u in uses[max(len(uses) - opts.keep, 0) :]} if opts.keep else set()
    # A result the model has not answered yet (the newest round) is never cleared.
    last_assistant = max((i for i, e in enumerate(entries) if e.role == "assistant"), default=-1)
    protected.update(u.id for u in uses if u.use_index == last_assistant)
    kept = ctx.rules.protected(entries)
    placeholder_cost = _block_tokens(ToolResultBlock(tool_use_id="_", content=text), counter)
    empty_input_cost = _block_tokens(ToolUseBlock(id="_", name="_", input={}), counter)
    results: dict[str, ToolResultBlock] = {}
    for e in entries:
        for r in e.tool_results:
            results.setdefault(r.tool_use_id, r)
    to_clear: set[str] = set()
    for u in intact:
        if u.id in protected or not u.result_indices:
            continue
        # A survival rule keeps these entries unchanged (pinned ones included).
        if entries[u.use_index].id in kept or any(entries[i].id in kept for i in u.result_indices):
            continue
        old = _block_tokens(results[u.id], counter)
        new = placeholder_cost
        if opts.clear_tool_inputs:
            use_block = next(b for b in entries[u.use_index].tool_uses if b.id == u.id)
            old += _block_tokens(use_block, counter)
            new += empty_input_cost
        if old > new:
            to_clear.add(u.id)
    return to_clear


def _placeholder(acc: AgentConfig, opts: ClearToolResultsOptions) -> str:
    """The text a cleared result becomes: the ``placeholder`` option when it was given;
    the default otherwise, naming the agent's ``recall`` tool when that is on."""
    settings = acc.recall_settings
    if settings is None or "placeholder" in opts.model_fields_set:
        return opts.placeholder
    return RECALL_PLACEHOLDER.format(tool=settings.tool_name)


def _weigh(
    acc: AgentConfig,
    ctx: CompactionContext,
    opts: ClearToolResultsOptions,
    old: list[Entry],
    new: list[Entry],
    before: int,
    after: int,
) -> dict[str, Any]:
    """``schedule="cost"``: whether clearing now is cheaper over ``opts.horizon`` calls than
    waiting (:mod:`normandy_core.conversation.cost`'s model). ``ctx.window`` is ``None`` for this
    compactor (it sizes against no window), so waiting means not clearing within the
    horizon; with a window it would mean clearing like this when it would be passed."""
    from normandy_core.conversation.cost import (
        billed,
        cached_until,
        first_change,
        growth_per_call,
        horizon_cost,
        rates_for,
    )

    counter = ctx.counter
    memory = acc.memory
    prompt = acc.prompt_tokens + counter.request_tokens
    sizes = [counter.entry_tokens(memory, e) for e in old]
    until = cached_until(old)
    cached = 0 if until is None else prompt + sum(sizes[:until])
    change = first_change(old, new)
    kept = 0 if until is None else min(prompt + sum(sizes[: min(change, until)]), cached)
    sent, size = before + prompt, after + prompt
    growth = growth_per_call(old, sizes)
    rates = rates_for(acc.catalog, ctx.model)
    limit = ctx.window
    cycle_cost = functools.partial(
        horizon_cost,
        after_size=size,
        rewrite=size - kept,
        growth=growth,
        limit=limit,
        calls=opts.horizon,
        rates=rates,
    )
    now = cycle_cost(sent=size, cached=kept)
    wait = cycle_cost(sent=sent, cached=cached)
    forced = limit is not None and sent > limit
    return {
        "schedule": "cost",
        "cost_decision": "forced" if forced else "pays" if now < wait else "waits",
        "billed_next_without": round(billed(cached, sent, rates)),
        "billed_next_with": round(billed(kept, size, rates)),
        "cost_horizon_without": round(wait),
        "cost_horizon_with": round(now),
        "growth_per_call": round(growth),
    }


def _cleared(entry: Entry, to_clear: set[str], opts: ClearToolResultsOptions, text: str) -> Entry:
    """``entry`` with the results (and maybe inputs) of ``to_clear`` replaced by ``text``;
    the same entry if none."""
    if isinstance(entry.content, str):
        return entry
    blocks: list[Block] = list(entry.content)
    hit: list[str] = []
    # A block already as clearing would leave it (an empty input, a result that is the
    # placeholder) is not touched: rewriting it to itself would report an unchanged entry.
    for j, b in enumerate(blocks):
        if isinstance(b, ToolResultBlock) and b.tool_use_id in to_clear and b.content != text:
            blocks[j] = b.model_copy(update={"content": text})
            hit.append(b.tool_use_id)
        elif (
            opts.clear_tool_inputs
            and entry.role == "assistant"
            and isinstance(b, ToolUseBlock)
            and b.id in to_clear
            and b.input
        ):
            blocks[j] = b.model_copy(update={"input": {}})
            hit.append(b.id)
    if not hit:
        return entry
    metadata = {**entry.metadata, CLEARED_KEY: [*_cleared_ids(entry), *hit]}
    return entry.model_copy(update={"content": tuple(blocks), "metadata": metadata})

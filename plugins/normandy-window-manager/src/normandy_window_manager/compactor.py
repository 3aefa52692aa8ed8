"""The ``window_manager`` compactor: hookimpls and the compaction plan.

A compaction cuts only between *units* (:func:`normandy_core.group_units`): an assistant
entry that calls tools travels with every entry carrying its results, so no tool result
is orphaned and no parallel batch is split. System entries, the newest unit and every
unit holding an entry a survival rule keeps (``ctx.rules``: pinned entries, the first
user message, ``keep_tools``, ``keep_if``) are always kept, and never shortened. Kept
entries keep their ids and lose their thinking blocks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from normandy_core import (
    Entry,
    ImageBlock,
    OptionsError,
    TextBlock,
    TokenCounter,
    ToolResultBlock,
    group_units,
    hookimpl,
    new_id,
)
from normandy_core.conversation import keys
from normandy_core.conversation.calibration import CalibratedCounter
from normandy_core.conversation.tokens import DOCUMENT_TOKENS, IMAGE_TOKENS
from normandy_window_manager.options import WindowManagerOptions
from normandy_window_manager.schedule import COST_FLOOR, cost_schedule
from normandy_window_manager.summarize import (
    MIN_SUMMARY_TOKENS,
    SUMMARY_KEY,
    SummaryError,
    SummaryTooSmall,
    make_summary,
)

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext, SurvivalRules

__all__ = [
    "MARKER_KEY",
    "NAME",
    "SUMMARY_KEY",
    "compaction_threshold",
    "maybe_compact",
    "needs_window",
    "options_model",
    "validate_opts",
]

log = logging.getLogger("normandy_window_manager")

#: The name this compactor is registered under.
NAME = "window_manager"
#: Metadata key marking the note inserted where history was cut.
MARKER_KEY = keys.MARKER_KEY
#: The text of that note (with the agent's ``recall`` tool on, followed by
#: :attr:`normandy_core.RecallSettings.note`, and inserted wherever entries were dropped,
#: so the model knows it can get them back). Its tag
#: (``normandy_core.transcripts.formats.INSERTED_TAGS``) lets a transcript reader recognise it in
#: any format. It gives no count: the caller's formats count messages differently (OpenAI
#: sends one message per tool result), so any number would be wrong in some format.
MARKER_TEXT = "[normandy:marker] Earlier messages were removed here to fit the context window."


@hookimpl
def options_model() -> type[WindowManagerOptions]:
    """The options are :class:`~normandy_window_manager.options.WindowManagerOptions`."""
    return WindowManagerOptions


@hookimpl
def needs_window(opts: WindowManagerOptions) -> bool:
    """``window_manager`` always sizes against the window (pinned or from the catalog)."""
    return True


@hookimpl
def validate_opts(
    opts: WindowManagerOptions, entry: str, window: int | None, rules: SurvivalRules
) -> None:
    """Refuse a window that ``reserved_tokens`` leaves no room in, and summary instructions
    the options never use (no ``summarize``, or the ``extractive`` summarizer), where the
    config is made."""
    if window is not None and window <= opts.reserved_tokens:
        raise OptionsError(
            f"option 'reserved_tokens': {opts.reserved_tokens:,} tokens reserved for the "
            f"reply leave nothing of the {window:,}-token context window; lower "
            "reserved_tokens or pin a larger window (option 'context_window')"
        )
    if rules.summary_instructions is None:
        return
    if opts.strategy != "summarize" or opts.summarizer == "extractive":
        why = (
            f"strategy {opts.strategy!r} writes no summary"
            if opts.strategy != "summarize"
            else "the 'extractive' summarizer writes its digest without a model"
        )
        raise OptionsError(
            f"{entry}: compactor {NAME!r} cannot honour survival rule 'summary_instructions': "
            f"only the model summarizer reads them, and {why}; use strategy 'summarize' "
            "with summarizer 'model' or 'auto', or drop summary_instructions"
        )


@hookimpl
def compaction_threshold(
    opts: WindowManagerOptions, window: int | None, mid_round: bool
) -> int | None:
    """The level :func:`maybe_compact` skips at or below (``None`` without a window).

    Mid-round the usable window (``window - reserved_tokens``) under either schedule; at
    the start of a turn ``trigger`` of it (``schedule="threshold"``) or the cost
    schedule's floor (``target``, else 25 % of it), below which that schedule waits
    without weighing anything. Both are what :func:`maybe_compact` and
    :func:`~normandy_window_manager.schedule.cost_schedule` compare with, rounded down
    (a whole number of tokens is at most a level exactly when it is at most its floor).
    """
    if window is None:
        return None
    usable = window - opts.reserved_tokens
    if mid_round:
        return usable
    if opts.schedule == "cost":
        share = opts.target if "target" in opts.model_fields_set else COST_FLOOR
        return int(share * usable)
    return math.floor(opts.trigger * usable)


@dataclass
class _Plan:
    """What a compaction keeps, drops and rewrites, over the active branch."""

    entries: list[Entry]
    keep: list[bool]
    replaced: dict[int, Entry] = field(default_factory=dict)  # index -> shortened entry
    insert_at: int | None = None  # where a summary or marker goes (index into entries)
    inserted: Entry | None = None


def _units_info(
    entries: Sequence[Entry], protected: dict[str, str]
) -> tuple[list[tuple[int, int]], list[bool]]:
    """The units of ``entries`` and which are locked: a system entry, an entry a survival
    rule keeps (``protected``), or the newest unit."""
    units = group_units(entries)
    locked = []
    for start, end in units:
        locked.append(any(e.role == "system" or e.id in protected for e in entries[start:end]))
    if units:
        locked[-1] = True  # the newest unit is the live state of the conversation
    return units, locked


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: WindowManagerOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """Compact ``acc.memory`` when it exceeds ``trigger`` of the usable window (at the
    start of a turn) or the usable window itself (mid-round); see the docs."""
    o = opts
    if ctx.window is None:
        return acc, {"compacted": False, "error": "window_manager needs ctx.window, got None"}
    if o.schedule == "cost":
        return cost_schedule(acc, ctx, o)
    # The prepared counter, scaled by the model's calibration factor, which the turn
    # shells learn from provider-reported usage (1.0 without evidence).
    counter = ctx.counter
    memory = acc.memory
    usable = ctx.window - o.reserved_tokens
    # Mid-round the memory stays unchanged while the conversation fits the usable window
    # (the contract); ``trigger`` decides at the start of a turn.
    threshold = usable if ctx.mid_round else o.trigger * usable
    # An upper bound first (UTF-8 bytes, while the tokenizer is not loaded): a
    # conversation whose bound fits has an exact count that fits too, so it is skipped
    # without loading a vocabulary; otherwise the exact count decides.
    bound = counter.memory_bound(memory)
    if bound is not None and bound + ctx.prompt_tokens <= threshold:
        return acc, {"compacted": False}
    before = counter.memory_tokens(memory)
    if before + ctx.prompt_tokens <= threshold:
        return acc, {"compacted": False}
    return _compact(acc, ctx, o, counter, before, usable)


def _compact(
    acc: AgentConfig,
    ctx: CompactionContext,
    o: WindowManagerOptions,
    counter: CalibratedCounter,
    before: int,
    usable: int,
) -> tuple[AgentConfig, dict[str, Any]]:
    memory = acc.memory
    entries = memory.entries()
    # Every kept entry loses its thinking in the commit, so it is sized without it (sized
    # with it, a history whose thinking alone overflows was called irreducible).
    sizes = [counter.entry_tokens(memory, e.without_thinking()) for e in entries]
    goal = int(o.target * usable) - ctx.prompt_tokens
    limit = usable - ctx.prompt_tokens
    protected = ctx.rules.protected(entries)
    units, locked = _units_info(entries, protected)
    keep = [True] * len(entries)
    total = sum(sizes)  # per-entry rounding up makes this >= before when calibrated
    dropped_any = False

    def drop_unit(u: int) -> None:
        nonlocal total, dropped_any
        start, end = units[u]
        if start < cut[0]:
            cut[:] = [start, 0]
        for i in range(start, end):
            if keep[i]:
                keep[i] = False
                total -= sizes[i]
                dropped_any = True

    recall = _recall_note(acc)
    text = MARKER_TEXT if recall is None else f"{MARKER_TEXT} {recall}"
    marker = Entry(id=new_id(), role="user", content=text, metadata={MARKER_KEY: True})
    marker_cost = counter.count_entry(marker)
    cut = [len(entries), 0]  # the first dropped index; the first kept entry scanned after it

    def cut_cost() -> int:
        """Tokens of what the cut inserts: the summary's reserve, or the marker when the
        first kept entry after the first cut is an assistant message, or whenever something
        was dropped with the recall tool on (``keep`` only turns false while this is used,
        and units are dropped oldest first, so the scan only moves forward)."""
        if not dropped_any:
            return 0
        if o.strategy == "summarize":
            return o.summary_max_tokens
        if recall is not None:
            return marker_cost
        at = max(cut[1], cut[0] + 1)
        while at < len(entries) and (not keep[at] or entries[at].role == "system"):
            at += 1
        cut[1] = at
        return marker_cost if at < len(entries) and entries[at].role == "assistant" else 0

    if o.strategy == "sliding_window":
        recent = _recent_turns(entries, o.turns_to_keep)
        for u, (start, _end) in enumerate(units):
            if not locked[u] and entries[start].turn_id not in recent:
                drop_unit(u)

    for u in range(len(units)):
        if total + cut_cost() <= goal:
            break
        if not locked[u]:
            drop_unit(u)

    plan = _Plan(entries=list(entries), keep=keep)
    # A kept history never starts with a tool result: drop leading orphaned results too.
    for u, (start, end) in enumerate(units):
        if not any(keep[start:end]) or entries[start].role == "system":
            continue
        if (
            not locked[u]
            and entries[start].role in ("user", "tool")
            and entries[start].tool_results
        ):
            drop_unit(u)
            continue
        break

    dropped_idx = [i for i, k in enumerate(keep) if not k]
    if dropped_idx and all(_made_here(entries[i]) for i in dropped_idx):
        # Dropping only an earlier marker or summary would put a new one in its place:
        # churn, not compaction. Keep them; shortening below may still be needed.
        for i in dropped_idx:
            keep[i] = True
            total += sizes[i]
        dropped_idx = []
    if o.strategy == "summarize" and dropped_idx:
        # The summary is sized to the room the kept units leave (under the target when it
        # can be, else under the window), at most summary_max_tokens.
        overhead = counter.count_entry(Entry(id="summary-overhead", role="user", content=""))
        room = goal - total - overhead
        if room < MIN_SUMMARY_TOKENS:
            room = limit - total - overhead
        if room < MIN_SUMMARY_TOKENS:
            reason = (
                f"no room for a summary: {max(limit - total, 0):,} tokens of the usable window "
                f"are left after the kept messages and a summary needs at least "
                f"{MIN_SUMMARY_TOKENS + overhead:,}; dropped as oldest_first instead"
            )
            return _fallback(acc, ctx, o, counter, before, usable, reason)
        # with the recall tool on, the summary ends with the note saying it exists
        note = "" if recall is None else "\n" + recall
        room -= counter.count_text(note) if note else 0
        try:
            summary = make_summary(
                acc,
                [entries[i] for i in dropped_idx],
                o,
                counter,
                budget=min(o.summary_max_tokens, room),
                instructions=ctx.rules.summary_instructions,
            )
        except SummaryTooSmall as exc:
            reason = f"no room for a summary: {exc}; dropped as oldest_first instead"
            return _fallback(acc, ctx, o, counter, before, usable, reason)
        except SummaryError as exc:
            return acc, {"compacted": False, "error": f"window_manager summarize: {exc}"}
        plan.insert_at = dropped_idx[0]
        plan.inserted = Entry(
            id=new_id(),
            turn_id=f"summary-{new_id()[:12]}",
            role="user",
            content=summary + note,
            metadata={SUMMARY_KEY: True, "summarized_ids": [entries[i].id for i in dropped_idx]},
        )
        total += counter.count_entry(plan.inserted)
    elif dropped_idx:
        # Where history was cut, a kept assistant message would follow a message it never
        # answered (or open the history, which providers refuse): the marker goes there.
        first_kept = next(
            (
                i
                for i in range(dropped_idx[0] + 1, len(entries))
                if keep[i] and entries[i].role != "system"
            ),
            None,
        )
        if first_kept is not None and (
            recall is not None or entries[first_kept].role == "assistant"
        ):
            plan.insert_at = dropped_idx[0]
            plan.inserted = marker.model_copy(update={"turn_id": entries[first_kept].turn_id})
            total += marker_cost

    # Still over the window: shorten the largest kept tool results (never kept by a rule).
    if total > limit:
        total = _shorten(plan, sizes, counter, total, goal, protected)
    if total > limit:
        return acc, {
            "compacted": False,
            "error": _irreducible_message(
                plan, sizes, ctx, o, usable, total, counter, units, protected
            ),
            "irreducible_tokens": total + ctx.prompt_tokens,
        }

    nothing_to_do = all(plan.keep) and not plan.replaced and plan.inserted is None
    if nothing_to_do and not any(e.has_thinking for e in entries):
        return acc, {"compacted": False}

    return _commit(acc, ctx, o, counter, plan, before, goal)


def _fallback(
    acc: AgentConfig,
    ctx: CompactionContext,
    o: WindowManagerOptions,
    counter: CalibratedCounter,
    before: int,
    usable: int,
    reason: str,
) -> tuple[AgentConfig, dict[str, Any]]:
    """``summarize`` without room for a summary: the plan of ``oldest_first``, said in meta."""
    plain = o.model_copy(update={"strategy": "oldest_first"})
    new_acc, meta = _compact(acc, ctx, plain, counter, before, usable)
    if meta.get("compacted") or "error" in meta:
        meta["strategy"] = o.strategy
        meta["summary_fallback"] = reason
    return new_acc, meta


def _recall_note(acc: AgentConfig) -> str | None:
    """What a marker or summary adds when the agent's ``recall`` tool is on, else ``None``."""
    settings = acc.recall_settings
    return None if settings is None else settings.note


def _made_here(entry: Entry) -> bool:
    """Whether ``entry`` is a marker or summary this compactor inserted earlier."""
    return bool(entry.metadata.get(MARKER_KEY) or entry.metadata.get(SUMMARY_KEY))


def _recent_turns(entries: Sequence[Entry], n: int) -> set[str | None]:
    order: list[str | None] = []
    seen: set[str | None] = set()
    for e in reversed(entries):
        if e.turn_id not in seen:
            seen.add(e.turn_id)
            order.append(e.turn_id)
            if len(order) == n:
                break
    return set(order)


def _shorten(
    plan: _Plan,
    sizes: list[int],
    counter: TokenCounter,
    total: int,
    goal: int,
    protected: dict[str, str],
) -> int:
    """Cut the largest kept tool-result texts that no survival rule keeps (head and tail
    kept) toward ``goal``."""
    candidates = [
        i
        for i, e in enumerate(plan.entries)
        if plan.keep[i] and e.id not in protected and e.role != "system" and e.tool_results
    ]
    current = {i: sizes[i] for i in candidates}
    for _ in range(4):  # a few passes: the markers and tokenization make one pass inexact
        progress = False
        for i in sorted(candidates, key=current.__getitem__, reverse=True):
            if total <= goal:
                return total
            entry = plan.replaced.get(i, plan.entries[i])
            excess = total - goal
            budget = current[i] - excess - current[i] // 20 - 32
            new_entry = _shortened(entry, max(budget, 0), counter)
            if new_entry is None:
                continue
            new_size = counter.count_entry(new_entry)
            if new_size >= current[i]:
                continue
            plan.replaced[i] = new_entry
            total -= current[i] - new_size
            current[i] = new_size
            progress = True
        if not progress or total <= goal:
            break
    return total


_MIN_KEEP_CHARS = 200


def _shortened(entry: Entry, budget_tokens: int, counter: TokenCounter) -> Entry | None:
    """``entry`` with its tool results cut to about ``budget_tokens`` in all.

    Texts keep their head and tail around a marker saying how much was cut; when the
    images and documents of the results alone exceed the budget they are replaced by a
    marker too. ``None`` when nothing could be cut.
    """
    assert not isinstance(entry.content, str)
    results = [(j, b) for j, b in enumerate(entry.content) if isinstance(b, ToolResultBlock)]
    full = sum(counter.count_text(b.text()) for _, b in results) or 1
    media = sum(
        IMAGE_TOKENS if isinstance(p, ImageBlock) else DOCUMENT_TOKENS
        for _, b in results
        if not isinstance(b.content, str)
        for p in b.content
        if not isinstance(p, TextBlock)
    )
    drop_media = media > 0 and media >= budget_tokens
    ratio = max(budget_tokens - (0 if drop_media else media), 0) / full
    blocks = list(entry.content)
    changed = False
    for j, b in results:
        text = b.text()
        keep_chars = max(int(len(text) * ratio), _MIN_KEEP_CHARS)
        new_text = text
        if keep_chars < len(text):
            head = keep_chars * 3 // 5
            tail = keep_chars - head
            cut = len(text) - head - tail
            cut_tokens = counter.count_text(text[head : len(text) - tail])
            marker = (
                f"\n[... {cut:,} characters (about {cut_tokens:,} tokens) cut by normandy "
                "window_manager to fit the context window ...]\n"
            )
            new_text = text[:head] + marker + text[len(text) - tail :]
        others: list[Any] = []
        if not isinstance(b.content, str):
            for p in b.content:
                if isinstance(p, TextBlock):
                    continue
                if drop_media:
                    kind = "image" if isinstance(p, ImageBlock) else "document"
                    new_text += f"\n[{kind} removed by normandy window_manager to fit the window]"
                else:
                    others.append(p)
        had_media = not isinstance(b.content, str) and any(
            not isinstance(p, TextBlock) for p in b.content
        )
        if new_text == text and not (drop_media and had_media):
            continue
        content: Any = new_text if not others else (TextBlock(text=new_text), *others)
        blocks[j] = b.model_copy(update={"content": content})
        changed = True
    if not changed:
        return None
    return entry.model_copy(update={"content": tuple(blocks)})


def _irreducible_message(
    plan: _Plan,
    sizes: list[int],
    ctx: CompactionContext,
    o: WindowManagerOptions,
    usable: int,
    total: int,
    counter: CalibratedCounter,
    units: Sequence[tuple[int, int]],
    protected: dict[str, str],
) -> str:
    """The error of a plan that cannot fit: what is irreducible and what holds it.

    Each kept unit counts toward one holder: system entries, else the first survival
    rule (``RULES`` order) keeping one of its entries (the whole unit: a tool use keeps
    its results), else the newest unit and the other kept entries.
    """
    from normandy_core.conversation.survival import RULES

    system = newest = 0
    held = dict.fromkeys(ctx.rules.active(), 0)
    for start, end in units:
        rules = [protected[e.id] for e in plan.entries[start:end] if e.id in protected]
        holder = min(rules, key=RULES.index) if rules else None
        for i in range(start, end):
            if not plan.keep[i]:
                continue
            # a shortened result counts what is left of it
            size = sizes[i] if i not in plan.replaced else counter.count_entry(plan.replaced[i])
            if plan.entries[i].role == "system":
                system += size
            elif holder is not None:
                held[holder] = held.get(holder, 0) + size
            else:
                newest += size
    rules_text = "".join(
        f"{ctx.rules.describe(rule)} {tokens:,}; " for rule, tokens in held.items()
    )
    inserted = ""
    if plan.inserted is not None:
        what = "summary" if plan.inserted.metadata.get(SUMMARY_KEY) else "marker"
        inserted = f"; the {what} {counter.count_entry(plan.inserted):,}"
    return (
        f"cannot fit the context window: {total + ctx.prompt_tokens:,} tokens are irreducible "
        f"(system prompt and tool definitions {ctx.prompt_tokens:,}; system entries {system:,}; "
        f"{rules_text}newest unit and other kept entries {newest:,}, after "
        f"shortening tool results{inserted}) against a usable window of {usable:,} "
        f"(window {ctx.window:,} minus reserved_tokens {o.reserved_tokens:,})"
    )


def _commit(
    acc: AgentConfig,
    ctx: CompactionContext,
    o: WindowManagerOptions,
    counter: CalibratedCounter,
    plan: _Plan,
    before: int,
    goal: int,
) -> tuple[AgentConfig, dict[str, Any]]:
    memory = acc.memory
    kept: list[Entry] = []
    dropped: list[Entry] = []
    for i, e in enumerate(plan.entries):
        if plan.insert_at == i and plan.inserted is not None:
            kept.append(plan.inserted)
        if not plan.keep[i]:
            dropped.append(e)
            continue
        if i in plan.replaced:
            dropped.append(e)  # reported with its original content; kept shortened
            kept.append(plan.replaced[i].without_thinking())
        else:
            kept.append(e.without_thinking())
    new_memory = memory.derive(kept)
    after = counter.memory_tokens(new_memory)
    # tokens_before, tokens_after and tokens_removed are computed by the boundary.
    meta: dict[str, Any] = {
        "compacted": True,
        "strategy": o.strategy,
        "dropped": dropped,
        "counter": counter.name,
        "calibration": counter.calibration.snapshot(counter.model, counter.base.name),
        "window": ctx.window,
        "target_met": after <= goal,
    }
    if plan.replaced:
        meta["shortened"] = [plan.entries[i].id for i in sorted(plan.replaced)]
    if plan.inserted is not None:
        meta["summary_id" if o.strategy == "summarize" else "marker_id"] = plan.inserted.id
    log.debug(
        "window_manager %s: %d -> %d tokens, %d entries dropped",
        o.strategy,
        before,
        after,
        len(dropped),
    )
    return acc.with_memory(new_memory), meta

"""The cut both schedules make: drop whole units down to ``target``, then fit the window.

A cut drops only whole *units* (:func:`normandy_core.group_units`): an assistant entry that
calls tools travels with every entry carrying its results, so no tool result is orphaned
and no parallel batch is split. System entries, the newest unit and every unit holding an
entry a survival rule keeps (``ctx.rules``) are locked: always kept, never shortened.
Where history was cut, a summary (strategy ``summarize``) or a marker takes its place;
while the kept entries are still over the usable window, the largest tool results are
shortened. Kept entries keep their ids and lose their thinking blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from normandy_core import (
    Entry,
    ImageBlock,
    TextBlock,
    TokenCounter,
    ToolResultBlock,
    group_units,
    new_id,
)
from normandy_core.conversation import keys
from normandy_core.conversation.tokens import DOCUMENT_TOKENS, IMAGE_TOKENS
from normandy_window_manager.summarize import (
    MIN_SUMMARY_TOKENS,
    SUMMARY_KEY,
    SummaryError,
    SummaryTooSmall,
    make_summary,
)

if TYPE_CHECKING:
    from normandy_core import AgentConfig, AgentMemory, CompactionContext, SurvivalRules
    from normandy_core.conversation.calibration import CalibratedCounter
    from normandy_window_manager.options import WindowManagerOptions

__all__ = ["MARKER_KEY", "MARKER_TEXT", "cut_to_target"]

log = logging.getLogger("normandy_window_manager")

#: Metadata key marking the note inserted where history was cut.
MARKER_KEY = keys.MARKER_KEY
#: The text of that note (with the agent's ``recall`` tool on, followed by
#: :attr:`normandy_core.RecallSettings.note`, and inserted wherever entries were dropped,
#: so the model knows it can get them back). Its tag
#: (``normandy_core.transcripts.formats.INSERTED_TAGS``) lets a transcript reader recognise it in
#: any format. It gives no count: the caller's formats count messages differently (OpenAI
#: sends one message per tool result), so any number would be wrong in some format.
MARKER_TEXT = "[normandy:marker] Earlier messages were removed here to fit the context window."


@dataclass(frozen=True)
class _Branch:
    """The active branch as a cut sees it: its entries, their sizes without thinking, the
    ids a survival rule keeps (with the rule), its units and which units are locked."""

    entries: list[Entry]
    sizes: list[int]
    protected: dict[str, str]
    units: list[tuple[int, int]]
    locked: list[bool]

    @classmethod
    def of(cls, memory: AgentMemory, rules: SurvivalRules, counter: CalibratedCounter) -> _Branch:
        """``memory``'s active branch under ``rules``, sized with ``counter``."""
        entries = memory.entries()
        # Every kept entry loses its thinking in the commit, so it is sized without it
        # (sized with it, a history whose thinking alone overflows was called irreducible).
        sizes = [counter.entry_tokens(memory, e.without_thinking()) for e in entries]
        protected = rules.protected(entries)
        units = group_units(entries)
        locked = [
            any(e.role == "system" or e.id in protected for e in entries[start:end])
            for start, end in units
        ]
        if units:
            locked[-1] = True  # the newest unit is the live state of the conversation
        return cls(entries, sizes, protected, units, locked)


@dataclass
class _Plan:
    """What a compaction keeps, drops and rewrites, over the active branch."""

    entries: list[Entry]
    keep: list[bool]
    replaced: dict[int, Entry] = field(default_factory=dict)  # index -> shortened entry
    insert_at: int | None = None  # where a summary or marker goes (index into entries)
    inserted: Entry | None = None


class _UnitCut:
    """The units dropped so far, oldest first: which entries are kept, the tokens they
    leave, and where the cut begins (to price what the cut will insert)."""

    def __init__(
        self, branch: _Branch, summary_reserve: int | None, marker_cost: int, every_cut: bool
    ) -> None:
        self.branch = branch
        self.keep = [True] * len(branch.entries)
        self.total = sum(branch.sizes)  # per-entry rounding up makes this >= the memory's count
        self.summary_reserve = summary_reserve  # tokens kept for a summary, when summarizing
        self.marker_cost = marker_cost
        # with the recall tool on (or a round record to carry), every cut gets a marker
        self.every_cut = every_cut
        self.dropped_any = False
        self.first_dropped = len(branch.entries)
        # where the scan for the first kept entry after the cut resumes: ``keep`` only turns
        # false while it is used and units are dropped oldest first, so it only moves forward
        self.scan_from = 0

    def drop_unit(self, unit: int) -> None:
        """Drop every entry of ``unit`` still kept."""
        start, end = self.branch.units[unit]
        if start < self.first_dropped:
            self.first_dropped, self.scan_from = start, 0
        for i in range(start, end):
            if self.keep[i]:
                self.keep[i] = False
                self.total -= self.branch.sizes[i]
                self.dropped_any = True

    def first_kept_after_cut(self) -> int | None:
        """The index of the first kept entry after the first dropped one, system entries
        passed over; ``None`` when there is none."""
        entries = self.branch.entries
        at = max(self.scan_from, self.first_dropped + 1)
        while at < len(entries) and (not self.keep[at] or entries[at].role == "system"):
            at += 1
        self.scan_from = at
        return at if at < len(entries) else None

    def inserted_cost(self) -> int:
        """Tokens of what the cut inserts: the summary's reserve, or the marker when the
        first kept entry after the cut is an assistant message (or whenever something was
        dropped, with the recall tool on or a round record to carry)."""
        if not self.dropped_any:
            return 0
        if self.summary_reserve is not None:
            return self.summary_reserve
        if self.every_cut:
            return self.marker_cost
        first_kept = self.first_kept_after_cut()
        answered = first_kept is not None and self.branch.entries[first_kept].role == "assistant"
        return self.marker_cost if answered else 0

    def drop_outside_turns(self, turns: set[str | None]) -> None:
        """``sliding_window``: drop every unlocked unit that starts outside ``turns``."""
        for unit, (start, _end) in enumerate(self.branch.units):
            if not self.branch.locked[unit] and self.branch.entries[start].turn_id not in turns:
                self.drop_unit(unit)

    def drop_oldest_until(self, goal: int) -> None:
        """Drop unlocked units oldest first until what is left, and what the cut inserts,
        is at most ``goal``."""
        for unit in range(len(self.branch.units)):
            if self.total + self.inserted_cost() <= goal:
                return
            if not self.branch.locked[unit]:
                self.drop_unit(unit)

    def drop_leading_results(self) -> None:
        """A kept history never starts with a tool result: drop leading orphaned results."""
        entries = self.branch.entries
        for unit, (start, end) in enumerate(self.branch.units):
            if not any(self.keep[start:end]) or entries[start].role == "system":
                continue
            if (
                self.branch.locked[unit]
                or entries[start].role not in ("user", "tool")
                or not entries[start].tool_results
            ):
                return
            self.drop_unit(unit)

    def settle(self) -> list[int]:
        """End the dropping: the dropped indices. Dropping only an earlier marker or
        summary would put a new one in its place, churn rather than compaction: those are
        kept again, and none is dropped."""
        indices = [i for i, kept in enumerate(self.keep) if not kept]
        if indices and all(_made_here(self.branch.entries[i]) for i in indices):
            for i in indices:
                self.keep[i] = True
                self.total += self.branch.sizes[i]
            return []
        return indices


class _NoRoomForSummary(Exception):
    """The kept entries leave no room for a summary: the cut drops as ``oldest_first``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def cut_to_target(
    acc: AgentConfig,
    ctx: CompactionContext,
    opts: WindowManagerOptions,
    counter: CalibratedCounter,
    before: int,
    usable: int,
    note: Mapping[str, Any] | None = None,
) -> tuple[AgentConfig, dict[str, Any]]:
    """Compact ``acc.memory`` (``before`` tokens) down to ``target`` of the ``usable``
    window by ``opts.strategy``, and fit that window; see the module. ``note`` is
    metadata for the marker or summary it inserts (the round record, when round-aware)."""
    branch = _Branch.of(acc.memory, ctx.rules, counter)
    goal = int(opts.target * usable) - ctx.prompt_tokens
    limit = usable - ctx.prompt_tokens
    recall = _recall_note(acc)
    marker = _marker(recall, note)
    reserve = opts.summary_max_tokens if opts.strategy == "summarize" else None
    every_cut = recall is not None or bool(note)
    cut = _UnitCut(branch, reserve, counter.count_entry(marker), every_cut)
    if opts.strategy == "sliding_window":
        cut.drop_outside_turns(_recent_turns(branch.entries, opts.turns_to_keep))
    cut.drop_oldest_until(goal)
    cut.drop_leading_results()
    plan = _Plan(entries=list(branch.entries), keep=cut.keep)
    dropped = cut.settle()
    total = cut.total
    if opts.strategy == "summarize" and dropped:
        try:
            room = _summary_room(counter, total, goal, limit)
            plan.inserted = _summary(acc, ctx, opts, counter, branch.entries, dropped, room)
            if note:
                metadata = {**plan.inserted.metadata, **note}
                plan.inserted = plan.inserted.model_copy(update={"metadata": metadata})
        except _NoRoomForSummary as exc:
            # no room for a summary: the plan of oldest_first, said in meta
            plain = opts.model_copy(update={"strategy": "oldest_first"})
            new_acc, meta = cut_to_target(acc, ctx, plain, counter, before, usable, note)
            if meta.get("compacted") or "error" in meta:
                meta.update(strategy=opts.strategy, summary_fallback=exc.reason)
            return new_acc, meta
        except SummaryError as exc:
            return acc, {"compacted": False, "error": f"window_manager summarize: {exc}"}
        plan.insert_at = dropped[0]
        total += counter.count_entry(plan.inserted)
    elif dropped:
        total += _place_marker(plan, cut, marker, dropped[0])

    # Still over the window: shorten the largest kept tool results (never kept by a rule).
    if total > limit:
        total = _shorten(plan, branch, counter, total, goal)
    if total > limit:
        error = _irreducible_message(plan, branch, ctx, opts, usable, total, counter)
        return acc, {
            "compacted": False,
            "error": error,
            "irreducible_tokens": total + ctx.prompt_tokens,
        }

    nothing_to_do = all(plan.keep) and not plan.replaced and plan.inserted is None
    if nothing_to_do and not any(e.has_thinking for e in branch.entries):
        return acc, {"compacted": False}
    return _commit(acc, ctx, opts, counter, plan, before, goal)


def _marker(recall: str | None, note: Mapping[str, Any] | None) -> Entry:
    """The note put where history was cut (followed by the recall tool's note when on),
    with ``note`` in its metadata."""
    text = MARKER_TEXT if recall is None else f"{MARKER_TEXT} {recall}"
    return Entry(
        id=new_id(), role="user", content=text, metadata={MARKER_KEY: True, **(note or {})}
    )


def _place_marker(plan: _Plan, cut: _UnitCut, marker: Entry, at: int) -> int:
    """Put ``marker`` at ``at``, the first dropped index, where a kept assistant message
    would follow a message it never answered (or open the history, which providers
    refuse), or wherever history was cut with the recall tool on or a round record to
    carry; the tokens it adds."""
    first_kept = cut.first_kept_after_cut()
    if first_kept is None:
        return 0
    follower = plan.entries[first_kept]
    if not cut.every_cut and follower.role != "assistant":
        return 0
    plan.insert_at = at
    plan.inserted = marker.model_copy(update={"turn_id": follower.turn_id})
    return cut.marker_cost


def _summary_room(counter: TokenCounter, total: int, goal: int, limit: int) -> int:
    """The tokens a summary may take beside ``total`` kept tokens: under the target when
    it can be, else under the window (:class:`_NoRoomForSummary` when neither leaves
    :data:`MIN_SUMMARY_TOKENS`)."""
    overhead = counter.count_entry(Entry(id="summary-overhead", role="user", content=""))
    room = goal - total - overhead
    if room < MIN_SUMMARY_TOKENS:
        room = limit - total - overhead
    if room < MIN_SUMMARY_TOKENS:
        raise _NoRoomForSummary(
            f"no room for a summary: {max(limit - total, 0):,} tokens of the usable window "
            f"are left after the kept messages and a summary needs at least "
            f"{MIN_SUMMARY_TOKENS + overhead:,}; dropped as oldest_first instead"
        )
    return room


def _summary(
    acc: AgentConfig,
    ctx: CompactionContext,
    opts: WindowManagerOptions,
    counter: TokenCounter,
    entries: list[Entry],
    dropped: list[int],
    room: int,
) -> Entry:
    """The summary entry of the ``dropped`` indices of ``entries``, within ``room`` tokens
    and at most ``summary_max_tokens`` (raises :class:`SummaryError`)."""
    # with the recall tool on, the summary ends with the note saying it exists
    recall = _recall_note(acc)
    note = "" if recall is None else "\n" + recall
    room -= counter.count_text(note) if note else 0
    try:
        summary = make_summary(
            acc,
            [entries[i] for i in dropped],
            opts,
            counter,
            budget=min(opts.summary_max_tokens, room),
            instructions=ctx.rules.summary_instructions,
            focus=ctx.focus,
        )
    except SummaryTooSmall as exc:
        raise _NoRoomForSummary(
            f"no room for a summary: {exc}; dropped as oldest_first instead"
        ) from exc
    return Entry(
        id=new_id(),
        turn_id=f"summary-{new_id()[:12]}",
        role="user",
        content=summary + note,
        metadata={SUMMARY_KEY: True, "summarized_ids": [entries[i].id for i in dropped]},
    )


def _recall_note(acc: AgentConfig) -> str | None:
    """What a marker or summary adds when the agent's ``recall`` tool is on, else ``None``."""
    settings = acc.recall_settings
    return None if settings is None else settings.note


def _made_here(entry: Entry) -> bool:
    """Whether ``entry`` is a marker or summary this compactor inserted earlier."""
    return bool(entry.metadata.get(MARKER_KEY) or entry.metadata.get(SUMMARY_KEY))


def _recent_turns(entries: Sequence[Entry], count: int) -> set[str | None]:
    """The turn ids of the newest ``count`` turns of ``entries``."""
    order: list[str | None] = []
    seen: set[str | None] = set()
    for e in reversed(entries):
        if e.turn_id not in seen:
            seen.add(e.turn_id)
            order.append(e.turn_id)
            if len(order) == count:
                break
    return set(order)


def _shorten(plan: _Plan, branch: _Branch, counter: TokenCounter, total: int, goal: int) -> int:
    """Cut the largest kept tool-result texts that no survival rule keeps (head and tail
    kept) toward ``goal``; the tokens then kept."""
    candidates = [
        i
        for i, e in enumerate(plan.entries)
        if plan.keep[i] and e.id not in branch.protected and e.role != "system" and e.tool_results
    ]
    current = {i: branch.sizes[i] for i in candidates}
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
        new_block = _shortened_result(b, ratio, drop_media, counter)
        if new_block is not None:
            blocks[j] = new_block
            changed = True
    if not changed:
        return None
    return entry.model_copy(update={"content": tuple(blocks)})


def _shortened_result(
    block: ToolResultBlock, ratio: float, drop_media: bool, counter: TokenCounter
) -> ToolResultBlock | None:
    """``block`` with its text cut to ``ratio`` of its length (at least
    ``_MIN_KEEP_CHARS``), head and tail kept, and its media replaced by a note when
    ``drop_media``; ``None`` when that changes nothing."""
    text = block.text()
    keep_chars = max(int(len(text) * ratio), _MIN_KEEP_CHARS)
    new_text = text
    if keep_chars < len(text):
        head = keep_chars * 3 // 5
        tail = keep_chars - head
        cut = len(text) - head - tail
        cut_tokens = counter.count_text(text[head : len(text) - tail])
        marker = (
            f"\n[... {cut:,} characters (about {cut_tokens:,} tokens) cut "
            f"{keys.SHORTENED_MARK} context window ...]\n"
        )
        new_text = text[:head] + marker + text[len(text) - tail :]
    media = (
        []
        if isinstance(block.content, str)
        else [p for p in block.content if not isinstance(p, TextBlock)]
    )
    others: list[Any] = []
    for part in media:
        if drop_media:
            kind = "image" if isinstance(part, ImageBlock) else "document"
            new_text += f"\n[{kind} removed {keys.SHORTENED_MARK} window]"
        else:
            others.append(part)
    if new_text == text and not (drop_media and media):
        return None
    content: Any = new_text if not others else (TextBlock(text=new_text), *others)
    return block.model_copy(update={"content": content})


def _irreducible_message(
    plan: _Plan,
    branch: _Branch,
    ctx: CompactionContext,
    opts: WindowManagerOptions,
    usable: int,
    total: int,
    counter: CalibratedCounter,
) -> str:
    """The error of a plan that cannot fit: what is irreducible and what holds it.

    Each kept unit counts toward one holder: system entries, else the first survival
    rule (``RULES`` order) keeping one of its entries (the whole unit: a tool use keeps
    its results), else the newest unit and the other kept entries.
    """
    from normandy_core.conversation.survival import RULES

    system = newest = 0
    held = dict.fromkeys(ctx.rules.active(), 0)
    for start, end in branch.units:
        rules = [
            branch.protected[e.id] for e in plan.entries[start:end] if e.id in branch.protected
        ]
        holder = min(rules, key=RULES.index) if rules else None
        for i in range(start, end):
            if not plan.keep[i]:
                continue
            # a shortened result counts what is left of it
            size = (
                branch.sizes[i] if i not in plan.replaced else counter.count_entry(plan.replaced[i])
            )
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
        f"(window {ctx.window:,} minus reserved_tokens {opts.reserved_tokens:,})"
    )


def _commit(
    acc: AgentConfig,
    ctx: CompactionContext,
    opts: WindowManagerOptions,
    counter: CalibratedCounter,
    plan: _Plan,
    before: int,
    goal: int,
) -> tuple[AgentConfig, dict[str, Any]]:
    """The new memory of ``plan`` and the meta reporting it."""
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
    new_memory = acc.memory.derive(kept)
    after = counter.memory_tokens(new_memory)
    # tokens_before, tokens_after and tokens_removed are computed by the boundary.
    meta: dict[str, Any] = {
        "compacted": True,
        "strategy": opts.strategy,
        "dropped": dropped,
        "counter": counter.name,
        "calibration": counter.calibration.snapshot(counter.model, counter.base.name),
        "window": ctx.window,
        "target_met": after <= goal,
        # mid-round, the model finishes its round with thinking disabled when this is true
        "thinking_stripped": any(
            e.has_thinking for i, e in enumerate(plan.entries) if plan.keep[i]
        ),
    }
    if plan.replaced:
        meta["shortened"] = [plan.entries[i].id for i in sorted(plan.replaced)]
    if plan.inserted is not None:
        meta["summary_id" if opts.strategy == "summarize" else "marker_id"] = plan.inserted.id
    log.debug(
        "window_manager %s: %d -> %d tokens, %d entries dropped",
        opts.strategy,
        before,
        after,
        len(dropped),
    )
    return acc.with_memory(new_memory), meta

"""Tool-use structure of a conversation: atomic units and pairing checks.

A *unit* is the smallest run of entries a compactor may drop or keep as a whole: an
assistant entry that calls tools together with every following entry that carries their
results (a parallel batch stays together), or any other single entry. Cutting only
between units never orphans a tool result and never splits a batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from normandy_core.conversation.entries import (
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

if TYPE_CHECKING:
    from normandy_core.conversation.entries import Entry

__all__ = [
    "carries_results",
    "group_units",
    "open_round_start",
    "pairing_problems",
    "starts_with_thinking",
    "thinking_lost",
    "tool_result_ids",
    "tool_use_ids",
]


def tool_use_ids(entry: Entry) -> list[str]:
    """Ids of the tool uses in ``entry``, in order (opaque calls with a ``use_id`` too)."""
    c = entry.content
    if isinstance(c, str):
        return []
    out: list[str] = []
    for b in c:
        if isinstance(b, ToolUseBlock):
            out.append(b.id)
        elif isinstance(b, OpaqueBlock) and b.use_id is not None:
            out.append(b.use_id)
    return out


def tool_result_ids(entry: Entry) -> list[str]:
    """``tool_use_id`` of each tool result in ``entry``, in order (opaque ``answers`` too)."""
    c = entry.content
    if isinstance(c, str):
        return []
    out: list[str] = []
    for b in c:
        if isinstance(b, ToolResultBlock):
            out.append(b.tool_use_id)
        elif isinstance(b, OpaqueBlock) and b.answers is not None:
            out.append(b.answers)
    return out


def carries_results(entry: Entry) -> bool:
    """Whether ``entry`` is a user or tool message holding at least one tool result."""
    if entry.role not in ("user", "tool") or isinstance(entry.content, str):
        return False
    return any(
        isinstance(b, ToolResultBlock) or (isinstance(b, OpaqueBlock) and b.answers is not None)
        for b in entry.content
    )


def group_units(entries: Sequence[Entry]) -> list[tuple[int, int]]:
    """Split ``entries`` into atomic units, as ``[start, end)`` index ranges in order.

    An assistant entry with tool uses opens a unit that takes every directly following
    entry carrying tool results; any other entry is a unit of its own. Linear in the
    number of entries.
    """
    units: list[tuple[int, int]] = []
    n = len(entries)
    i = 0
    while i < n:
        e = entries[i]
        j = i + 1
        if e.role == "assistant" and tool_use_ids(e):
            while j < n and carries_results(entries[j]):
                j += 1
        units.append((i, j))
        i = j
    return units


def pairing_problems(entries: Sequence[Entry], *, allow_pending: bool = True) -> list[str]:
    """Everything a provider would reject about tool pairing in ``entries``; empty when valid.

    A tool result must answer a tool use of the nearest assistant entry before it (with
    only result-carrying entries between them); every tool use must get a result in the
    entries that directly follow. ``allow_pending`` accepts tool uses of the last entry
    that have no results yet (a round waiting for its tools).
    """
    problems: list[str] = []
    pending: dict[str, str] = {}  # tool_use_id -> entry id of the use
    for idx, e in enumerate(entries):
        results = tool_result_ids(e)
        if results and e.role in ("user", "tool"):
            for rid in results:
                if rid in pending:
                    del pending[rid]
                else:
                    problems.append(
                        f"entry {e.id!r} (position {idx}) has a tool result for {rid!r} "
                        "without its tool use in the assistant entry before it"
                    )
            continue
        for uid, eid in pending.items():
            problems.append(f"entry {eid!r} has tool use {uid!r} without a result after it")
        pending = {}
        if e.role == "assistant":
            for uid in tool_use_ids(e):
                pending[uid] = e.id
        elif results:
            problems.append(f"entry {e.id!r} (role {e.role}) carries tool results")
    last_is_use = bool(entries) and entries[-1].role == "assistant"
    if pending and not (allow_pending and last_is_use):
        for uid, eid in pending.items():
            problems.append(f"entry {eid!r} has tool use {uid!r} without a result after it")
    return problems


def starts_with_thinking(entry: Entry) -> bool:
    """Whether ``entry`` opens with a thinking block (after any leading provider compaction
    and empty text), as a provider checks the last assistant entry of an open tool round."""
    # A leading provider compaction is a summary of what came before the entry's own
    # blocks (the provider puts it first in its reply): the rule applies after it.
    blocks = [
        block
        for block in entry.blocks
        if not (isinstance(block, TextBlock) and not block.text)
        and not (isinstance(block, OpaqueBlock) and block.kind == "compaction")
    ]
    return bool(blocks) and isinstance(blocks[0], (ThinkingBlock, RedactedThinkingBlock))


def _open_round(newest_first: Iterable[Entry]) -> tuple[int, Entry] | None:
    """The final assistant entry of an open tool round and how many entries back from the
    newest it is, given the conversation newest first; ``None`` when no round is open."""
    for back, entry in enumerate(newest_first):
        if entry.role == "assistant":
            return (back, entry) if back and entry.tool_uses else None
        if not entry.tool_results:
            return None
    return None


def open_round_start(entries: Sequence[Entry]) -> int | None:
    """Index of the final assistant entry of an open tool round, or ``None`` when none is open.

    A round is open when the conversation ends with tool results answering the tool uses
    of the assistant entry before them: the next request continues that round.
    """
    found = _open_round(reversed(entries))
    return None if found is None else len(entries) - 1 - found[0]


def thinking_lost(newest_first: Iterable[Entry]) -> bool:
    """Whether a request over the conversation (given newest first, as
    :meth:`~normandy_core.AgentMemory.newest_first` gives it: only the open round is read)
    asking for thinking must go without it: a tool round is open and its last assistant
    entry does not start with its thinking block (a mid-round compaction stripped it).
    The round then finishes with thinking disabled."""
    found = _open_round(newest_first)
    return found is not None and not starts_with_thinking(found[1])

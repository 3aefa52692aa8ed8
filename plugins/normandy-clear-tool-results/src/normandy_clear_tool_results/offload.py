"""Offload at arrival (``offload_tokens``): a large tool result archived, a preview in place.

At every boundary, each tool result over ``offload_tokens`` tokens that is not offloaded
yet (so: at the first boundary that sees it) is replaced by a preview: its head and
tail, together at most ``offload_preview`` of ``offload_tokens`` tokens, under a line
naming the reference (its tool-use id) that the ``recall`` tool takes to return it whole.
The original goes to the archive as a dropped entry of the compaction, which the archive
commits before the compaction takes effect (or refuses it: the original stays).

Nothing is offloaded when no hook plugin can give it back (no ``recall_entries``
source, such as the archive): the result is kept whole and ``offload_skipped`` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from normandy_core import Entry, TextBlock, ToolResultBlock
from normandy_core.contract.recall import RECALL_TAG, recall_sources
from normandy_core.conversation import keys

if TYPE_CHECKING:
    from normandy_clear_tool_results.options import ClearToolResultsOptions
    from normandy_core import AgentMemory, CompactionContext

__all__ = ["HEAD_SHARE", "Offload", "offload", "preview"]

#: The share of the preview's room given to the head (the rest is the tail): a tool's
#: output usually says what it is at its start, and how it ended at its end.
HEAD_SHARE = 2 / 3
#: A cut moves back to a line break when one is this close to it (a share of the part),
#: so the preview shows whole lines.
_LINE_SLACK = 0.2


@dataclass
class Offload:
    """What offloading did: the entries with previews in place, the tool-use ids
    offloaded (in order), their tokens before, and why nothing was when it could not be."""

    entries: list[Entry]
    ids: list[str] = field(default_factory=list)
    tokens: int = 0
    skipped: str | None = None


def offload(
    memory: AgentMemory, ctx: CompactionContext, opts: ClearToolResultsOptions, tool: str | None
) -> Offload:
    """Offload the tool results of ``memory``'s entries over ``opts.offload_tokens`` (see
    the module docs); ``tool`` is the agent's recall tool name (``None``: recall is off)."""
    entries = memory.entries()
    bound = opts.offload_tokens
    if bound is None:
        return Offload(entries)
    # An entry within the bound holds no result over it: its count comes from the
    # memory's cache, so a boundary where nothing arrived large counts nothing anew.
    large = [
        i
        for i, e in enumerate(entries)
        if e.tool_results and ctx.counter.entry_tokens(memory, e) > bound
    ]
    if not large:
        return Offload(entries)
    names = {u.id: u.name for e in entries for u in e.tool_uses}
    skip = set(opts.exclude_tools) | set(ctx.rules.keep_tools) | {tool or "recall"}
    kept = ctx.rules.protected(entries)
    count = ctx.counter.count_text
    room = int(opts.offload_preview * bound)
    out = Offload(list(entries))
    for i in large:
        e = entries[i]
        if e.id in kept or isinstance(e.content, str):
            continue
        done = set(keys.offloaded_ids(e)) | set(keys.cleared_ids(e))
        blocks = list(e.content)
        hit: list[str] = []
        for j, b in enumerate(blocks):
            if not _candidate(b, done, names, skip):
                continue
            assert isinstance(b, ToolResultBlock)
            # Counted as an entry of its own, under an id the memory caches it by: a batch
            # over the bound whose results are each within it is not recounted later.
            alone = Entry(id=f"{e.id}\x00{b.tool_use_id}", role="user", content=(b,))
            size = ctx.counter.entry_tokens(memory, alone)
            if size <= bound:
                continue
            if not recall_sources():
                return Offload(entries, skipped=_NO_SOURCE)
            text = preview(b.text(), size, room, b.tool_use_id, tool, count)
            blocks[j] = b.model_copy(update={"content": text})
            hit.append(b.tool_use_id)
            out.tokens += size
        if hit:
            meta = {**e.metadata, keys.OFFLOADED_KEY: [*keys.offloaded_ids(e), *hit]}
            out.entries[i] = e.model_copy(update={"content": tuple(blocks), "metadata": meta})
            out.ids += hit
    return out


_NO_SOURCE = (
    "tool results over offload_tokens were kept whole: no hook plugin can give them back "
    "(none implements recall_entries); install normandy-archive, or turn its archive on"
)


def _candidate(b: object, done: set[str], names: dict[str, str], skip: set[str]) -> bool:
    """Whether ``b`` is a text tool result that may be offloaded: not offloaded, cleared or
    shortened before, not a recall result, not of a tool left alone (images and documents
    stay)."""
    if not isinstance(b, ToolResultBlock) or b.tool_use_id in done:
        return False
    if names.get(b.tool_use_id) in skip:
        return False
    if not isinstance(b.content, str) and not all(isinstance(p, TextBlock) for p in b.content):
        return False
    text = b.text()
    if keys.SHORTENED_MARK in text:  # window_manager shortened it: compacted already
        return False
    return not text.startswith((keys.OFFLOADED_TAG, keys.CLEARED_TAG, RECALL_TAG))


def preview(
    text: str, tokens: int, room: int, ref: str, tool: str | None, count: Callable[[str], int]
) -> str:
    """The preview of a result ``text`` of ``tokens`` tokens: a line naming ``ref`` (and the
    recall ``tool``, when on), its head and its tail, the two within ``room`` tokens by
    ``count``, and how much lies between them."""
    head = _head(text, int(room * HEAD_SHARE), count)
    rest = text[len(head) :]
    tail = _head(rest[::-1], room - count(head), lambda s: count(s[::-1]))[::-1]
    hidden = len(rest) - len(tail)
    how = (
        f"call `{tool}` with the query {ref} to get it back whole"
        if tool
        else f"it is archived under the tool-use id {ref}"
    )
    return (
        f"{keys.OFFLOADED_TAG} at arrival: {tokens:,} tokens, {len(text):,} characters; "
        f"{how}. Its head and tail follow.]\n{head}\n"
        f"[... {hidden:,} characters not shown ...]\n{tail}"
    )


def _head(text: str, room: int, count: Callable[[str], int]) -> str:
    """The longest start of ``text`` within ``room`` tokens by ``count`` (binary search on
    characters), moved back to a line break near its end."""
    if room <= 0:
        return ""
    lo, hi = 0, min(len(text), room * 16)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:mid]) <= room:
            lo = mid
        else:
            hi = mid - 1
    part = text[:lo]
    cut = part.rfind("\n")
    if lo < len(text) and cut >= len(part) * (1 - _LINE_SLACK):
        part = part[: cut + 1]
    return part

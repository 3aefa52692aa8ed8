"""A third-party compactor built like the in-tree ones: keep the newest ``keep`` units.

Units come from :func:`normandy_core.group_units`, so a tool use never loses its results.
The units holding an entry the config's survival rules keep (``ctx.rules``: pinned
entries, the first user message, ``keep_tools``, ``keep_if``) are always kept, and the
kept history starts at a user message. At a mid-round boundary the kept messages lose their
thinking blocks, as the contract asks of a compactor that compacts there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from normandy_core import (
    CompactorOptions,
    drop_thinking,
    group_units,
    hookimpl,
    validate_options,
)

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext


class TailOptions(CompactorOptions):
    """Options of the ``tail`` compactor."""

    keep: int = Field(default=4, ge=1, description="units (messages or tool rounds) to keep")


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """``tail`` counts units, not tokens: it never needs the context window."""
    return False


@hookimpl
def validate_opts(opts: dict[str, Any], entry: str) -> None:
    """Refuse bad options where the config is made, naming ``entry``."""
    validate_options(TailOptions, opts, entry=entry, compactor="tail")


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: dict[str, Any]
) -> tuple[AgentConfig, dict[str, Any]]:
    """Keep the newest ``keep`` units and those the survival rules hold; report the rest."""
    keep = TailOptions.model_validate(opts).keep
    entries = acc.memory.entries()
    units = group_units(entries)
    if len(units) <= keep:
        return acc, {"compacted": False}
    protected = ctx.rules.protected(entries)
    held = [False] * len(entries)
    for start, end in units:
        if any(e.id in protected or e.role == "system" for e in entries[start:end]):
            held[start:end] = [True] * (end - start)
    cut = units[-keep][0]

    def first_kept(at: int) -> str:
        kept = [e for i, e in enumerate(entries[:at]) if held[i]] + entries[at:]
        return next((e.role for e in kept if e.role != "system"), "user")

    # A kept history starts with a user message, never an assistant one.
    while cut > 0 and first_kept(cut) == "assistant":
        cut = max(start for start, _ in units if start < cut)
    dropped = [e for i, e in enumerate(entries[:cut]) if not held[i]]
    if not dropped:
        return acc, {"compacted": False}
    kept = [e for i, e in enumerate(entries[:cut]) if held[i]] + entries[cut:]
    memory = acc.memory.derive(kept)
    if ctx.mid_round:
        memory = drop_thinking(memory)
    return acc.with_memory(memory), {"compacted": True, "dropped": dropped, "strategy": "tail"}

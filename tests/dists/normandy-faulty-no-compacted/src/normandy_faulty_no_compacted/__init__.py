"""A compactor that drops half the conversation and returns meta without ``compacted``."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """No window needed."""
    return False


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Wrong: meta has no boolean ``compacted`` (and nothing is reported as dropped)."""
    entries = acc.memory.entries()
    kept = entries[len(entries) // 2 :]
    return acc.with_memory(acc.memory.derive(kept)), {"strategy": "half", "removed": True}

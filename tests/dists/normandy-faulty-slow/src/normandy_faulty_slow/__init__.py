"""A compactor that takes far too long (a hung summarizer call, say), then compacts."""

from __future__ import annotations

import time
from typing import Any

from normandy_core import hookimpl


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """No window needed."""
    return False


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Sleeps a minute, then drops everything but the newest entry (must be ignored)."""
    time.sleep(60)
    entries = acc.memory.entries()
    return acc.with_memory(acc.memory.derive(entries[-1:])), {
        "compacted": True,
        "dropped": entries[:-1],
    }

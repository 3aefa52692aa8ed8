"""A hook plugin that also implements ``maybe_compact`` (a compactor's hook)."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: Any) -> Any:
    """Would never run in a hook plugin."""
    return acc, {"compacted": False}

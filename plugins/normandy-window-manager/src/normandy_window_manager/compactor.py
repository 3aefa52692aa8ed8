"""Placeholder: the window_manager compactor lands with its issue."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Not yet implemented: skip."""
    return acc, {"compacted": False}

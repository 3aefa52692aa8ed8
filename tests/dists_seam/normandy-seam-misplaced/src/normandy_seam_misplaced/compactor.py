"""A compactor that also implements ``after_compact`` (a hook plugin's hook)."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: Any) -> Any:
    """Skip."""
    return acc, {"compacted": False}


@hookimpl
def after_compact(acc: Any, ctx: Any, meta: Any) -> None:
    """Would never run in a compactor."""

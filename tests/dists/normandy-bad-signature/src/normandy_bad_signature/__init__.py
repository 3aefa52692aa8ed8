"""A compactor whose ``maybe_compact`` takes an argument the hookspec does not have."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def maybe_compact(
    acc: Any, ctx: Any, opts: dict[str, Any], budget: int
) -> tuple[Any, dict[str, Any]]:
    """Wrong: ``budget`` is not an argument of the maybe_compact hookspec."""
    return acc, {"compacted": False}

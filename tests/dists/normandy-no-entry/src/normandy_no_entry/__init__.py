"""A compactor whose ``validate_opts`` does not take ``entry``: accepted, as pluggy allows;
the core begins its refusals with the entry point itself."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """No window needed."""
    return False


@hookimpl
def validate_opts(opts: dict[str, Any]) -> None:
    """Refuse any option (the core names the entry point in the message)."""
    if opts:
        raise ValueError("no options allowed")


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Never compacts."""
    return acc, {"compacted": False}

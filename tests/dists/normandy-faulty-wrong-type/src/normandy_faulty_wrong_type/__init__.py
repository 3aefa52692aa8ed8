"""A compactor whose ``maybe_compact`` returns a string instead of ``(acc, meta)``."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """No window needed."""
    return False


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
    """Wrong: returns text, not ``(acc, meta)``."""
    return "compacted, trust me"

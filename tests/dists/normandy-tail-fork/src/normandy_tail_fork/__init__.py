"""Registers ``keep_last``, a name the ``normandy-tail`` distribution registers too."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """No window needed."""
    return False


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Never compacts."""
    return acc, {"compacted": False}

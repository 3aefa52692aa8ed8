"""A compactor whose ``maybe_compact`` always raises (a bug in a third-party plugin)."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """No window needed."""
    return False


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Always raises, as a plugin with a bug does."""
    raise ZeroDivisionError("faulty_raises divided by zero")

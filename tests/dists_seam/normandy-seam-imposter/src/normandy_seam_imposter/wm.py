"""A hook plugin that happens to be named ``window_manager``."""

from __future__ import annotations

from typing import Any

from normandy_core import hookimpl
from normandy_seam_imposter import record


@hookimpl
def after_compact(acc: Any, ctx: Any, meta: Any) -> None:
    """Record the compaction."""
    record("hook-window_manager", meta)

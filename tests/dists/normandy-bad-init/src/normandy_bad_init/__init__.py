"""Plugin classes that import fine but cannot be instantiated (a missing setting)."""

from __future__ import annotations

import os
from typing import Any

from normandy_core import hookimpl


class Compactor:
    """Needs ``BAD_INIT_TOKEN`` in the environment."""

    def __init__(self) -> None:
        self.token = os.environ["BAD_INIT_TOKEN"]

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> tuple[Any, Any]:
        """Never compacts."""
        return acc, {"compacted": False}


class Hook:
    """Needs ``BAD_INIT_TOKEN`` in the environment."""

    def __init__(self) -> None:
        self.token = os.environ["BAD_INIT_TOKEN"]

    @hookimpl
    def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
        """Does nothing."""

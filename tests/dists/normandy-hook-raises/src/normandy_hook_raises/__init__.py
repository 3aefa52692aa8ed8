"""An ``after_compact`` hook plugin that raises on every call while ``NORMANDY_TEST_HOOK_RAISES``
is set (so the other scenarios of the test venv are not affected)."""

from __future__ import annotations

import os
from typing import Any

from normandy_core import hookimpl


@hookimpl
def after_compact(acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
    """Raises, as a hook whose backend is down does."""
    if os.environ.get("NORMANDY_TEST_HOOK_RAISES"):
        raise ConnectionError("raising_hook: backend unreachable")

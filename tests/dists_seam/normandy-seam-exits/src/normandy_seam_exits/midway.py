"""Appends to the memory it was given, then raises what ``NORMANDY_TEST_EXIT_KIND`` names."""

from __future__ import annotations

import os
import sys
from typing import Any

from normandy_core import hookimpl


@hookimpl
def needs_window(opts: Any) -> bool:
    """No window."""
    return False


@hookimpl
def maybe_compact(acc: Any, ctx: Any, opts: Any) -> Any:
    """Corrupt the input, then leave abruptly."""
    acc.memory.add_message("user", "appended by exits_midway")
    if os.environ.get("NORMANDY_TEST_EXIT_KIND") == "interrupt":
        raise KeyboardInterrupt("raised by the plugin")
    sys.exit(3)

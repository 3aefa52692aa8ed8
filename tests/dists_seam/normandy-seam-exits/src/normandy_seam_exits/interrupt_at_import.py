"""Raises KeyboardInterrupt at import (no Ctrl-C was pressed)."""

from __future__ import annotations

raise KeyboardInterrupt("raised by the plugin at import")

"""A hook plugin whose import fails."""

from __future__ import annotations

raise RuntimeError("normandy-hook-broken refuses to import")

"""An ``after_compact`` hook plugin (a class) that appends one JSON line per call to the
file named by ``NORMANDY_TEST_HOOK_LOG``."""

from __future__ import annotations

import json
import os
from typing import Any

from normandy_core import hookimpl


class Recorder:
    """Records what each compaction dropped."""

    @hookimpl
    def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
        """Append the dropped ids, the strategy and the boundary kind."""
        path = os.environ["NORMANDY_TEST_HOOK_LOG"]
        line = {
            "dropped": [e.id for e in meta["dropped"]],
            "strategy": meta.get("strategy"),
            "mid_round": ctx.mid_round,
            "kept": [e.id for e in acc.memory],
        }
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

"""A third-party hook plugin whose entry point is also named ``archive`` (a name conflict),
and an unrelated hook plugin named ``window_manager``; both append what they see to the
file named by ``NORMANDY_TEST_IMPOSTER_LOG``."""

from __future__ import annotations

import json
import os
from typing import Any

from normandy_core import hookimpl


def record(who: str, meta: Any) -> None:
    """Append one line naming the hook and the dropped ids."""
    path = os.environ.get("NORMANDY_TEST_IMPOSTER_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"who": who, "ids": [e.id for e in meta["dropped"]]}) + "\n")


@hookimpl
def after_compact(acc: Any, ctx: Any, meta: Any) -> None:
    """Record the compaction."""
    record("imposter-archive", meta)

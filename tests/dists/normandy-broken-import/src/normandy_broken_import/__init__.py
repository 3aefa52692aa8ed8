"""A compactor whose import fails, as one with a missing dependency does.

When ``NORMANDY_TEST_IMPORT_LOG`` names a file, an import attempt is recorded there first,
so a test can tell whether anything tried to import this module.
"""

from __future__ import annotations

import os

_log = os.environ.get("NORMANDY_TEST_IMPORT_LOG")
if _log:
    with open(_log, "a", encoding="utf-8") as fh:
        fh.write("normandy_broken_import\n")

import normandy_missing_dependency  # type: ignore[import-not-found]  # noqa: E402, F401

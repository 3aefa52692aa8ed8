"""``python -m benchmarks.quality [--quick] [--out FILE] [--plot PNG]``."""

from __future__ import annotations

import os
import sys
import tempfile

# Every run writes its own archive in a temporary directory (see replay.py); the
# default path, outside any run, must never be the home directory either.
os.environ.setdefault(
    "NORMANDY_ARCHIVE_PATH", os.path.join(tempfile.gettempdir(), "normandy-quality-archive.sqlite3")
)

from benchmarks.quality.run import main

sys.exit(main())

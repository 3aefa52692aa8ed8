"""``python -m benchmarks [--quick|--full]``."""

from __future__ import annotations

import os
import sys

# The archive hook (installed in the workspace) would write every benchmark compaction to
# SQLite; the figures measure the compactors, so it is off unless the caller says otherwise.
# Section 7 measures the archive itself, in a subprocess that loads it.
os.environ.setdefault("NORMANDY_DISABLE_PLUGINS", "archive")

from benchmarks.run import main

sys.exit(main())

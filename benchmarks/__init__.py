"""Performance harness for Normandy: the hot path, compaction, counting, and the peers.

Run ``python -m benchmarks --quick`` (under a minute) or ``python -m benchmarks --full``.
Every figure is a median of repeated runs; every comparison is a ratio measured in the
same run. See ``benchmarks/README.md``.
"""

import os

# Benchmarks never write into the user's home: unless the caller chose an archive, the
# archive hook (installed in the workspace) writes into a temporary directory removed at
# exit. Here, in the package, so that every module gets it however it is run
# (``python -m benchmarks.round_aware`` had no guard of its own).
if not os.environ.get("NORMANDY_ARCHIVE_PATH") and not os.environ.get("NORMANDY_ARCHIVE_URL"):
    import atexit
    import shutil
    import tempfile

    _scratch = tempfile.mkdtemp(prefix="normandy-bench-archive-")
    atexit.register(shutil.rmtree, _scratch, ignore_errors=True)
    os.environ["NORMANDY_ARCHIVE_PATH"] = os.path.join(_scratch, "archive.sqlite3")

"""``python -m normandy_archive``: the archive commands."""

from __future__ import annotations

import sys

from normandy_archive.cli import main

if __name__ == "__main__":
    sys.exit(main())

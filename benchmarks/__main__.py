"""``python -m benchmarks [--quick|--full]``."""

from __future__ import annotations

import sys

from benchmarks.run import main

sys.exit(main())

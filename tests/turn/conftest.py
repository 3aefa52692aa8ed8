"""Fixtures of the turn tests: the stand-in compactor and an after_compact recorder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SUPPORT = "normandy_turn_test_support"


def _load_support():
    if SUPPORT in sys.modules:
        return sys.modules[SUPPORT]
    spec = importlib.util.spec_from_file_location(SUPPORT, Path(__file__).with_name("support.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[SUPPORT] = module
    spec.loader.exec_module(module)
    return module


support = _load_support()
keep_tail = support.keep_tail
drops = support.drops

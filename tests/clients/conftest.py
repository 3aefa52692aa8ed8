"""Fixtures of the client tests: loopback providers, the stand-in compactor, a hook recorder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).parent
SUPPORT = "normandy_turn_test_support"


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


support = _load(SUPPORT, HERE.parent / "turn" / "support.py")
servers = _load("normandy_client_test_servers", HERE / "servers.py")
sessions = _load("normandy_client_test_sessions", HERE / "sessions.py")
keep_tail = support.keep_tail
drops = support.drops

"""Fixtures of the native compactors' tests: the loopback providers of tests/clients, a
fresh archive at ``tmp_path``, and the process-wide calibration reset around each test."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from normandy_core.conversation.calibration import default_calibration

SERVERS = "normandy_client_test_servers"
ROOT = Path(__file__).resolve().parents[3]

if SERVERS not in sys.modules:  # the name tests/clients/conftest.py loads it under
    spec = importlib.util.spec_from_file_location(
        SERVERS, ROOT / "tests" / "clients" / "servers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[SERVERS] = module
    spec.loader.exec_module(module)


@pytest.fixture(autouse=True)
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh SQLite archive for the test; provider usage feeds the process-wide
    calibration, so it is reset before and after (other tests size with it)."""
    path = tmp_path / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)
    default_calibration().reset()
    yield path
    default_calibration().reset()

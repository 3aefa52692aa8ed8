"""Fixtures of the turn tests: the stand-in compactor and an after_compact recorder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from normandy_core import register_compactor, register_hook, unregister_compactor, unregister_hook
from normandy_core.calibration import default_calibration


def _load_support():
    name = "normandy_turn_test_support"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("support.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


support = _load_support()


@pytest.fixture
def keep_tail():
    """The keep-tail test compactor, registered in code for the test."""
    register_compactor(support.COMPACTOR, support.KeepTail(), replace=True)
    default_calibration().reset()
    yield support.COMPACTOR
    unregister_compactor(support.COMPACTOR)
    default_calibration().reset()


@pytest.fixture
def drops():
    """An after_compact hook registered in code; yields the recorder."""
    rec = support.DropRecorder()
    qname = register_hook(rec, name=f"drop-recorder-{id(rec)}")
    yield rec
    unregister_hook(qname)

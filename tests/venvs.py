"""The tools the tests make fresh virtual environments with: uv and the base interpreter.

Shared by the fixtures that install distributions for real (tests/conftest.py) and by
the install tests (tests/test_install.py), so every venv is made from the same python.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

__all__ = ["base_python", "uv_executable"]


def uv_executable() -> str:
    """The uv beside this interpreter (a dev dependency), else the one on ``PATH``."""
    here = Path(sys.executable).parent
    found = shutil.which("uv", path=str(here)) or shutil.which("uv")
    if found is None:
        pytest.fail("uv is needed to build and install distributions (it is a dev dependency)")
    return found


def base_python() -> str:
    """The interpreter the project's venv was made from (not the venv's own python)."""
    base = getattr(sys, "_base_executable", None)
    if base and Path(base).exists() and not Path(base).is_relative_to(sys.prefix):
        return str(base)
    v = sys.version_info
    return str(Path(sys.base_prefix) / "bin" / f"python{v.major}.{v.minor}")

"""The archive package's public names: each one lazily imported from the module that
defines it, so ``__all__``, the lazy map and the modules cannot drift apart."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import normandy_archive


def test_every_public_name_resolves_to_its_modules_own_object():
    exported = set(normandy_archive.__all__)
    assert len(exported) == len(normandy_archive.__all__)
    lazy = normandy_archive._LAZY
    eager = {"ArchiveConfigError", "ArchiveError", "NotAnArchiveError"}  # errors: imported
    assert set(lazy) | eager == exported, set(lazy) ^ (exported - eager)
    for name, module in lazy.items():
        own = importlib.import_module(f"normandy_archive.{module}")
        assert getattr(normandy_archive, name) is getattr(own, name), name
        assert name in getattr(own, "__all__", [name]), f"{module}.__all__ lacks {name}"
    settings = importlib.import_module("normandy_archive.settings")
    assert {n for n, m in lazy.items() if m == "settings"} <= set(settings.__all__)


@pytest.mark.slow
def test_importing_the_package_loads_neither_sqlite_nor_the_settings_model():
    code = (
        "import sys, normandy_archive\n"
        "print(sorted(m for m in ('sqlite3', 'normandy_archive.settings',"
        " 'normandy_archive.store') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout

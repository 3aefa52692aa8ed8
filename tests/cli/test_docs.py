"""The documentation stays true: the generated hook reference and the plugin-author guide."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from project_paths import with_project_path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "gen_hooks_doc.py"
    spec = importlib.util.spec_from_file_location("gen_hooks_doc", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_hookspec_is_in_the_hook_reference() -> None:
    from normandy_core import hookspecs

    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    names = _generator().hookspec_names()
    assert set(names) == {
        "maybe_compact",
        "options_model",
        "needs_window",
        "validate_opts",
        "before_commit",
        "after_compact",
        "on_boundary",
    }
    for specs in (hookspecs.CompactorSpec, hookspecs.HookSpec):
        for name in dir(specs):
            if hasattr(getattr(specs, name), "normandy_spec"):
                assert f"## `{name}`" in text, f"hookspec {name} is missing from docs/hooks.md"


def test_hook_reference_is_not_stale() -> None:
    current = (DOCS / "hooks.md").read_text(encoding="utf-8")
    assert current == _generator().render(), (
        "docs/hooks.md is stale: run `uv run python scripts/gen_hooks_doc.py`"
    )


def _guide_files() -> dict[str, str]:
    text = (DOCS / "plugin-guide.md").read_text(encoding="utf-8")
    files = {}
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", text, flags=re.S):
        first, _, body = block.partition("\n")
        if first.startswith("# file: "):
            files[first.removeprefix("# file: ").strip()] = body
    return files


def test_plugin_guide_distribution_installs_and_passes_its_tests(tmp_path: Path) -> None:
    tomllib = pytest.importorskip("tomllib")
    files = _guide_files()
    assert set(files) == {
        "pyproject.toml",
        "src/normandy_keep_recent/__init__.py",
        "tests/test_keep_recent.py",
    }
    for rel, body in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    project = tomllib.loads(files["pyproject.toml"])["project"]
    # Install it as pip would for an editable install: the package and its .dist-info
    # on the path, with the entry points from pyproject.toml.
    info = tmp_path / "src" / "normandy_keep_recent-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n",
        encoding="utf-8",
    )
    eps = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in table.items())
        for group, table in project["entry-points"].items()
    )
    (info / "entry_points.txt").write_text(eps, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        env={
            "PYTHONPATH": with_project_path(str(tmp_path / "src")),
            "PATH": "/usr/bin:/bin",
            # The archive hook is installed beside the example: keep it out of the home.
            "NORMANDY_ARCHIVE_PATH": str(tmp_path / "archive.sqlite3"),
            "XDG_DATA_HOME": str(tmp_path / "data"),
            "HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "10 passed" in proc.stdout  # its own 5 tests and the 5 of the kit

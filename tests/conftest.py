"""Fixtures of the core tests.

``third_party`` installs the distributions under ``tests/dists/`` for real (a wheel build
each, real dist-info and entry points) into a throwaway virtual environment once per
session; scenarios run in that environment's python as subprocesses that print JSON.

``clean_registry`` (autouse) gives every in-process test a fresh plugin registry and an
environment without the ``NORMANDY_*`` plugin lists, and removes whatever the test
registered in code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from project_paths import project_pythonpath
from venvs import base_python, uv_executable

from normandy_core.contract import plugins

DISTS = Path(__file__).parent / "dists"

#: Put before every scenario: ``emit(obj)`` prints the JSON the test reads.
_PRELUDE = """\
import json as _json


def emit(obj):
    print(_json.dumps(obj, default=str))


"""


#: The variables a scenario keeps: its archive and vocabulary cache stay out of the home.
_KEPT = ("NORMANDY_ARCHIVE_PATH", "NORMANDY_CACHE_DIR")


@dataclass(frozen=True)
class ScenarioResult:
    """What a scenario printed last (as JSON), and its stderr (where logging goes)."""

    data: Any
    stderr: str


@dataclass(frozen=True)
class ThirdPartyVenv:
    """A throwaway venv with the test distributions installed and the project importable."""

    root: Path
    python: Path
    #: The copies of the distributions that were installed, one directory each.
    sources: Path | None = None

    def run(
        self,
        code: str,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ScenarioResult:
        """Run ``code`` (dedented) with ``python -c``; return the last JSON line it emitted."""
        environ = {
            k: v
            for k, v in os.environ.items()
            if (not k.startswith("NORMANDY_") or k in _KEPT)
            and k not in ("PYTHONPATH", "VIRTUAL_ENV")
        }
        # the project as this test run imports it (the venv's own site has the rest)
        environ["PYTHONPATH"] = project_pythonpath()
        environ.update(env or {})
        proc = subprocess.run(
            [str(self.python), "-c", _PRELUDE + textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=environ,
            cwd=cwd or self.root,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"scenario exited {proc.returncode}\n--- stdout\n{proc.stdout}\n"
                f"--- stderr\n{proc.stderr}"
            )
        lines = proc.stdout.strip().splitlines()
        assert lines, f"scenario printed nothing\n--- stderr\n{proc.stderr}"
        return ScenarioResult(json.loads(lines[-1]), proc.stderr)


@pytest.fixture(scope="session")
def third_party(tmp_path_factory: pytest.TempPathFactory) -> ThirdPartyVenv:
    """Build and install every distribution under tests/dists into a fresh venv."""
    return _venv_with(tmp_path_factory, "third_party", DISTS)


@pytest.fixture(scope="session")
def guide_dists(tmp_path_factory: pytest.TempPathFactory) -> ThirdPartyVenv:
    """A venv with the example distributions of docs/plugin-guide.md, extracted from the
    page (``# file:`` blocks) and installed like the others (a wheel build each)."""
    from doc_blocks import write_guide_dists

    extracted = tmp_path_factory.mktemp("guide-pages")
    assert len(write_guide_dists(extracted)) >= 2
    return _venv_with(tmp_path_factory, "guide", extracted)


@pytest.fixture(scope="session")
def seam_dists(tmp_path_factory: pytest.TempPathFactory) -> ThirdPartyVenv:
    """A venv with the distributions under tests/dists_seam: plugins that attack the
    contract seam (misplaced hooks, a hook named like ours, exits at import)."""
    return _venv_with(tmp_path_factory, "seam", DISTS.parent / "dists_seam")


def _venv_with(
    tmp_path_factory: pytest.TempPathFactory, name: str, dist_root: Path
) -> ThirdPartyVenv:
    uv = uv_executable()
    root = tmp_path_factory.mktemp(name)
    venv = root / "venv"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    subprocess.run(
        [uv, "venv", "--quiet", "--python", base_python(), str(venv)],
        check=True,
        env=env,
        capture_output=True,
    )
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    project_site = sysconfig.get_paths()["purelib"]
    # The project's site-packages (normandy_core, pydantic, pluggy, ...) without network.
    (Path(purelib) / "_normandy_project_site.pth").write_text(
        f"import site; site.addsitedir({project_site!r})\n", encoding="utf-8"
    )
    # Copies at a fresh path, so uv never reuses a cached build of an edited distribution.
    sources = root / "dists"
    shutil.copytree(dist_root, sources)
    dists = sorted(str(p) for p in sources.iterdir() if (p / "pyproject.toml").exists())
    proc = subprocess.run(
        [uv, "pip", "install", "--python", str(python), "--no-deps", *dists],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"installing the test distributions failed:\n{proc.stderr}")
    scratch = root / "cwd"
    scratch.mkdir()
    return ThirdPartyVenv(root=scratch, python=python, sources=sources)


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh plugin registry per test, no NORMANDY_* lists, nothing left registered."""
    for var in (plugins.ENV_LOAD, plugins.ENV_DISABLE):
        monkeypatch.delenv(var, raising=False)
    compactors, hooks = map(set, plugins.registered_in_code())
    plugins.reload_plugins()
    yield
    now_compactors, now_hooks = plugins.registered_in_code()
    for name in set(now_compactors) - compactors:
        plugins.unregister_compactor(name)
    for qname in set(now_hooks) - hooks:
        plugins.unregister_hook(qname)
    plugins.reload_plugins()

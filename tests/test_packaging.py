"""The distributions as published: what each sdist and wheel holds, their metadata, and a
fresh venv made from the wheels alone.

Every distribution of the workspace is built once per module with ``uv build`` (each
sdist, then its wheel from that sdist, as an installer would). The sdists must hold
exactly the package, README, LICENSE and pyproject (hatchling adds PKG-INFO and the
.gitignore), the wheels exactly the package and their dist-info. Then
``normandy-core[all]`` is installed from the built wheels into a new venv (our
distributions from the wheel directory only; third-party ones at the versions of
``uv.lock``, from uv's cache with ``--offline``, or from the registry the first time
uv's cache lacks their index pages) and used there: ``import normandy_core``, a first
``compact()`` with ``window_manager``, and ``normandy plugins``.

Marked ``packaging`` (about 30 s); part of the normal run, ``-m "not packaging"`` skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from venvs import base_python, uv_executable

# Builds every distribution and installs the wheels into a fresh venv: slow too.
pytestmark = [pytest.mark.packaging, pytest.mark.slow]

#: The entry-point group of the plugins' settings sections (normandy_core.contract.plugins).
SETTINGS_GROUP = "normandy_core.settings"

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists())


@dataclass(frozen=True)
class Dist:
    """One distribution of the workspace: its name, version, folder and package."""

    name: str
    version: str
    root: Path
    package: Path  # the import package's folder

    @property
    def stem(self) -> str:
        """The file-name form of name and version (``normandy_core-0.1.0``)."""
        return f"{self.name.replace('-', '_')}-{self.version}"

    @property
    def package_files(self) -> set[str]:
        """The package's files, relative to the distribution's folder."""
        found = set()
        for dirpath, dirnames, filenames in os.walk(self.package):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if not f.endswith(".pyc"):
                    found.add((Path(dirpath) / f).relative_to(self.root).as_posix())
        return found


def _dist(root: Path) -> Dist:
    project: dict[str, str] = {}  # name and version of [project] (tomllib is 3.11+)
    section = ""
    for line in (root / "pyproject.toml").read_text(encoding="utf-8").splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == "[project]" and line.startswith(("name = ", "version = ")):
            key, _, value = line.partition(" = ")
            project[key] = value.strip().strip('"')
    module = project["name"].replace("-", "_")
    package = root / "src" / module if (root / "src").is_dir() else root / module
    return Dist(project["name"], project["version"], root, package)


CORE = _dist(ROOT)
DISTS = [CORE, *(_dist(p) for p in PLUGINS)]
#: Framework adapters (entry points in ``normandy_core.adapters``): installed with their
#: framework, so the ``all`` extra leaves them out.
ADAPTERS = {
    d.name
    for d in DISTS[1:]
    if "normandy_core.adapters" in (d.root / "pyproject.toml").read_text(encoding="utf-8")
}
#: Embedders (entry points in ``normandy_core.embedders``): each needs a model on disk,
#: so the ``all`` extra leaves them out too.
EMBEDDERS = {
    d.name
    for d in DISTS[1:]
    if "normandy_core.embedders" in (d.root / "pyproject.toml").read_text(encoding="utf-8")
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def _uv_run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [uv_executable(), *map(str, args)],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every sdist and wheel of the workspace, built with ``uv build``."""
    out = tmp_path_factory.mktemp("dist")
    proc = _uv_run("build", "--offline", "--all-packages", "-o", out)
    assert proc.returncode == 0, f"uv build failed:\n{proc.stderr}"
    return out


@pytest.fixture(scope="module")
def venv_python(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with ``normandy-core[all]`` installed from the built wheels."""
    root = tmp_path_factory.mktemp("venv")
    constraints = root / "constraints.txt"
    proc = _uv_run(
        "export", "--frozen", "--offline", "--no-dev", "--all-extras", "--all-packages",
        "--no-emit-workspace", "--no-hashes", "--format", "requirements-txt", "-o", constraints,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    venv = root / "venv"
    proc = _uv_run("venv", "--quiet", "--python", base_python(), venv)
    assert proc.returncode == 0, proc.stderr
    python = venv / "bin" / "python"
    wheels = root / "wheels"  # the wheels only: an sdist must not be what gets installed
    wheels.mkdir()
    for whl in built.glob("*.whl"):
        shutil.copy(whl, wheels)
    args = ["pip", "install", "--quiet", "--python", python, "--find-links", wheels]
    args += ["-c", constraints, "normandy-core[all]"]
    proc = _uv_run(*args[:2], "--offline", *args[2:], cwd=root)
    if proc.returncode != 0 and "network" in proc.stderr.lower():
        # uv's cache lacks a third-party index page (a fresh machine): ask the registry.
        proc = _uv_run(*args, cwd=root)
    assert proc.returncode == 0, f"installing the wheels failed:\n{proc.stderr}"
    return python


def _sdist(built: Path, dist: Dist) -> set[str]:
    with tarfile.open(built / f"{dist.stem}.tar.gz") as tf:
        return {m.name for m in tf.getmembers() if m.isfile()}


def _wheel(built: Path, dist: Dist) -> zipfile.ZipFile:
    return zipfile.ZipFile(built / f"{dist.stem}-py3-none-any.whl")


def _entry_points(built: Path, dist: Dist) -> set[tuple[str, str]]:
    """``(group, name)`` of every entry point in a Normandy group the wheel declares."""
    with _wheel(built, dist) as zf:
        text = zf.read(f"{dist.stem}.dist-info/entry_points.txt").decode("utf-8")
    found, group = set(), ""
    for line in text.splitlines():
        if line.startswith("["):
            group = line.strip("[]")
        elif "=" in line and group.startswith("normandy_core."):
            found.add((group, line.split("=", 1)[0].strip()))
    return found


def _metadata(built: Path, dist: Dist) -> tuple[dict[str, list[str]], str]:
    with _wheel(built, dist) as zf:
        text = zf.read(f"{dist.stem}.dist-info/METADATA").decode("utf-8")
    msg = Parser().parsestr(text)
    fields: dict[str, list[str]] = {}
    for key, value in msg.items():
        fields.setdefault(key, []).append(value)
    return fields, str(msg.get_payload())


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d.name)
def test_each_sdist_holds_exactly_its_package_readme_license_and_pyproject(built, dist):
    files = {"README.md", "LICENSE", "pyproject.toml", "PKG-INFO", ".gitignore"}
    files |= dist.package_files
    assert _sdist(built, dist) == {f"{dist.stem}/{f}" for f in files}
    assert any(f.endswith("/py.typed") for f in files)


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d.name)
def test_each_wheel_holds_exactly_its_package_and_its_dist_info(built, dist):
    prefix = len(dist.package.parent.relative_to(dist.root).parts)
    package = {"/".join(Path(f).parts[prefix:]) for f in dist.package_files}
    info = f"{dist.stem}.dist-info"
    expected = package | {
        f"{info}/{f}" for f in ("METADATA", "WHEEL", "RECORD", "entry_points.txt")
    }
    expected.add(f"{info}/licenses/LICENSE")
    with _wheel(built, dist) as zf:
        assert set(zf.namelist()) == expected
        assert zf.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d.name)
def test_every_distribution_describes_itself_with_its_readme(built, dist):
    fields, body = _metadata(built, dist)
    assert fields["Description-Content-Type"] == ["text/markdown"]
    assert fields["License-Expression"] == ["Apache-2.0"]
    readme = (dist.root / "README.md").read_text(encoding="utf-8")
    assert body.strip() == readme.strip()
    if dist is not CORE:
        assert body.startswith(f"# {dist.name}\n")
        for group, name in _entry_points(built, dist):  # what it registers, and where
            assert f"`{name}`" in body and f"`{group}`" in body


@pytest.mark.parametrize("dist", DISTS[1:], ids=lambda d: d.name)
def test_plugin_wheels_require_a_bounded_normandy_core_that_this_core_satisfies(built, dist):
    fields, _ = _metadata(built, dist)
    core = [Requirement(r) for r in fields["Requires-Dist"] if r.startswith("normandy-core")]
    assert len(core) == 1
    spec = core[0].specifier
    version = Version(CORE.version)
    assert version in spec
    next_breaking = (
        Version(f"{version.major + 1}.0")
        if version.major
        else Version(f"0.{version.minor + 1}")  # 0.x: a minor release may break
    )
    assert next_breaking not in spec
    assert any(s.operator == "<" for s in spec)


def test_the_all_extra_installs_every_first_party_plugin_but_the_framework_adapters(built):
    fields, _ = _metadata(built, CORE)
    assert "all" in fields["Provides-Extra"]
    extra = [
        Requirement(r)
        for r in fields["Requires-Dist"]
        if Requirement(r).marker is not None
        and Requirement(r).marker.evaluate({"extra": "all"})
        and not Requirement(r).marker.evaluate({"extra": ""})
    ]
    assert sorted(r.name for r in extra) == sorted(
        d.name for d in DISTS[1:] if d.name not in ADAPTERS | EMBEDDERS
    )
    for r in extra:
        plugin = next(d for d in DISTS if d.name == r.name)
        assert Version(plugin.version) in r.specifier
        assert any(s.operator == "<" for s in r.specifier)


def test_a_fresh_venv_from_the_wheels_imports_compacts_and_lists_the_plugins(
    venv_python, built, tmp_path
):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NORMANDY_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env["NORMANDY_ARCHIVE_PATH"] = str(tmp_path / "archive.sqlite3")
    env["NORMANDY_CACHE_DIR"] = str(tmp_path / "cache")
    code = """
import json, sys, sysconfig
import normandy_core
import normandy_core.contract.settings
msgs = [{"role": "system", "content": "You are a coding agent."}]
for i in range(8):
    msgs.append({"role": "user", "content": f"step {i}: read file_{i}.py " * 20})
    msgs.append({"role": "assistant", "content": None, "tool_calls": [{
        "id": f"c{i}", "type": "function",
        "function": {"name": "read", "arguments": '{"path": "f.py"}'}}]})
    msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x = 1\\n" * 300})
    msgs.append({"role": "assistant", "content": f"done {i}"})
r = normandy_core.compact(msgs, compactor="window_manager", window=6000)
kept = r.messages
ids = {c["id"] for m in kept if m.get("tool_calls") for c in m["tool_calls"]}
print(json.dumps({
    "file": normandy_core.__file__,
    "site": sysconfig.get_paths()["purelib"],
    "compacted": r.compacted,
    "before": r.tokens_before,
    "after": r.tokens_after,
    "dropped": len(r.dropped),
    "kept": len(kept),
    "orphans": [m["tool_call_id"] for m in kept if m["role"] == "tool"
                and m["tool_call_id"] not in ids],
    "archived": (r.note("archive") or {}).get("entries"),
    "sections": sorted(normandy_core.contract.settings.settings_sections()),
}))
"""
    proc = subprocess.run(
        [str(venv_python), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).is_relative_to(out["site"])  # the wheel's, not the checkout's
    assert out["compacted"] is True
    assert out["before"] > 6000 - 4096 >= out["after"] > 0  # the default reserved_tokens
    assert out["dropped"] > 0 and out["kept"] < 33 and out["orphans"] == []
    assert out["archived"] == out["dropped"]
    sections = {
        name
        for dist in DISTS
        if dist.name not in ADAPTERS
        for group, name in _entry_points(built, dist)
        if group == SETTINGS_GROUP
    }
    assert out["sections"] == sorted(sections) == ["archive", "recall"]  # declared, and load

    normandy = venv_python.parent / "normandy"
    proc = subprocess.run(
        [str(normandy), "plugins", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    listed = {
        (p["group"], p["name"], p["distribution"], p["version"], p["status"])
        for p in json.loads(proc.stdout)
    }
    expected = {
        (group, name, dist.name, dist.version, "loaded")
        for dist in DISTS
        if dist.name not in ADAPTERS | EMBEDDERS  # not in the all extra
        for group, name in _entry_points(built, dist)
        if group != SETTINGS_GROUP  # a settings section is no plugin to load: checked above
    }
    assert listed == expected
    assert {g for g, *_ in expected} == {
        "normandy_core.compactors",
        "normandy_core.hooks",
        "normandy_core.commands",
    }

"""Every install command of the documentation, run as written in a fresh virtual environment.

``make wheels`` builds every distribution's wheel once, into a temporary folder. Then each
``uv pip install`` line of README.md and docs/ (tests/install_commands.py) runs, with
``bash`` as a reader's shell runs it, in a venv made for it alone and activated as
``source venv/bin/activate`` does, from a folder laid out as the pages assume: ``dist/``
holds the wheels, ``normandy/`` is the checkout. The repository's git URL is the only
thing changed: it points at this checkout's committed state (``git+file://``), so no
host but the package registry is reached, where third-party distributions come from.

After its install, each venv runs ``normandy plugins`` (every plugin must load) and
what the page that gives the command promises: an adapter's or the OpenTelemetry page's
first example (read from the Markdown and run by tests/docs_runner.py, as the docs tests
run it), the install page's first compaction, and the plugin guide's steps one by one
after the install page's first command.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from doc_blocks import ROOT, Block, blocks, write_guide_dists
from install_commands import UV_INSTALL, InstallBlock, install_blocks
from venvs import base_python, uv_executable

# Builds wheels, makes venvs and installs into them: slow.
pytestmark = pytest.mark.slow

INSTALL_PAGE = "docs/install.md"
GUIDE_PAGE = "docs/plugin-guide.md"


def _repository() -> str:
    """The repository's URL, as the pages give it: mkdocs.yml's ``repo_url``."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    m = re.search(r"^repo_url: (\S+)$", text, flags=re.M)
    assert m, "mkdocs.yml has no repo_url"
    return m.group(1)


REPOSITORY = _repository()


@dataclass(frozen=True)
class Shell:
    """A fresh venv, activated, and the folder a reader runs the pages' commands from."""

    venv: Path
    cwd: Path
    env: dict[str, str]

    def run(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run one line with bash, as typed at an activated prompt."""
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, command: str) -> str:
        """Run ``command``; fail with its output unless it exits 0; its stdout."""
        proc = self.run(command)
        assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{_out(proc)}"
        return proc.stdout


def _out(proc: subprocess.CompletedProcess[str]) -> str:
    return f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every distribution's wheel, built by ``make wheels`` into a temporary folder."""
    out = tmp_path_factory.mktemp("wheels")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    proc = subprocess.run(
        ["make", "-C", str(ROOT), "wheels", f"DIST={out}", f"UV={uv_executable()}", "UV_DEP="],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, _out(proc)
    return out


def _activated(venv: Path, tools: Path) -> dict[str, str]:
    """The environment of a prompt where ``venv`` is active: its ``bin`` first on
    ``PATH``, then uv alone (the project's venv, which holds normandy and pytest, is
    taken off), no ``NORMANDY_*`` setting, the archive and data in the venv's folder."""
    project_bins = {str(Path(sys.executable).parent), str(Path(sys.prefix) / "bin")}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p not in project_bins]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NORMANDY_")
        and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    env.update(
        {
            "VIRTUAL_ENV": str(venv),
            "PATH": os.pathsep.join([str(venv / "bin"), str(tools), *path]),
            "UV_PYTHON_DOWNLOADS": "never",
            "NORMANDY_ARCHIVE_PATH": str(venv.parent / "archive.sqlite3"),
            "NORMANDY_CACHE_DIR": str(venv.parent / "cache"),
            "XDG_DATA_HOME": str(venv.parent / "data"),
        }
    )
    return env


@pytest.fixture
def shell(wheels: Path, tmp_path: Path) -> Shell:
    """A new venv of the project's base python, nothing installed, and a folder holding
    ``dist/`` (the wheels) and ``normandy/`` (this checkout)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "uv").symlink_to(uv_executable())
    venv = tmp_path / "venv"
    proc = subprocess.run(
        [str(tools / "uv"), "venv", "--quiet", "--python", base_python(), str(venv)],
        env=_activated(venv, tools),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, _out(proc)
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "dist").symlink_to(wheels, target_is_directory=True)
    (cwd / "normandy").symlink_to(ROOT, target_is_directory=True)
    return Shell(venv, cwd, _activated(venv, tools))


def _as_run(command: str) -> str:
    """``command`` with the repository's git URL pointing at this checkout's commits."""
    return command.replace(f"git+{REPOSITORY}", f"git+file://{ROOT}")


def _install(shell: Shell, command: str) -> None:
    """Run an install command of the pages, then check every plugin it brought loads."""
    shell.ok(_as_run(command))
    rows = json.loads(shell.ok("normandy plugins --json"))
    broken = [(r["name"], r["error"]) for r in rows if r["status"] != "loaded"]
    assert broken == [], f"`{command}` installed plugins that do not load: {broken}"


def _first_python_block(page: str) -> Block:
    return next(b for b in blocks(ROOT / page) if b.lang == "python" and b.file is None)


def _run_example(shell: Shell, page: str) -> str:
    """Run the page's first Python block in the venv, as the docs tests run it; its stdout."""
    block = _first_python_block(page)
    payload = [
        {"where": block.where, "path": page, "line": block.line, "code": block.code}
        | {"given": block.given, "needs": block.markers.get("needs")}
    ]
    assert block.given == [], f"{block.where}: a first example must run on its own"
    (shell.venv.parent / "blocks.json").write_text(json.dumps(payload), encoding="utf-8")
    runner = ROOT / "tests" / "docs_runner.py"
    report = shell.venv.parent / "report.json"
    proc = shell.run(f"python {runner} {shell.venv.parent / 'blocks.json'} {report}")
    result = json.loads(report.read_text(encoding="utf-8")) if report.exists() else {}
    assert proc.returncode == 0, f"{block.where} failed:\n{result.get('error')}\n{_out(proc)}"
    return proc.stdout


_COMPACTION = re.compile(
    r"^(\d+) -> (\d+) tokens, (\d+) (?:messages|items|contents) removed, "
    r"(\d+) entries to the hooks$",
    flags=re.M,
)


def _check_adapter(shell: Shell, out: str) -> None:
    """Compactions were reported, and what they dropped is in the archive."""
    compactions = [tuple(map(int, m)) for m in _COMPACTION.findall(out)]
    assert compactions, f"no compaction printed:\n{out}"
    assert all(before > after and dropped > 0 for before, after, _, dropped in compactions)
    # Run first in its venv, so the archive holds this example's entries only; an entry
    # dropped again (a marker of an earlier compaction, say) is stored once.
    archived = shell.ok("normandy archive list --json --limit 100000").splitlines()
    assert 0 < len(archived) <= sum(dropped for *_, dropped in compactions)


def _check_otel(shell: Shell, out: str) -> None:
    rows = json.loads(shell.ok("normandy plugins --json"))
    assert ("otel", "loaded") in {(r["name"], r["status"]) for r in rows}


def _check_first_compaction(shell: Shell, out: str) -> None:
    m = re.search(r"^(\d+) -> (\d+) tokens, (\d+) dropped$", out, flags=re.M)
    assert m and int(m.group(3)) > 0, out
    assert f"archived to {shell.env['NORMANDY_ARCHIVE_PATH']}" in out


#: What runs after a page's install command, and what it must show.
FOLLOW_UPS: dict[str, tuple[str, Callable[[Shell, str], None]]] = {
    "docs/plugins/langchain.md": ("docs/plugins/langchain.md", _check_adapter),
    "docs/plugins/pydantic-ai.md": ("docs/plugins/pydantic-ai.md", _check_adapter),
    "docs/plugins/openai-agents.md": ("docs/plugins/openai-agents.md", _check_adapter),
    "docs/plugins/strands.md": ("docs/plugins/strands.md", _check_adapter),
    "docs/plugins/llamaindex.md": ("docs/plugins/llamaindex.md", _check_adapter),
    "docs/plugins/adk.md": ("docs/plugins/adk.md", _check_adapter),
    "docs/plugins/otel.md": ("docs/plugins/otel.md", _check_otel),
    INSTALL_PAGE: (INSTALL_PAGE, _check_first_compaction),
    "docs/index.md": (INSTALL_PAGE, _check_first_compaction),
    "README.md": (INSTALL_PAGE, _check_first_compaction),
}


def _commands() -> dict[str, list[str]]:
    """Each install command of the pages (the plugin guide's apart) -> the pages giving it."""
    found: dict[str, list[str]] = {}
    for block in install_blocks():
        if block.page != GUIDE_PAGE:
            for command in block.installs:
                if command.startswith(UV_INSTALL):  # the others: test_install_docs.NOT_YET
                    found.setdefault(command, []).append(block.page)
    return found


COMMANDS = _commands()


def test_make_wheels_builds_one_wheel_per_distribution(wheels: Path) -> None:
    dists = [ROOT, *(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))]
    assert len(list(wheels.glob("*.whl"))) == len(dists) >= 10
    assert {w.name.split("-")[0] for w in wheels.glob("*.whl")} == {
        d.name.replace("-", "_") if d != ROOT else "normandy_core" for d in dists
    }


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=lambda c: c[len(UV_INSTALL) :][:60])
def test_the_install_command_installs_and_what_its_page_shows_runs(
    shell: Shell, command: str
) -> None:
    _install(shell, command)
    follow_ups = dict(FOLLOW_UPS[p] for p in COMMANDS[command] if p in FOLLOW_UPS)
    # The page's own example first, then the install page's (a command both give).
    for page in sorted(follow_ups, key=lambda p: p == INSTALL_PAGE):
        follow_ups[page](shell, _run_example(shell, page))


def test_the_plugin_guide_steps_run_after_the_install_page(shell: Shell) -> None:
    """The install page's first command, then each command of the guide's install blocks
    as written: the examples install with their ``test`` extras, list, compact, and pass
    their own tests with the pytest those extras brought."""
    _install(shell, install_blocks([ROOT / INSTALL_PAGE])[0].installs[0])
    write_guide_dists(shell.cwd)
    chat = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(30):
        chat += [{"role": "user", "content": f"question {i} " + "q" * 400}]
        chat += [{"role": "assistant", "content": f"answer {i} " + "a" * 400}]
    (shell.cwd / "chat.json").write_text(json.dumps(chat), encoding="utf-8")  # the reader's
    guide: list[InstallBlock] = install_blocks([ROOT / GUIDE_PAGE])
    assert len(guide) == 2
    for block in guide:
        for command in block.lines:
            out = shell.ok(command)
            if command.startswith("pytest "):
                assert re.search(r"\b\d+ passed\b", out), out
                assert shutil.which("pytest", path=shell.env["PATH"]) == str(
                    shell.venv / "bin" / "pytest"
                )

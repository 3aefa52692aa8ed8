"""The contract seam with really installed distributions (tests/dists_seam).

Misplaced hooks refused at load, a hook named like ours loaded beside it and reported as
a conflict, group-qualified allow-lists, SystemExit and KeyboardInterrupt from plugins,
and ``AgentConfig()`` with nothing but ``normandy-core`` installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_counts import IMPORT_EXITS

# Slow: scenarios run in the seam venv (wheels built and installed), as subprocesses.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

_MESSAGES = """
        msgs = []
        for i in range(30):
            msgs.append({"role": "user", "content": f"question {i} " + "q" * 400})
            msgs.append({"role": "assistant", "content": f"answer {i} " + "a" * 400})
"""


def test_a_misplaced_hook_is_refused_naming_the_kind_that_implements_it(seam_dists):
    r = seam_dists.run(
        """
        from normandy_core import list_plugins, resolve_compactor, PluginLoadError
        try:
            resolve_compactor("with_after_compact")
            err = None
        except PluginLoadError as exc:
            err = str(exc)
        rows = {r.name: (r.status, r.error) for r in list_plugins()}
        emit({"compactor": err, "hook": rows["with_maybe_compact"]})
        """
    )
    assert "compactor 'with_after_compact'" in r.data["compactor"]
    assert "normandy-seam-misplaced 0.2.0" in r.data["compactor"]
    assert "'after_compact', which only a hook plugin implements" in r.data["compactor"]
    status, error = r.data["hook"]
    assert status == "error"
    assert "'maybe_compact', which only a compactor implements" in error


def test_a_hook_named_like_ours_is_loaded_beside_it_and_reported(seam_dists, tmp_path):
    log = tmp_path / "imposter.jsonl"
    archive = tmp_path / "archive.sqlite3"
    env = {"NORMANDY_TEST_IMPOSTER_LOG": str(log), "NORMANDY_ARCHIVE_PATH": str(archive)}
    r = seam_dists.run(
        _MESSAGES
        + """
        from normandy_core import compact, list_plugins
        result = compact(msgs, model="gpt-4o", window=8000,
                         opts={"reserved_tokens": 500})
        rows = [(r.name, r.distribution, r.status) for r in list_plugins()
                if r.kind == "hook" and r.name == "archive"]
        emit({"dropped": [e.id for e in result.dropped], "rows": rows,
              "errors": result.meta.get("hook_errors")})
        """,
        env=env,
    )
    dropped = r.data["dropped"]
    assert len(dropped) > 20 and r.data["errors"] is None
    assert sorted(row[2] for row in r.data["rows"]) == ["conflict", "conflict"]
    seen = [line for line in log.read_text().splitlines() if "imposter-archive" in line]
    assert len(seen) == 1 and all(i in seen[0] for i in dropped)
    assert archive.exists()  # our archive ran too: nothing was silently disabled
    proc = subprocess.run(
        [str(seam_dists.python), "-m", "normandy_core.app.cli", "plugins"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    assert proc.returncode != 0
    assert proc.stdout.count("registered by several distributions") == 1


def test_a_bare_allow_list_name_never_reaches_into_another_group(seam_dists, tmp_path):
    log = tmp_path / "imposter.jsonl"
    code = (
        _MESSAGES
        + """
        from normandy_core import AgentConfig, PluginDisabledError, compact
        try:
            compact(msgs, model="gpt-4o", window=8000, opts={"reserved_tokens": 500})
            emit({"refused": None})
        except PluginDisabledError as exc:
            emit({"refused": str(exc)})
        """
    )
    r = seam_dists.run(
        code,
        env={"NORMANDY_LOAD_PLUGINS": "window_manager", "NORMANDY_TEST_IMPOSTER_LOG": str(log)},
    )
    assert "ambiguous" in r.data["refused"] and "compactors:window_manager" in r.data["refused"]
    assert not log.exists()
    r = seam_dists.run(
        code,
        env={
            "NORMANDY_LOAD_PLUGINS": "compactors:window_manager",
            "NORMANDY_TEST_IMPOSTER_LOG": str(log),
        },
    )
    assert r.data["refused"] is None
    assert not log.exists()  # the hook named window_manager stayed out


@pytest.mark.parametrize("name", IMPORT_EXITS)
def test_base_exceptions_at_import_are_named_not_fatal(seam_dists, name):
    kind = {"exits_at_import": "SystemExit", "interrupts_at_import": "KeyboardInterrupt"}[name]
    r = seam_dists.run(
        f"""
        import sys
        sys.argv = ["agent"]
        from normandy_core import compact, list_plugins, PluginLoadError
        try:
            compact([{{"role": "user", "content": "hi"}}], compactor={name!r})
            err = None
        except PluginLoadError as exc:
            err = str(exc)
        row = [r for r in list_plugins(load=True) if r.name == {name!r}][0]
        emit({{"err": err, "status": row.status}})
        """
    )
    assert f"compactor {name!r}" in r.data["err"] and "normandy-seam-exits 0.2.0" in r.data["err"]
    assert f"failed to import: {kind}" in r.data["err"]
    assert r.data["status"] == "error"
    proc = subprocess.run(
        [str(seam_dists.python), "-m", "normandy_core.app.cli", "plugins"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert name in proc.stdout and kind in proc.stdout


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
def test_base_exceptions_mid_compaction_leave_the_memory_as_it_was(seam_dists, kind):
    r = seam_dists.run(
        """
        from normandy_core import AgentConfig, AgentMemory, run_compaction
        mem = AgentMemory()
        for i in range(4):
            mem.add_message("user" if i % 2 == 0 else "assistant", f"m{i}")
        acc = AgentConfig(compactor="exits_midway").with_memory(mem)
        out, meta = run_compaction(acc, mid_round=True)
        emit({"same": out is acc, "n": len(acc.memory), "error": meta["error"]})
        """,
        env={"NORMANDY_TEST_EXIT_KIND": kind},
    )
    assert r.data["same"] and r.data["n"] == 4
    expected = "SystemExit: 3" if kind == "exit" else "KeyboardInterrupt: raised by the plugin"
    assert expected in r.data["error"]


def test_agent_config_works_with_only_normandy_core_installed(tmp_path):
    """``pip install normandy-core`` then ``AgentConfig()``: noop ships with the core."""
    import shutil

    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv is not None
    base = getattr(sys, "_base_executable", None) or sys.executable
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    subprocess.run(
        [uv, "venv", "--quiet", "--python", base, str(venv)],
        check=True,
        env=env,
        capture_output=True,
    )
    python = venv / "bin" / "python"
    proc = subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(python), str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as md\n"
            "from normandy_core import AgentConfig, list_plugins, run_compaction\n"
            "acc = AgentConfig()\n"
            "acc.memory.add_message('user', 'hi')\n"
            "print(run_compaction(acc, mid_round=False).meta)\n"
            "print(sorted(d.metadata['Name'] for d in md.distributions()"
            " if d.metadata['Name'].startswith('normandy')))\n"
            "print([(r.name, r.distribution) for r in list_plugins()])",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "{'compacted': False}"
    assert lines[1] == "['normandy-core']"
    assert lines[2] == "[('noop', 'normandy-core')]"

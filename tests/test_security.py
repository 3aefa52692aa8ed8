"""NORMANDY_LOAD_PLUGINS everywhere a plugin can be reached; nothing loaded from the cwd.

test_third_party.py covers the allow- and deny-lists for ``resolve_compactor``,
``AgentConfig`` and ``list_plugins``; here the other entry points: ``compact()``,
the hooks of a real ``run_turn``, ``normandy compact`` and ``normandy plugins``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from reliability_counts import CWD_INVOCATIONS, LOAD_PLUGINS_PATHS

# Slow: scenarios run in the third-party venv and the console script in subprocesses.
pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from conftest import ThirdPartyVenv

BIN = Path(sys.executable).parent / "normandy"


def test_load_plugins_is_honoured_everywhere(third_party: ThirdPartyVenv, tmp_path):
    hook_log = tmp_path / "hooks.jsonl"
    archive = tmp_path / "archive.sqlite3"
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{"role": "user", "content": f"m{i}"} for i in range(6)]))
    out = third_party.run(
        f"""
import subprocess, sys
from normandy_core import AgentConfig, PluginDisabledError, TextBlock, compact
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.turn import run_turn

seen = {{}}
try:
    AgentConfig(compactor="window_manager", compactor_opts={{"context_window": 9000}})
except PluginDisabledError as exc:
    seen["AgentConfig"] = str(exc)
try:
    compact([{{"role": "user", "content": "hi"}}], compactor="window_manager", window=9000)
except PluginDisabledError as exc:
    seen["compact"] = str(exc)
# an allowed compactor compacts in a real turn, but no hook plugin outside the list runs
acc = AgentConfig(compactor="tail", compactor_opts={{"keep": 1}})
for i in range(4):
    acc.memory.add_message("user" if i % 2 == 0 else "assistant", f"m{{i}}")
acc.memory.add_message("assistant", "ok")
client = ScriptedClient([ModelReply(content=(TextBlock(text="done"),))])
result = run_turn(acc, "go on", client=client)
seen["run_turn"] = [b["meta"]["compacted"] for b in result.events_of("boundary")]

def cli(*args):
    p = subprocess.run([sys.executable, "-m", "normandy_core.app.cli", *args],
                       capture_output=True, text=True, timeout=60)
    return [p.returncode, p.stdout, p.stderr]

seen["normandy compact"] = cli("compact", {str(src)!r}, "--compactor", "window_manager",
                               "--window", "9000")
seen["normandy compact tail"] = cli("compact", {str(src)!r}, "--compactor", "tail")
seen["normandy plugins"] = cli("plugins", "--json")
emit(seen)
""",
        env={
            "NORMANDY_LOAD_PLUGINS": "tail",
            "NORMANDY_TEST_HOOK_LOG": str(hook_log),
            "NORMANDY_ARCHIVE_PATH": str(archive),
        },
    )
    d = out.data
    assert set(LOAD_PLUGINS_PATHS) <= set(d)
    refusal = (
        "compactor 'window_manager' (group normandy_core.compactors) from "
        "normandy-window-manager 0.1.0 is not in NORMANDY_LOAD_PLUGINS"
    )
    assert d["AgentConfig"] == refusal
    assert d["compact"] == refusal
    assert d["run_turn"] == [True]  # the allowed compactor ran...
    assert not hook_log.exists() and not archive.exists()  # ...and no hook plugin did
    code, stdout, stderr = d["normandy compact"]
    assert code == 3 and stdout == "" and refusal in stderr
    code, stdout, stderr = d["normandy compact tail"]
    assert code == 0 and len(json.loads(stdout)) < 6, stderr
    code, stdout, _ = d["normandy plugins"]
    rows = {(r["kind"], r["name"]): r["status"] for r in json.loads(stdout)}
    assert rows[("compactor", "tail")] == "loaded"
    assert rows[("compactor", "window_manager")] == "disabled"
    assert rows[("compactor", "faulty_raises")] == "disabled"
    assert rows[("hook", "recorder")] == "disabled"
    assert rows[("hook", "archive")] == "disabled"
    assert rows[("hook", "broken_hook")] == "disabled"  # never imported
    assert "broken_hook" not in out.stderr


def test_a_dist_info_in_the_current_directory_is_ignored(tmp_path):
    marker = tmp_path / "rogue-code-ran"
    info = tmp_path / "rogue_plugin-6.6.6.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rogue-plugin\nVersion: 6.6.6\n")
    (info / "entry_points.txt").write_text(
        "[normandy_core.compactors]\nrogue = rogue_mod\nnoop = rogue_mod\n\n"
        "[normandy_core.hooks]\nrogue_hook = rogue_mod\n"
    )
    (tmp_path / "rogue_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NORMANDY_LOAD")}
    commands = {
        "console script": [str(BIN)],
        "python -m": [sys.executable, "-m", "normandy_core.app.cli"],
    }
    args = {
        "listing": ["plugins", "--json"],
        "rogue": ["compact", "in.json", "--compactor", "rogue"],
        "noop": ["compact", "in.json", "--compactor", "noop"],
    }
    procs = {
        (how, what): subprocess.Popen(
            [*cmd, *argv],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for how, cmd in commands.items()
        for what, argv in args.items()
    }
    done = {key: (p.communicate(timeout=60), p.returncode) for key, p in procs.items()}
    runs: dict[str, list[subprocess.CompletedProcess[str]]] = {}
    for (how, what), ((out, err), code) in done.items():
        runs.setdefault(how, []).append(subprocess.CompletedProcess(what, code, out, err))
    assert tuple(runs) == CWD_INVOCATIONS
    for how, (listing, rogue, noop) in runs.items():
        assert listing.returncode == 0, (how, listing.stderr)
        rows = json.loads(listing.stdout)
        assert not any("rogue" in r["name"] for r in rows), how
        noop_rows = [r for r in rows if r["name"] == "noop"]
        assert [r["distribution"] for r in noop_rows] == ["normandy-core"], how
        assert rogue.returncode == 3 and "unknown compactor 'rogue'" in rogue.stderr, how
        assert noop.returncode == 0 and json.loads(noop.stdout) == json.loads(src.read_text())
    assert not marker.exists()  # the rogue module was never imported

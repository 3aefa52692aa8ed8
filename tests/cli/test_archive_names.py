"""The archive hook and the ``normandy archive`` command are disabled by separate names
(issue 15): ``archive`` is the hook, ``archive-cli`` the command, both entry points of the
installed ``normandy-archive`` distribution, run through the installed ``normandy`` script."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import run_cli, write_json

# Slow: every test runs the installed console script in a subprocess.
pytestmark = pytest.mark.slow


def plugin_rows(env: dict[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    r = run_cli("plugins", "--json", env=env)
    return {(row["kind"], row["name"]): row for row in json.loads(r.out)}


def compact_and_archive(tmp_path: Path, messages: Any, env: dict[str, str]) -> Any:
    src = write_json(tmp_path / "in.json", messages)
    return run_cli(
        "compact", str(src), "-o", str(tmp_path / "out.json"), "--window", "20000", env=env
    )


def test_disabling_archive_stops_the_hook_and_keeps_the_command(
    tmp_path: Path, openai_messages: Any
) -> None:
    earlier = tmp_path / "earlier.sqlite3"
    r = compact_and_archive(tmp_path, openai_messages, {"NORMANDY_ARCHIVE_PATH": str(earlier)})
    assert r.code == 0 and "dropped entries archived to" in r.err, r

    path = tmp_path / "a.sqlite3"
    env = {"NORMANDY_ARCHIVE_PATH": str(path), "NORMANDY_DISABLE_PLUGINS": "archive"}
    r = compact_and_archive(tmp_path, openai_messages, env)
    assert r.code == 0 and "entries dropped" in r.err, r
    assert "archived" not in r.err and not path.exists()  # the hook did not run
    # ...and the command still reads what was archived before
    r = run_cli("archive", "list", "--path", str(earlier), env=env)
    assert r.code == 0, r
    assert r.out.splitlines()[0].split()[:3] == ["SEQ", "ARCHIVED", "SESSION"]
    assert len(r.out.splitlines()) > 1
    rows = plugin_rows(env)
    assert rows[("hook", "archive")]["status"] == "disabled"
    assert rows[("command", "archive-cli")]["status"] == "loaded"


def test_disabling_archive_cli_removes_the_command_and_keeps_the_hook(
    tmp_path: Path, openai_messages: Any
) -> None:
    path = tmp_path / "a.sqlite3"
    env = {"NORMANDY_ARCHIVE_PATH": str(path), "NORMANDY_DISABLE_PLUGINS": "archive-cli"}
    r = run_cli("archive", "list", "--path", str(path), env=env)
    assert r.code == 2 and "invalid choice: 'archive'" in r.err, r
    r = compact_and_archive(tmp_path, openai_messages, env)
    assert r.code == 0 and "dropped entries archived to" in r.err, r  # the hook ran
    assert path.exists()
    rows = plugin_rows(env)
    assert rows[("hook", "archive")]["status"] == "loaded"
    assert rows[("command", "archive-cli")]["status"] == "disabled"

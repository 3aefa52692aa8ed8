"""The command line with configuration without code: ``normandy compact`` and ``normandy
demo`` take their compactor settings from NORMANDY_COMPACTOR(_OPTS), normandy.toml or
pyproject.toml [tool.normandy] (found from the working directory) unless given as
options, and ``normandy config`` shows what applies and where it comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from normandy_core.contract.settings import ENV_COMPACTOR, ENV_CONFIG, ENV_OPTS
from tests.cli.conftest import run_cli, write_json

# Slow: every test runs the installed console script in a subprocess.
pytestmark = pytest.mark.slow


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The console script's working directory (a temporary one), nothing configured."""
    for var in (ENV_CONFIG, ENV_COMPACTOR, ENV_OPTS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_compact_takes_the_settings_file(here: Path, openai_messages: Any) -> None:
    toml = here / "normandy.toml"
    toml.write_text(
        'compactor = "window_manager"\nwindow = 20000\n\n[opts]\nstrategy = "sliding_window"\n'
        "keep_last_turns = 2\n",
        encoding="utf-8",
    )
    write_json(here / "chat.json", openai_messages)
    r = run_cli("compact", "chat.json", "-o", "out.json", "--meta", "meta.json")
    assert r.code == 0, r
    assert f"settings: compactor from {toml}: line 1: key 'compactor'" in r.err
    assert "(strategy sliding_window)" in r.err
    meta = json.loads((here / "meta.json").read_text())
    assert meta["compacted"] and meta["tokens_after"] <= 20_000
    # options given on the command line replace the configured ones
    r = run_cli("compact", "chat.json", "-o", "out.json", "--opt", "strategy=oldest_first")
    assert r.code == 0 and "(strategy oldest_first)" in r.err, r


def test_compact_takes_the_environment_over_pyproject(
    here: Path, openai_messages: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (here / "pyproject.toml").write_text(
        '[tool.normandy]\ncompactor = "window_manager"\nwindow = 20000\n', encoding="utf-8"
    )
    write_json(here / "chat.json", openai_messages)
    r = run_cli("compact", "chat.json", "-o", "out.json", env={ENV_COMPACTOR: "noop"})
    assert r.code == 0, r
    assert "not compacted" in r.err and f"compactor from {ENV_COMPACTOR}" in r.err
    out = json.loads((here / "out.json").read_text())
    assert out == openai_messages
    # --compactor wins over both
    r = run_cli(
        "compact",
        "chat.json",
        "-o",
        "out.json",
        "--compactor",
        "window_manager",
        env={ENV_COMPACTOR: "noop"},
    )
    assert r.code == 0 and "(strategy oldest_first)" in r.err, r


def test_a_bad_setting_exits_2_naming_file_and_key(here: Path, openai_messages: Any) -> None:
    write_json(here / "chat.json", openai_messages)
    toml = here / "normandy.toml"
    toml.write_text('compactor = "window_manager"\n[opts]\ntrigger = 2\n', encoding="utf-8")
    r = run_cli("compact", "chat.json")
    assert r.code == 2, r
    assert r.err.startswith(
        f"normandy compact: {toml}: line 2: key 'opts': compactor 'window_manager' refused "
        "its options:\n  option 'trigger': "
    )
    toml.write_text("[opts\n", encoding="utf-8")
    r = run_cli("compact", "chat.json")
    assert r.code == 2 and f"{toml}: line 1, column " in r.err and "not valid TOML" in r.err, r
    r = run_cli("compact", "chat.json", env={ENV_OPTS: "[]"})
    assert r.code == 2, r
    assert f"normandy compact: {ENV_OPTS}: expected a JSON object" in r.err


def test_an_unknown_configured_compactor_exits_3_naming_its_source(here: Path) -> None:
    r = run_cli("config", env={ENV_COMPACTOR: "window_manger"})
    assert r.code == 3, r
    assert f"normandy config: {ENV_COMPACTOR}: unknown compactor 'window_manger'; did you" in r.err


def test_config_shows_each_setting_and_its_source(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = here / "pyproject.toml"
    project.write_text(
        '[project]\nname = "app"\n\n[tool.normandy]\nmodel = "gpt-4o"\n', encoding="utf-8"
    )
    (here / "src").mkdir()
    monkeypatch.chdir(here / "src")
    r = run_cli("config", "--json", env={ENV_OPTS: '{"target": 0.5}'})
    assert r.code == 0, r
    data = json.loads(r.out)
    rows = {row["key"]: (row["value"], row["from"]) for row in data["settings"]}
    assert rows == {
        "compactor": ("window_manager", "default"),
        "opts": ({"target": 0.5}, ENV_OPTS),
        "model": ("gpt-4o", f"{project}: line 5: [tool.normandy] key 'model'"),
        "window": (None, "not set"),
        "timeout": (None, "not set"),
        "survival": (None, "not set"),
    }
    assert data["files"] == [str(project)]
    r = run_cli("config")
    assert r.code == 0, r
    assert "KEY" in r.out and "FROM" in r.out and f"files read: {project}" in r.out
    r = run_cli("config", env={ENV_CONFIG: "off"})
    assert r.code == 0 and f"no settings file read ({ENV_CONFIG}=off)" in r.out, r


def test_demo_takes_the_configured_compactor_and_options(here: Path) -> None:
    r = run_cli(
        "demo",
        "--turns",
        "3",
        "--no-progress",
        env={ENV_OPTS: '{"strategy": "sliding_window"}', "NORMANDY_ARCHIVE_PATH": "off"},
    )
    assert r.code == 0, r
    assert f"normandy demo: settings: opts from {ENV_OPTS}" in r.out
    assert "with compactor window_manager strategy=sliding_window" in r.out
    assert "(sliding_window," in r.out


def test_normandy_config_shows_the_archive_section_and_its_sources(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin's section ([archive]) is shown beside the core's keys, each value with
    the source that set it: the file with its line, the environment, or nothing."""
    monkeypatch.delenv("NORMANDY_ARCHIVE_MAX_BYTES", raising=False)
    (here / "normandy.toml").write_text(
        'compactor = "noop"\n\n[archive]\nmax_bytes = "5MB"\nsync = "full"\n', encoding="utf-8"
    )
    r = run_cli("config", "--json", env={"NORMANDY_ARCHIVE_SYNC": "normal"})
    assert r.code == 0, r
    rows = {row["key"]: row for row in json.loads(r.out)["sections"]["archive"]}
    toml = here / "normandy.toml"
    assert rows["max_bytes"] == {
        "key": "max_bytes",
        "value": 5_000_000,
        "from": f"{toml}: line 4: [archive] key 'max_bytes'",
    }
    assert rows["sync"]["value"] == "normal" and rows["sync"]["from"] == "NORMANDY_ARCHIVE_SYNC"
    assert rows["max_sessions"] == {"key": "max_sessions", "value": None, "from": "not set"}
    text = run_cli("config")
    assert text.code == 0 and "[archive]" in text.out and "5000000" in text.out, text

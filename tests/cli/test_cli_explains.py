"""The command line explains itself: help everywhere, a compactor's options, failures once,
archive options anywhere, --plot checked first, and the summary counting what it says."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from normandy_core.app.cli import build_parser, main
from normandy_core.app.workload import generate_session
from tests.cli.conftest import run_cli, write_json

# -- help ---------------------------------------------------------------------------------


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_option_and_command_has_help() -> None:
    parser = build_parser()  # with the installed extensions (normandy archive)
    seen, missing = set(), []
    for path, p in _parsers(parser):
        seen.add(path)
        for action in p._actions:
            if not action.help:
                missing.append((" ".join(path), action.option_strings or action.dest))
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    if not choice.help:
                        missing.append((" ".join(path), choice.dest))
        if path:
            assert p.description, f"normandy {' '.join(path)} has no description"
    assert missing == []
    assert {("plugins",), ("plugins", "show"), ("demo",), ("archive", "list")} <= seen


def test_help_shows_what_was_missing(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in (
        (["compact", "--help"], ["--format", "transcript format"]),
        (["demo", "--help"], ["--no-progress", "never draw the progress bar"]),
        (["plugins", "--help"], ["show", "Exits 3 when any plugin failed to load"]),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        for word in words:
            assert word in out, (argv, out)


# -- plugins show -------------------------------------------------------------------------


def test_plugins_show_prints_each_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "show", "window_manager"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compactor 'window_manager' from normandy-window-manager ")
    assert "strategy: 'oldest_first' | 'sliding_window' | 'summarize' = 'oldest_first'" in out
    assert "reserved_tokens: int (>= 0) = 4096" in out
    assert "trigger: float (> 0.0, <= 1.0) = 1.0" in out
    assert "keep_last_turns: int (>= 1) | None = None" in out
    assert "Room kept free for the model's reply." in out  # the option's docstring
    assert "Unknown options and bad values are refused" in out  # the model's docstring


def test_plugins_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["plugins", "show", "clear_tool_results", "--json"],
        ["plugins", "--json", "show", "clear_tool_results"],
    ):
        assert main(argv) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["name"] == "clear_tool_results"
        assert data["distribution"] == "normandy-clear-tool-results"
        options = {o["name"]: o for o in data["options"]}
        assert options["keep"] == {
            "name": "keep",
            "type": "int (>= 0)",
            "required": False,
            "default": 3,
            "description": "How many of the newest tool uses to keep intact (whatever their tool).",
        }
        assert options["exclude_tools"]["default"] == []
    assert main(["plugins", "show", "pipeline", "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["options"][0]
    assert steps["name"] == "steps" and steps["required"] is True
    assert steps["type"] == "list of Step (length >= 1)"


def test_plugins_show_without_an_options_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "show", "noop"]) == 0
    out = capsys.readouterr().out
    assert "compactor 'noop' from normandy-core" in out and "no options model" in out
    assert main(["plugins", "show", "noop", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"] is None


def test_plugins_show_of_what_is_not_a_compactor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "show", "window_manger"]) == 3
    err = capsys.readouterr().err
    assert "did you mean 'window_manager'?" in err and err.count("\n") == 1
    assert main(["plugins", "show", "archive"]) == 3
    err = capsys.readouterr().err
    assert "'archive' is a hook plugin, not a compactor" in err
    assert main(["plugins", "show", "archive-cli"]) == 3
    err = capsys.readouterr().err
    assert "'archive-cli' is a command, not a compactor" in err


# -- plugins: failures once --------------------------------------------------------------


def _fake_dist(root: Path, group: str, name: str, module: str, body: str, attr: str = "") -> None:
    (root / f"{module}.py").write_text(body, encoding="utf-8")
    info = root / f"normandy_{name}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: normandy-{name}\nVersion: 0.0.1\n", encoding="utf-8"
    )
    value = f"{module}:{attr}" if attr else module
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {value}\n", encoding="utf-8")


@pytest.mark.slow
def test_plugins_prints_each_failure_once_and_exits_3(tmp_path: Path) -> None:
    _fake_dist(
        tmp_path,
        "normandy_core.compactors",
        "broken",
        "normandy_broken_once",
        "raise ImportError('needs the zstandard package')\n",
    )
    _fake_dist(
        tmp_path,
        "normandy_core.commands",
        "hello",
        "normandy_hello_once",
        "def register(subparsers):\n    raise RuntimeError('boom at register')\n",
        attr="register",
    )
    env = {"PYTHONPATH": str(tmp_path)}
    r = run_cli("plugins", env=env)
    assert r.code == 3, r
    both = r.out + r.err
    assert both.count("needs the zstandard package") == 1, both
    assert both.count("boom at register") == 1, both
    r = run_cli("plugins", "--json", env=env)
    assert r.code == 3, r
    assert r.err.count("needs the zstandard package") == 1, r.err  # the rows are on stdout
    assert r.err.count("boom at register") == 1, r.err
    assert {row["status"] for row in json.loads(r.out) if row["name"] == "broken"} == {"error"}
    r = run_cli("compact", "--help", env=env)  # other commands still say it, once
    assert r.code == 0 and r.err.count("boom at register") == 1, r


# -- archive ------------------------------------------------------------------------------


@pytest.fixture
def archive_file(tmp_path: Path) -> Path:
    from normandy_archive import Archive

    path = tmp_path / "archive.sqlite3"
    archive = Archive(path)
    archive.record(list(generate_session(71, 12)), session_id="s1", compactor="window_manager")
    archive.close()
    return path


@pytest.mark.parametrize("where", ["before", "after"])
def test_archive_path_before_or_after_the_command(
    where: str, archive_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(path: Path, *args: str) -> int:
        option = ["--path", str(path)]
        cmd = ["archive", *option, *args] if where == "before" else ["archive", *args, *option]
        return main(cmd)

    assert run(archive_file, "list", "--limit", "3") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].split()[:3] == ["SEQ", "ARCHIVED", "SESSION"]
    assert run(archive_file, "search", "def") == 0
    assert capsys.readouterr().out.split()[0] == "SEQ"
    assert run(archive_file, "list", "--json", "--limit", "2") == 0
    assert [json.loads(x)["session_id"] for x in capsys.readouterr().out.splitlines()] == [
        "s1",
        "s1",
    ]
    missing = tmp_path / "none" / "archive.sqlite3"
    for args in (["list"], ["search", "x"], ["show", "x"]):
        assert run(missing, *args) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "no archive at" in err, err
    assert not missing.parent.exists()


def test_an_empty_listing_says_so(archive_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["archive", "list", "--path", str(archive_file), "--session", "nope"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no archived entries" in err and "session 'nope'" in err


@pytest.mark.slow
def test_the_archive_module_accepts_path_after_the_command(archive_file: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "normandy_archive", "list", "--path", str(archive_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("   SEQ  ARCHIVED")


# -- demo --plot ---------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_plot_checks_matplotlib_before_running(tmp_path: Path) -> None:
    fake = tmp_path / "matplotlib"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n",
        encoding="utf-8",
    )
    r = run_cli("demo", "--plot", str(tmp_path / "chart.png"), env={"PYTHONPATH": str(tmp_path)})
    assert r.code == 2, r
    assert "pip install 'normandy-core[plot]'" in r.err and r.err.count("\n") == 1, r.err
    assert r.out == ""  # refused before replaying anything
    assert not (tmp_path / "chart.png").exists()


# -- the summary line ----------------------------------------------------------------------


def _summary(err: str) -> str:
    """The line ``normandy compact: FILE (FORMAT, N ...): ...`` (not a hook's note)."""
    (line,) = [x for x in err.splitlines() if x.startswith("normandy compact: ") and ".json (" in x]
    return line


@pytest.mark.slow
def test_the_summary_counts_input_messages_either_way(
    tmp_path: Path, openai_messages: list[dict[str, Any]], anthropic_payload: dict[str, Any]
) -> None:
    chat = write_json(tmp_path / "chat.json", openai_messages)
    n = len(openai_messages)
    compacted = run_cli("compact", str(chat), "-o", str(tmp_path / "o.json"), "--window", "20000")
    assert compacted.code == 0 and "tokens (strategy" in compacted.err, compacted
    kept = run_cli("compact", str(chat), "-o", str(tmp_path / "k.json"), "--compactor", "noop")
    assert kept.code == 0 and "not compacted" in kept.err, kept
    for r in (compacted, kept):
        assert f"(openai, {n} messages)" in _summary(r.err), r.err
    payload = write_json(tmp_path / "anthropic.json", anthropic_payload)
    r = run_cli("compact", str(payload), "-o", str(tmp_path / "a.json"), "--window", "20000")
    assert f"(anthropic, {len(anthropic_payload['messages'])} messages)" in _summary(r.err)
    memory = generate_session(5, 30)
    dump = write_json(tmp_path / "dump.json", memory.dump())
    r = run_cli("compact", str(dump), "-o", str(tmp_path / "d.json"), "--compactor", "noop")
    assert f"(normandy, {len(memory)} entries)" in _summary(r.err), r.err
    items = [
        {"role": "user", "content": "Run the tests."},
        {"type": "function_call", "call_id": "c1", "name": "run_tests", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "2 passed"},
    ]
    responses = write_json(tmp_path / "responses.json", items)
    r = run_cli("compact", str(responses), "--format", "responses", "--window", "8000")
    assert r.code == 0 and "(responses, 3 messages)" in _summary(r.err), r

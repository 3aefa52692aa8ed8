"""``normandy compact --force`` (and ``--focus``): a transcript under its trigger is
compacted; a compactor that declines says why; bad input names the option."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import run_cli, write_json

# Slow: every test runs the installed console script in a subprocess.
pytestmark = pytest.mark.slow


def _chat(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(turns):
        out.append({"role": "user", "content": f"Step {i}: read m{i}.py. " * 4})
        out.append({"role": "assistant", "content": f"m{i}.py has {i} functions. " * 6})
    return out


def test_force_compacts_a_transcript_under_its_trigger(tmp_path: Path) -> None:
    src = write_json(tmp_path / "in.json", _chat(6))
    out = tmp_path / "out.json"
    meta = tmp_path / "meta.json"
    plain = run_cli("compact", str(src), "-o", str(out), "--window", "100000")
    assert plain.code == 0, plain
    assert "not compacted" in plain.err
    assert json.loads(out.read_text()) == _chat(6)
    forced = run_cli(
        "compact", str(src), "-o", str(out), "--window", "100000", "--force", "--meta", str(meta)
    )
    assert forced.code == 0, forced
    assert "entries dropped" in forced.err and "not compacted" not in forced.err
    kept = json.loads(out.read_text())
    assert len(kept) < len(_chat(6)) and kept[-1] == _chat(6)[-1]
    assert json.loads(meta.read_text())["compacted"] is True


def test_a_declined_force_says_why_and_writes_the_transcript_unchanged(tmp_path: Path) -> None:
    src = write_json(tmp_path / "in.json", _chat(3))
    out = tmp_path / "out.json"
    r = run_cli("compact", str(src), "-o", str(out), "--compactor", "noop", "--force")
    assert r.code == 0, r
    assert "--force declined: compactor 'noop' never compacts" in r.err
    assert json.loads(out.read_text()) == _chat(3)


def test_focus_without_force_is_refused_naming_the_option(tmp_path: Path) -> None:
    src = write_json(tmp_path / "in.json", _chat(3))
    r = run_cli("compact", str(src), "--window", "100000", "--focus", "the parser")
    assert r.code == 2, r
    assert "normandy compact --focus: focus is read only by a compaction on request" in r.err
    assert "Traceback" not in r.err


def test_help_mentions_force() -> None:
    r = run_cli("compact", "--help")
    assert r.code == 0 and "--force" in r.out and "--focus" in r.out

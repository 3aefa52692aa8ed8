"""Fixtures of the CLI tests: the installed console script and sample transcripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from project_paths import with_project_path

from normandy_core.app.workload import generate_session
from normandy_core.transcripts.anthropic import to_anthropic
from normandy_core.transcripts.chat import to_openai

BIN = Path(sys.executable).parent / "normandy"


class Run:
    """The result of running the console script."""

    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def __repr__(self) -> str:
        return f"<Run code={self.code} err={self.err[-500:]!r}>"


def run_cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Run:
    """Run the installed ``normandy`` script in a subprocess.

    A ``PYTHONPATH`` in ``env`` (fake distributions) goes before the project's packages as
    this test run imports them, so the script runs the code under test.
    """
    assert BIN.exists(), f"the console script is not installed at {BIN}"
    env = dict(env or {})
    env["PYTHONPATH"] = with_project_path(*([env["PYTHONPATH"]] if "PYTHONPATH" in env else []))
    full_env = {**os.environ, **env}
    full_env.pop("NORMANDY_LOAD_PLUGINS", None)
    proc = subprocess.run(
        [str(BIN), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return Run(proc)


@pytest.fixture(scope="session")
def session_memory() -> Any:
    """A tool-using session of about 120 entries (about 100k tokens)."""
    return generate_session(3, messages=120)


@pytest.fixture(scope="session")
def openai_messages(session_memory: Any) -> list[dict[str, Any]]:
    """The session in the OpenAI Chat Completions format."""
    return to_openai(session_memory)


@pytest.fixture(scope="session")
def anthropic_payload(session_memory: Any) -> dict[str, Any]:
    """The session in the Anthropic Messages format: ``{"system", "messages"}``."""
    system, messages = to_anthropic(session_memory)
    return {"system": system, "messages": messages}


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON."""
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def write_jsonl(path: Path, items: list[Any]) -> Path:
    """Write ``items`` as JSON Lines."""
    path.write_text("".join(json.dumps(x) + "\n" for x in items), encoding="utf-8")
    return path

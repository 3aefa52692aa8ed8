"""Issue 34 in real OpenAI Agents SDK runs (``Runner``, a ``NormandySession`` over a
SQLite session, ``NormandyInputFilter`` for the calls inside a run): every call of a turn
sees the turn's request (item 1), and after many runs the last request holds one marker
(item 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, SQLiteSession
from oa_scripted import ScriptedModel, pairing_problems, read_chunk

from normandy_openai_agents import AgentsCompaction, NormandyInputFilter, NormandySession

WINDOW = 3000
OPTS = {"reserved_tokens": 500}
MARKER = "[normandy:marker]"


def _texts(request: list[Any]) -> list[str]:
    """The text of every user message of a request (tool outputs aside)."""
    out: list[str] = []
    for item in request:
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            out.append(content)
        else:
            out.append("".join(str(part.get("text", "")) for part in content or []))
    return out


def _runs(tmp_path: Path, rounds: int, runs: int) -> tuple[ScriptedModel, list[AgentsCompaction]]:
    model = ScriptedModel(rounds=rounds)
    done: list[AgentsCompaction] = []
    store = SQLiteSession("sees", tmp_path / "sessions.sqlite3")
    session = NormandySession(store, "window_manager", OPTS, window=WINDOW, on_compact=done.append)
    filt = NormandyInputFilter("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    config = RunConfig(tracing_disabled=True, call_model_input_filter=filt)
    agent = Agent(name="reader", instructions="You read logs.", model=model, tools=[read_chunk])
    for q in range(runs):
        Runner.run_sync(
            agent, f"Question {q}: read the log.", session=session, run_config=config, max_turns=40
        )
    return model, done


def test_every_call_of_every_turn_sees_its_request(tmp_path: Path) -> None:
    model, done = _runs(tmp_path, rounds=10, runs=3)
    assert model.calls == 3 * 11 and done
    for call, request in enumerate(model.received):
        turn = call // 11
        assert f"Question {turn}: read the log." in _texts(request), (call, _texts(request))
        assert pairing_problems(request) == [], json.dumps(request, default=str)[:500]


def test_forty_runs_leave_one_marker_in_the_last_request(tmp_path: Path) -> None:
    model, done = _runs(tmp_path, rounds=2, runs=40)
    assert len(done) >= 10
    markers = [t for t in _texts(model.received[-1]) if t.startswith(MARKER)]
    assert len(markers) == 1, _texts(model.received[-1])

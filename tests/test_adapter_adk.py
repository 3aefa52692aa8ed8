"""normandy-adk with a third-party compactor, installed for real and chosen by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ThirdPartyVenv

# Slow: the scenario runs in the third-party venv (wheels built and installed).
pytestmark = pytest.mark.slow

HELPERS = Path(__file__).parents[1] / "plugins" / "normandy-adk" / "tests"


def test_a_third_party_compactor_chosen_by_name_runs_inside_an_adk_agent(
    third_party: ThirdPartyVenv, tmp_path: Path
) -> None:
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        f"""
import asyncio, sys
sys.path.insert(0, {str(HELPERS)!r})
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.runners import InMemoryRunner
from google.genai import types
from adk_scripted import ScriptedLlm, pairing_problems, read_chunk
from normandy_adk import NormandyPlugin

llm = ScriptedLlm(rounds=6)
done = []
plugin = NormandyPlugin("tail", {{"keep": 3}}, on_compact=done.append)
agent = LlmAgent(name="reader", model=llm, instruction="You read logs.", tools=[read_chunk])
runner = InMemoryRunner(app=App(name="reader", root_agent=agent, plugins=[plugin]))
session = asyncio.run(runner.session_service.create_session(app_name="reader", user_id="u"))
for q in range(3):
    message = types.Content(role="user", parts=[types.Part(text=f"question {{q}}")])
    for _ in runner.run(user_id="u", session_id=session.id, new_message=message):
        pass
emit({{
    "calls": llm.calls,
    "sizes": [len(s.contents) for s in llm.received],
    "problems": [p for s in llm.received for p in pairing_problems(s.contents)],
    "strategies": [d.result.meta.get("strategy") for d in done],
    "dropped": [e.id for d in done for e in d.result.dropped],
    "compactor": done[0].result.compactor if done else None,
}})
""",
        env={"NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    d = out.data
    assert d["calls"] == 3 * 7
    assert d["problems"] == []
    assert d["strategies"] and set(d["strategies"]) == {"tail"}
    assert "normandy-tail 1.2.3" in d["compactor"]
    # A turn is 14 contents (a question, 7 model contents, 6 of responses): without
    # compaction the last request would hold 41. tail keeps its last units and the task.
    assert max(d["sizes"]) < 12 and d["sizes"][:4] == [1, 3, 5, 7]
    assert len(d["dropped"]) == len(set(d["dropped"]))  # each content reported once
    lines = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert [i for line in lines for i in line["dropped"]] == d["dropped"]
    assert d["dropped"] and {line["strategy"] for line in lines} == {"tail"}

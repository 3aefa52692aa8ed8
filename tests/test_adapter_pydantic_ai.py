"""normandy-pydantic-ai with a third-party compactor, installed for real and chosen by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ThirdPartyVenv

# Slow: the scenario runs in the third-party venv (wheels built and installed).
pytestmark = pytest.mark.slow

HELPERS = Path(__file__).parents[1] / "plugins" / "normandy-pydantic-ai" / "tests"


def test_a_third_party_compactor_chosen_by_name_runs_inside_a_pydantic_ai_agent(
    third_party: ThirdPartyVenv, tmp_path: Path
) -> None:
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        f"""
import sys
sys.path.insert(0, {str(HELPERS)!r})
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.models.function import FunctionModel
from pai_scripted import ScriptedFunction, pairing_problems, read_chunk, thinking_problems
from normandy_pydantic_ai import NormandyHistoryProcessor

fn = ScriptedFunction(rounds=6)
done = []
proc = NormandyHistoryProcessor("tail", {{"keep": 3}}, on_compact=done.append)
agent = Agent(
    FunctionModel(fn), system_prompt="You read logs.", tools=[read_chunk],
    capabilities=[ProcessHistory(proc)],
)
history = None
for q in range(3):
    history = agent.run_sync(f"question {{q}}", message_history=history).all_messages()
first, changed = {{}}, []
for request, snapshot in zip(fn.received, fn.snapshots):
    for m, snap in zip(request, snapshot):
        if first.setdefault(id(m), snap) != snap:
            changed.append(repr(m))
emit({{
    "calls": fn.calls,
    "sizes": [len(r) for r in fn.received],
    "problems": [p for r in fn.received for p in pairing_problems(r) + thinking_problems(r)],
    "changed": changed,
    "strategies": [d.result.meta.get("strategy") for d in done],
    "dropped": [e.id for d in done for e in d.result.dropped],
    "compactor": done[0].result.compactor if done else None,
}})
""",
        env={"NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    d = out.data
    assert d["calls"] == 3 * 7
    assert d["problems"] == [] and d["changed"] == []
    assert d["strategies"] and set(d["strategies"]) == {"tail"}
    assert "normandy-tail 1.2.3" in d["compactor"]
    # A turn is 14 messages (a prompt, 7 responses, 6 result requests): without
    # compaction the last request would hold 41. tail keeps its last units and the pinned
    # request with the system prompt (also the first question, the task).
    assert max(d["sizes"]) < 10 and d["sizes"][:4] == [1, 3, 5, 7]
    lines = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert [i for line in lines for i in line["dropped"]] == d["dropped"]
    assert d["dropped"] and {line["strategy"] for line in lines} == {"tail"}

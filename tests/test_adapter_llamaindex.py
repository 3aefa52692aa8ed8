"""normandy-llamaindex with a third-party compactor, installed for real and chosen by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ThirdPartyVenv

# Slow: the scenario runs in the third-party venv (wheels built and installed).
pytestmark = pytest.mark.slow

HELPERS = Path(__file__).parents[1] / "plugins" / "normandy-llamaindex" / "tests"


def test_a_third_party_compactor_chosen_by_name_runs_inside_a_llamaindex_agent(
    third_party: ThirdPartyVenv, tmp_path: Path
) -> None:
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        f"""
import sys
sys.path.insert(0, {str(HELPERS)!r})
from li_scripted import ScriptedTurns, pairing_problems, run_session
from normandy_llamaindex import NormandyMemory

script = ScriptedTurns(rounds=5)
done = []
memory = NormandyMemory.from_compactor("tail", {{"keep": 3}}, on_compact=done.append)
prompts = ["Task: read the log."] + [f"question {{q}}" for q in range(1, 5)]
run_session(script, memory, prompts)
first, changed = {{}}, []
for request, snapshot in zip(script.received, script.snapshots):
    for m, snap in zip(request, snapshot):
        if first.setdefault(id(m), snap) != snap:
            changed.append(repr(m))
users = [[m.content for m in r if m.role.value == "user"] for r in script.received]
emit({{
    "calls": script.calls,
    "sizes": [len(r) for r in script.received],
    "problems": [p for r in script.received for p in pairing_problems(r)],
    "task_everywhere": all(prompts[0] in u for u in users),
    "changed": changed,
    "strategies": [d.result.meta.get("strategy") for d in done],
    "dropped": [e.id for d in done for e in d.result.dropped],
    "compactor": done[0].result.compactor if done else None,
}})
""",
        env={"NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    d = out.data
    assert d["calls"] == 5 * 6
    assert d["problems"] == [] and d["changed"] == [] and d["task_everywhere"]
    assert d["strategies"] and set(d["strategies"]) == {"tail"}
    assert "normandy-tail 1.2.3" in d["compactor"]
    # A run adds 13 messages to the memory (the question, 6 responses, 6 results): tail
    # keeps its last 3 units and the task, so no run starts from more than a handful.
    starts = d["sizes"][::6]
    assert max(starts) <= 8 < 13
    lines = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert [i for line in lines for i in line["dropped"]] == d["dropped"]
    assert d["dropped"] and len(d["dropped"]) == len(set(d["dropped"]))
    assert {line["strategy"] for line in lines} == {"tail"}

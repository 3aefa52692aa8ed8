"""normandy-openai-agents with a third-party compactor, installed for real and chosen by
name, in a session and in the input filter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ThirdPartyVenv

# Slow: the scenario runs in the third-party venv (wheels built and installed).
pytestmark = pytest.mark.slow

HELPERS = Path(__file__).parents[1] / "plugins" / "normandy-openai-agents" / "tests"


def test_a_third_party_compactor_chosen_by_name_runs_inside_an_agents_sdk_run(
    third_party: ThirdPartyVenv, tmp_path: Path
) -> None:
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        f"""
import sys
sys.path.insert(0, {str(HELPERS)!r})
from agents import Agent, RunConfig, Runner, SQLiteSession
from oa_scripted import ScriptedModel, key, pairing_problems, read_chunk, reasoning_problems
from normandy_openai_agents import NormandyInputFilter, NormandySession

model = ScriptedModel(rounds=6)
done = []
session = NormandySession(
    SQLiteSession("t", {str(tmp_path / "s.sqlite3")!r}), "tail", {{"keep": 3}},
    on_compact=done.append,
)
config = RunConfig(
    call_model_input_filter=NormandyInputFilter("tail", {{"keep": 3}}, on_compact=done.append),
    tracing_disabled=True,
)
agent = Agent(name="reader", instructions="You read logs.", model=model, tools=[read_chunk])
for q in range(3):
    Runner.run_sync(agent, f"question {{q}}", session=session, run_config=config)
first, changed = {{}}, []
for request in model.received:
    for item in request:
        if first.setdefault(key(item), item) != item:
            changed.append(key(item))
emit({{
    "calls": model.calls,
    "sizes": [len(r) for r in model.received],
    "problems": [p for r in model.received for p in pairing_problems(r) + reasoning_problems(r)],
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
    # A run is 1 + 6 rounds of 3 or 4 items + the answer: without compaction the last
    # request would hold over 70 items; tail keeps the question and its last 3 units.
    assert d["sizes"][:4] == [1, 5, 9, 15]
    assert max(d["sizes"]) < 20 and d["sizes"][-1] < 20
    assert len(d["dropped"]) == len(set(d["dropped"]))  # each entry reached the hooks once
    lines = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert [i for line in lines for i in line["dropped"]] == d["dropped"]
    assert d["dropped"] and {line["strategy"] for line in lines} == {"tail"}

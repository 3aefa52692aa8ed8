"""normandy-strands with a third-party compactor, installed for real and chosen by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ThirdPartyVenv

# Slow: the scenario runs in the third-party venv (wheels built and installed).
pytestmark = pytest.mark.slow

HELPERS = Path(__file__).parents[1] / "plugins" / "normandy-strands" / "tests"


def test_a_third_party_compactor_chosen_by_name_runs_inside_a_strands_agent(
    third_party: ThirdPartyVenv, tmp_path: Path
) -> None:
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        f"""
import sys
sys.path.insert(0, {str(HELPERS)!r})
from strands import Agent
from strands_scripted import ScriptedModel, pairing_problems, read_chunk, user_texts
from normandy_strands import NormandyConversationManager

model = ScriptedModel(rounds=12)
done = []
manager = NormandyConversationManager("tail", {{"keep": 3}}, on_compact=done.append)
agent = Agent(
    model=model, tools=[read_chunk], system_prompt="You read logs.",
    conversation_manager=manager, callback_handler=None,
)
for q in range(3):
    agent(f"question {{q}}")
emit({{
    "calls": model.calls,
    "sizes": [len(r.messages) for r in model.received],
    "problems": [p for r in model.received for p in pairing_problems(r.messages)],
    "task": all(user_texts(r.messages)[0] == "question 0" for r in model.received),
    "strategies": [d.result.meta.get("strategy") for d in done],
    "dropped": [e.id for d in done for e in d.result.dropped],
    "compactor": done[0].result.compactor if done else None,
    "removed": manager.removed_message_count,
}})
""",
        env={"NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    d = out.data
    assert d["calls"] == 3 * 13
    assert d["problems"] == [] and d["task"]
    assert d["strategies"] and set(d["strategies"]) == {"tail"}
    assert "normandy-tail 1.2.3" in d["compactor"]
    # A prompt's run is 26 messages: without compaction the last request would hold 77.
    assert max(d["sizes"]) < 12 and d["sizes"][:3] == [1, 3, 5]
    assert d["removed"] > 50
    lines = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert [i for line in lines for i in line["dropped"]] == d["dropped"]
    assert d["dropped"] and {line["strategy"] for line in lines} == {"tail"}

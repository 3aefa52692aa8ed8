"""normandy-langchain with a third-party compactor, installed for real and chosen by name,
and the adapters' distributions (LangChain, Pydantic AI, OpenAI Agents SDK) in
``normandy plugins``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ThirdPartyVenv
from tests.cli.conftest import run_cli

# Slow: scenarios run in the third-party venv (wheels built and installed) and the CLI.
pytestmark = pytest.mark.slow

HELPERS = Path(__file__).parents[1] / "plugins" / "normandy-langchain" / "tests"


def test_a_third_party_compactor_chosen_by_name_runs_inside_a_langchain_agent(
    third_party: ThirdPartyVenv, tmp_path: Path
) -> None:
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        f"""
import sys
sys.path.insert(0, {str(HELPERS)!r})
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from lc_scripted import ScriptedChatModel, fingerprint, pairing_problems, read_chunk
from normandy_langchain import NormandyMiddleware

model = ScriptedChatModel(rounds=6)
done = []
mw = NormandyMiddleware("tail", {{"keep": 3}}, on_compact=done.append)
agent = create_agent(model, [read_chunk], middleware=[mw], checkpointer=InMemorySaver())
config = {{"configurable": {{"thread_id": "t"}}}}
for q in range(3):
    agent.invoke({{"messages": [HumanMessage(f"question {{q}}", id=f"q{{q}}")]}}, config)
seen, changed = {{}}, []
for request in model.received:
    for m in request:
        if seen.setdefault(m.id, fingerprint(m)) != fingerprint(m):
            changed.append(m.id)
emit({{
    "calls": model.calls,
    "sizes": [len(r) for r in model.received],
    "problems": [p for r in model.received for p in pairing_problems(r)],
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
    # A turn is 16 messages (a question, 6 calls with 8 results, the answer): without
    # compaction the last request would hold 47. tail keeps its last units and, by the
    # default survival rule, the first question (the task), so a request stays at 8.
    assert d["sizes"][:7] == [1, 3, 5, 8, 8, 8, 8]
    assert max(d["sizes"]) < 20 and d["sizes"][-1] < 20
    # the recorder hook plugin (another installed distribution) saw every dropped entry
    lines = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert [i for line in lines for i in line["dropped"]] == d["dropped"]
    assert {line["strategy"] for line in lines} == {"tail"}


ADAPTERS = [
    ("adk", "normandy-adk"),
    ("langchain", "normandy-langchain"),
    ("llamaindex", "normandy-llamaindex"),
    ("openai_agents", "normandy-openai-agents"),
    ("pydantic_ai", "normandy-pydantic-ai"),
    ("strands", "normandy-strands"),
]


def test_normandy_plugins_lists_the_adapters() -> None:
    r = run_cli("plugins", "--json")
    assert r.code == 0, r
    rows = [row for row in json.loads(r.out) if row["kind"] == "adapter"]
    assert sorted((x["name"], x["distribution"], x["group"], x["status"]) for x in rows) == [
        (name, dist, "normandy_core.adapters", "loaded") for name, dist in ADAPTERS
    ]
    table = run_cli("plugins")
    for name, dist in ADAPTERS:
        assert any(
            line.split()[:3] == ["adapter", name, dist] for line in table.out.splitlines()
        ), table.out

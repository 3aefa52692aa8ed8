"""Issue 34 in a real LangChain agent (``create_agent`` with a checkpointer thread): every
call of a turn sees the turn's request (item 1), and after many runs on one thread the
last request holds one marker (item 3)."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from lc_scripted import ScriptedChatModel, read_chunk

from normandy_langchain import LangChainCompaction, NormandyMiddleware

WINDOW = 3000
OPTS = {"reserved_tokens": 500}
MARKER = "[normandy:marker]"


def _texts(request: list[BaseMessage]) -> list[str]:
    """The text of every human message of a request (tool results aside)."""
    return [
        m.text if hasattr(m, "text") and isinstance(m.text, str) else str(m.content)
        for m in request
        if isinstance(m, HumanMessage) and not isinstance(m, ToolMessage)
    ]


def _thread(rounds: int, runs: int) -> tuple[ScriptedChatModel, list[LangChainCompaction]]:
    model = ScriptedChatModel(rounds=rounds)
    done: list[LangChainCompaction] = []
    mw = NormandyMiddleware("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    agent: Any = create_agent(
        model,
        [read_chunk],
        system_prompt="You read logs and answer.",
        middleware=[mw],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "sees"}}
    for q in range(runs):
        agent.invoke({"messages": [HumanMessage(f"Question {q}: read the log.")]}, config)
    return model, done


def test_every_call_of_every_turn_sees_its_request() -> None:
    model, done = _thread(rounds=10, runs=3)
    assert model.calls == 3 * 11 and done
    for call, request in enumerate(model.received):
        turn = call // 11
        assert f"Question {turn}: read the log." in _texts(request), (call, _texts(request))


def test_forty_runs_leave_one_marker_in_the_last_request() -> None:
    model, done = _thread(rounds=2, runs=40)
    assert len(done) >= 10
    markers = [t for t in _texts(model.received[-1]) if t.startswith(MARKER)]
    assert len(markers) == 1, _texts(model.received[-1])

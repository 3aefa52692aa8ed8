"""Issue 34 in a real Pydantic AI agent (``FunctionModel``, ``message_history`` carried
from run to run): every call of a turn sees the turn's request (item 1), and the last
request holds one marker after many runs (item 3; before the fix, Pydantic AI's merging
of consecutive requests piled a marker part into the first request per compaction)."""

from __future__ import annotations

from typing import Any

from pai_scripted import ScriptedFunction, pairing_problems, read_chunk
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai.models.function import FunctionModel

from normandy_pydantic_ai import NormandyHistoryProcessor, PydanticAICompaction

WINDOW = 3000
OPTS = {"reserved_tokens": 500}
MARKER = "[normandy:marker]"


def _prompts(request: list[ModelMessage]) -> list[str]:
    """The text of every user prompt part of a request, in order."""
    return [
        p.content
        for m in request
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart) and isinstance(p.content, str)
    ]


def _session(rounds: int, runs: int) -> tuple[ScriptedFunction, list[PydanticAICompaction]]:
    fn = ScriptedFunction(rounds=rounds)
    done: list[PydanticAICompaction] = []
    proc = NormandyHistoryProcessor("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    agent: Agent[None, Any] = Agent(
        FunctionModel(fn),
        system_prompt="You read logs.",
        tools=[read_chunk],
        capabilities=[ProcessHistory(proc)],
    )
    history: list[ModelMessage] | None = None
    for q in range(runs):
        history = agent.run_sync(f"Question {q}: read the log.", message_history=history)
        history = history.all_messages()
    return fn, done


def test_every_call_of_every_turn_sees_its_request() -> None:
    fn, done = _session(rounds=10, runs=3)
    assert fn.calls == 3 * 11 and done  # the window is tight: compactions happened
    for call, request in enumerate(fn.received):
        turn = call // 11
        assert f"Question {turn}: read the log." in _prompts(request), (call, _prompts(request))
        assert pairing_problems(request) == []


def test_forty_runs_leave_one_marker_in_the_last_request() -> None:
    fn, done = _session(rounds=2, runs=40)
    assert len(done) >= 10
    last = _prompts(fn.received[-1])
    assert sum(text.startswith(MARKER) for text in last) == 1, last
    assert all(sum(t.startswith(MARKER) for t in _prompts(r)) <= 1 for r in fn.received)

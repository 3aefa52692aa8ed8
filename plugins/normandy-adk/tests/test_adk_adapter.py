"""normandy-adk in real Google ADK agents (``LlmAgent``, ``InMemoryRunner``, ADK's tool
execution and plugin manager), with a scripted ``BaseLlm`` as the only fake."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from adk_scripted import ScriptedLlm, read_chunk, request_problems, request_tokens
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.runners import InMemoryRunner
from google.genai import types

import normandy_core
from normandy_adk import ADKCompaction, NormandyPlugin
from normandy_core import hookimpl

WINDOW = 4000
OPTS = {"reserved_tokens": 600}
TASK = "Task: read the project's log, chunk by chunk, and report what it says."


class DroppedRecorder:
    """An ``after_compact`` hook plugin registered in code: what each compaction dropped."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @hookimpl
    def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
        self.calls.append({"dropped": list(meta["dropped"]), "mid_round": ctx.mid_round})


@pytest.fixture
def recorder() -> Iterator[DroppedRecorder]:
    rec = DroppedRecorder()
    qname = normandy_core.register_hook(rec, "adk-test-recorder")
    yield rec
    normandy_core.unregister_hook(qname)


def _runner(llm: ScriptedLlm, plugin: NormandyPlugin) -> InMemoryRunner:
    agent = LlmAgent(name="reader", model=llm, instruction="You read logs.", tools=[read_chunk])
    return InMemoryRunner(app=App(name="reader", root_agent=agent, plugins=[plugin]))


def _question(q: int) -> str:
    return TASK if q == 0 else f"Question {q}: read on and report."


def _message(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def run_session(llm: ScriptedLlm, plugin: NormandyPlugin, runs: int) -> list[int]:
    """``runs`` invocations of one session through the sync ``Runner.run``; the number of
    model calls each made."""
    runner = _runner(llm, plugin)
    session = asyncio.run(
        runner.session_service.create_session(app_name=runner.app_name, user_id="u")
    )
    per_run = []
    for q in range(runs):
        before = llm.calls
        message = _message(_question(q))
        for _event in runner.run(user_id="u", session_id=session.id, new_message=message):
            pass
        per_run.append(llm.calls - before)
    return per_run


def check_requests(llm: ScriptedLlm, per_run: list[int], window: int) -> None:
    """Every request the model received, checked by the independent validator."""
    call = 0
    for q, n in enumerate(per_run):
        for _ in range(n):
            problems = request_problems(
                llm.received[call], task=TASK, current=_question(q), window=window
            )
            assert problems == [], f"request {call}: {problems}"
            call += 1


def tool_calls(llm: ScriptedLlm) -> int:
    """How many function calls the model made in the session (each is answered in the
    request right after it, as its last content)."""
    return sum(
        1
        for seen in llm.received
        for p in (seen.contents[-1].parts or [])
        if p.function_response is not None
    )


def test_a_long_tool_session_sends_only_valid_requests_within_the_window(
    recorder: DroppedRecorder,
) -> None:
    llm = ScriptedLlm(rounds=10)
    done: list[ADKCompaction] = []
    plugin = NormandyPlugin("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    per_run = run_session(llm, plugin, runs=4)
    assert per_run == [11, 11, 11, 11]
    assert tool_calls(llm) >= 40
    check_requests(llm, per_run, WINDOW)
    assert len(done) >= 8
    # Without the plugin the last request would hold every content of the session.
    assert len(llm.received[-1].contents) < 20
    assert max(request_tokens(s) for s in llm.received) <= WINDOW
    assert any(call["mid_round"] for call in recorder.calls)


def test_kept_contents_are_the_requests_own_objects_unchanged(recorder: DroppedRecorder) -> None:
    llm = ScriptedLlm(rounds=10)
    done: list[ADKCompaction] = []
    plugin = NormandyPlugin("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    run_session(llm, plugin, runs=2)
    assert done
    # What the model received is, content for content, equal to what ADK built from the
    # session's events (deep copies taken when received), and the contents the plugin
    # kept are the request's own objects: the compaction's output is the very list.
    for seen in llm.received:
        assert [c.model_dump() for c in seen.given] == [c.model_dump() for c in seen.contents]
    for c in done:
        originals = [x for x in c.contents if not _created(x)]
        assert originals, "every compaction keeps the task and the newest round"
    # The contents the session holds are untouched: every event's content reads as made.
    first = llm.received[0].contents[0]
    assert first.parts is not None and first.parts[0].text == TASK


def _created(content: types.Content) -> bool:
    return any((p.text or "").startswith("[normandy:") for p in content.parts or [])

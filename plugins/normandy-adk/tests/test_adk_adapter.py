"""normandy-adk in real Google ADK agents (``LlmAgent``, ``InMemoryRunner``, ADK's tool
execution and plugin manager), with a scripted ``BaseLlm`` as the only fake."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from adk_scripted import (
    ScriptedLlm,
    read_chunk,
    request_problems,
    request_tokens,
)
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import InMemoryRunner
from google.genai import types

import normandy_core
from normandy_adk import ADKCompaction, ContentsCompactor, NormandyPlugin
from normandy_core import OptionsError, UnknownCompactorError, hookimpl

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

    def dropped(self) -> list[Any]:
        return [e for call in self.calls for e in call["dropped"]]


@pytest.fixture
def recorder() -> Iterator[DroppedRecorder]:
    rec = DroppedRecorder()
    qname = normandy_core.register_hook(rec, "adk-test-recorder")
    yield rec
    normandy_core.unregister_hook(qname)


class Given(BasePlugin):
    """A plugin that runs before Normandy's and records the very content objects of each
    request (ADK builds them anew for every call)."""

    def __init__(self) -> None:
        super().__init__(name="given-recorder")
        self.given: list[list[types.Content]] = []

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> None:
        self.given.append(list(llm_request.contents))


def _agent(llm: ScriptedLlm) -> LlmAgent:
    return LlmAgent(name="reader", model=llm, instruction="You read logs.", tools=[read_chunk])


def _runner(llm: ScriptedLlm, *plugins: BasePlugin) -> InMemoryRunner:
    return InMemoryRunner(app=App(name="reader", root_agent=_agent(llm), plugins=list(plugins)))


def _question(q: int) -> str:
    return TASK if q == 0 else f"Question {q}: read on and report."


def _message(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def run_session(llm: ScriptedLlm, runner: InMemoryRunner, runs: int) -> list[int]:
    """``runs`` invocations of one session through the sync ``Runner.run``; the number of
    model calls each made."""
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
    """How many function calls the model made (each is answered in the request right
    after it, as its last content)."""
    return sum(
        1
        for seen in llm.received
        for p in (seen.contents[-1].parts or [])
        if p.function_response is not None
    )


def _results(contents: list[types.Content]) -> list[str]:
    """The tool results of ``contents`` (each chunk's text is unique in a session)."""
    return [
        str((p.function_response.response or {}).get("result"))
        for c in contents
        for p in c.parts or []
        if p.function_response is not None
    ]


def _created(content: types.Content) -> bool:
    return any((p.text or "").startswith("[normandy:") for p in content.parts or [])


def test_a_long_tool_session_sends_only_valid_requests_within_the_window(
    recorder: DroppedRecorder,
) -> None:
    llm = ScriptedLlm(rounds=10)
    done: list[ADKCompaction] = []
    plugin = NormandyPlugin("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    per_run = run_session(llm, _runner(llm, plugin), runs=4)
    assert per_run == [11, 11, 11, 11]
    assert tool_calls(llm) >= 40
    check_requests(llm, per_run, WINDOW)
    assert len(done) >= 8
    # Without the plugin the last request would hold every content of the session.
    assert len(llm.received[-1].contents) < 20
    assert max(request_tokens(s) for s in llm.received) <= WINDOW
    assert any(call["mid_round"] for call in recorder.calls)


def test_each_dropped_content_reaches_the_hooks_once_across_runs(
    recorder: DroppedRecorder,
) -> None:
    llm = ScriptedLlm(rounds=10)
    done: list[ADKCompaction] = []
    plugin = NormandyPlugin("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    run_session(llm, _runner(llm, plugin), runs=4)
    dropped = recorder.dropped()
    assert dropped and [e.id for e in dropped] == [e.id for c in done for e in c.result.dropped]
    ids = Counter(e.id for e in dropped)
    assert [i for i, n in ids.items() if n > 1] == []
    # Every tool result the model saw and no longer sees reached the hooks exactly once.
    seen = {r for s in llm.received for r in _results(s.contents)}
    gone = seen - set(_results(llm.received[-1].contents))
    hooked = Counter(b.text() for e in dropped for b in e.blocks if b.type == "tool_result")
    assert gone and {r: hooked[r] for r in gone} == dict.fromkeys(gone, 1)
    # Nothing comes back after a cut: the requests holding a dropped result are
    # consecutive, from the one after its call to the one before it was dropped.
    for r in hooked:
        held = [i for i, s in enumerate(llm.received) if r in _results(s.contents)]
        assert held == list(range(held[0], held[-1] + 1))


def _twin(runs: int) -> list[dict[str, Any]]:
    """The whole session as ADK builds it uncompacted: the same script with the ``noop``
    compactor; its last request holds every content."""
    llm = ScriptedLlm(rounds=10)
    run_session(llm, _runner(llm, NormandyPlugin("noop")), runs)
    return [c.model_dump() for c in llm.received[-1].contents]


def test_kept_contents_are_the_requests_own_objects_unchanged(recorder: DroppedRecorder) -> None:
    llm = ScriptedLlm(rounds=10)
    done: list[ADKCompaction] = []
    given = Given()
    plugin = NormandyPlugin("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    run_session(llm, _runner(llm, given, plugin), runs=3)
    assert done and len(given.given) == len(llm.received)
    full = _twin(3)
    kept = changed = 0
    for objects, seen in zip(given.given, llm.received, strict=True):
        mine = {id(c) for c in objects}
        for sent, copy in zip(seen.given, seen.contents, strict=True):
            if id(sent) in mine:  # kept: the request's own object, as ADK built it
                assert copy.model_dump() in full
                kept += 1
            elif not _created(sent):  # changed: an original without its thinking
                parts = [p.model_dump() for p in copy.parts or []]
                assert any(
                    [p for p in c["parts"] if not p["thought"]] == parts
                    and len(c["parts"]) > len(parts)
                    for c in full
                )
                changed += 1
    assert kept > changed


def test_the_async_runner_compacts_two_sessions_at_once(recorder: DroppedRecorder) -> None:
    """``Runner.run_async``, two sessions of one runner interleaved on one loop: each
    session continues its own compactions."""
    llms = [ScriptedLlm(rounds=10), ScriptedLlm(rounds=10)]
    done: list[ADKCompaction] = []
    plugin = NormandyPlugin("window_manager", OPTS, window=WINDOW, on_compact=done.append)
    runners = [_runner(llm, plugin) for llm in llms]

    async def one(runner: InMemoryRunner) -> None:
        session = await runner.session_service.create_session(app_name=runner.app_name, user_id="u")
        for q in range(3):
            async for _event in runner.run_async(
                user_id="u", session_id=session.id, new_message=_message(_question(q))
            ):
                await asyncio.sleep(0)  # let the other session run in between

    async def both() -> None:
        await asyncio.gather(*(one(r) for r in runners))

    asyncio.run(both())
    for llm in llms:
        assert llm.calls == 3 * 11 and tool_calls(llm) >= 30
        check_requests(llm, [11, 11, 11], WINDOW)
    ids = Counter(e.id for e in recorder.dropped())
    # The two sessions hold the same contents (one script), so each id is dropped at most
    # once per session.
    assert ids and max(ids.values()) <= 2
    assert len(done) >= 8


def test_compactions_are_logged(
    recorder: DroppedRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    llm = ScriptedLlm(rounds=10)
    with caplog.at_level(logging.INFO, logger="normandy_adk"):
        run_session(llm, _runner(llm, NormandyPlugin(opts=OPTS, window=WINDOW)), runs=1)
    logged = [r for r in caplog.records if r.name == "normandy_adk"]
    assert logged and len(logged) == len(recorder.calls)
    assert "NormandyPlugin() compacted" in logged[0].getMessage()


def test_nothing_changes_while_the_contents_fit(recorder: DroppedRecorder) -> None:
    llm = ScriptedLlm(rounds=3)
    done: list[ADKCompaction] = []
    plugin = NormandyPlugin("window_manager", window=200_000, on_compact=done.append)
    run_session(llm, _runner(llm, plugin), runs=2)
    assert done == [] and recorder.calls == []
    assert [len(s.contents) for s in llm.received] == [1, 3, 5, 7, 9, 11, 13, 15]


def test_a_wrong_compactor_or_option_is_refused_when_the_plugin_is_built() -> None:
    with pytest.raises(OptionsError, match=r"normandy_adk\.NormandyPlugin\(\)") as e:
        NormandyPlugin("window_manager", {"reserved_tokens": -1}, window=WINDOW)
    assert "window_manager" in str(e.value) and "reserved_tokens" in str(e.value)
    with pytest.raises(OptionsError, match=r"(?s)NormandyPlugin\(\).*window_manager.*no_such"):
        NormandyPlugin("window_manager", {"no_such_option": 1}, window=WINDOW)
    with pytest.raises(UnknownCompactorError, match="no_such_compactor"):
        NormandyPlugin("no_such_compactor")
    with pytest.raises(OptionsError, match=r"(?s)ContentsCompactor\(\).*clear_tool_results"):
        ContentsCompactor("clear_tool_results", {"keep": -1})
    with pytest.raises(normandy_core.WindowUnknownError, match="NormandyPlugin"):
        NormandyPlugin("window_manager", model="no-such-model-anywhere")

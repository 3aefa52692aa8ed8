"""normandy-pydantic-ai in real Pydantic AI agents (``Agent`` with the ``ProcessHistory``
capability, Pydantic AI's tool execution), with a ``FunctionModel`` or ``TestModel`` as the
only fake."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, strategies as st
from pai_scripted import (
    ScriptedFunction,
    fingerprint,
    pairing_problems,
    read_chunk,
    thinking_problems,
)
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.test import TestModel

import normandy_core
from normandy_core import OptionsError, UnknownCompactorError, hookimpl
from normandy_core.transcripts.formats import TranscriptError
from normandy_pydantic_ai import (
    AsyncNormandyHistoryProcessor,
    HistoryCompactor,
    NormandyHistoryProcessor,
    PydanticAICompaction,
    compact_history,
)

WINDOW = 3000
OPTS = {"reserved_tokens": 500}


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
    qname = normandy_core.register_hook(rec, "pydantic-ai-test-recorder")
    yield rec
    normandy_core.unregister_hook(qname)


def _agent(model: Any, processor: Any) -> Agent[None, str]:
    return Agent(
        model,
        system_prompt="You read logs and answer.",
        tools=[read_chunk],
        capabilities=[ProcessHistory(processor)],
    )


def _call_ids(messages: list[ModelMessage]) -> set[str]:
    return {
        p.tool_call_id
        for m in messages
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ToolCallPart)
    }


def _check_session(
    fn: ScriptedFunction, compactions: list[PydanticAICompaction], recorder: DroppedRecorder
) -> None:
    """What every long session must show, whatever the compactor."""
    for n, request in enumerate(fn.received):
        assert pairing_problems(request) == [], f"request {n}"
        assert thinking_problems(request) == [], f"request {n}"
        # the system prompt's request is pinned: every request starts with it
        assert isinstance(request[0], ModelRequest)
        assert isinstance(request[0].parts[0], SystemPromptPart)
    # Kept messages: every field as when the model first saw them (the responses'
    # provider ids, metadata, thinking signatures; the requests' timestamps).
    first_seen: dict[int, Any] = {}
    for request, snapshot in zip(fn.received, fn.snapshots, strict=True):
        for m, snap in zip(request, snapshot, strict=True):
            seen = first_seen.setdefault(id(m), snap)
            assert snap == seen, f"message {m} changed"
    assert compactions
    hook_dropped = [e for call in recorder.calls for e in call["dropped"]]
    adapter_dropped = [e for c in compactions for e in c.result.dropped]
    assert [e.id for e in hook_dropped] == [e.id for e in adapter_dropped]
    dropped_calls = {u.id for e in hook_dropped for u in e.tool_uses}
    # calls no longer in the history (a response the compactor changed, say by stripping
    # its thinking, is removed and replaced, its calls kept)
    removed_calls = {
        cid for c in compactions for cid in _call_ids(c.removed) - _call_ids(c.messages)
    }
    assert dropped_calls == removed_calls
    assert dropped_calls, "tool rounds were dropped"


def test_a_long_agent_session_is_compacted_with_valid_requests(recorder: DroppedRecorder) -> None:
    fn = ScriptedFunction(rounds=6)
    compactions: list[PydanticAICompaction] = []
    proc = NormandyHistoryProcessor(
        "window_manager", OPTS, window=WINDOW, on_compact=compactions.append
    )
    agent = _agent(FunctionModel(fn), proc)
    history: list[ModelMessage] | None = None
    for q in range(4):
        run = agent.run_sync(f"question {q}", message_history=history)
        assert run.output == f"answer {fn.calls - 1}"
        history = run.all_messages()
    assert fn.calls == 4 * 7
    _check_session(fn, compactions, recorder)
    # Without the processor the last request would hold every message: 4 turns of a
    # prompt, 7 responses and 6 result requests; with it, far fewer.
    assert len(fn.received[-1]) < 14
    assert len(compactions) >= 4
    for c in compactions:
        assert c.result.tokens_before > WINDOW - OPTS["reserved_tokens"]
        assert c.result.tokens_after <= WINDOW - OPTS["reserved_tokens"]
    assert any(call["mid_round"] for call in recorder.calls)
    # The run keeps the compacted history: nothing the processor removed comes back.
    assert history is not None
    removed = {id(m) for c in compactions for m in c.removed}
    assert not removed & {id(m) for m in history}


def test_the_async_processor_compacts_the_same_way(recorder: DroppedRecorder) -> None:
    fn = ScriptedFunction(rounds=6)
    compactions: list[PydanticAICompaction] = []
    proc = AsyncNormandyHistoryProcessor(
        "window_manager", OPTS, window=WINDOW, on_compact=compactions.append
    )
    agent = _agent(FunctionModel(fn), proc)

    async def run() -> None:
        history: list[ModelMessage] | None = None
        for q in range(3):
            result = await agent.run(f"q {q}", message_history=history)
            history = result.all_messages()

    asyncio.run(run())
    assert fn.calls == 3 * 7
    _check_session(fn, compactions, recorder)


def test_a_test_model_agent_is_compacted_too(recorder: DroppedRecorder) -> None:
    compactions: list[PydanticAICompaction] = []
    proc = NormandyHistoryProcessor(
        "window_manager", {"reserved_tokens": 300}, window=1500, on_compact=compactions.append
    )
    agent = _agent(TestModel(), proc)
    history: list[ModelMessage] | None = None
    for q in range(8):
        history = agent.run_sync(f"question {q}", message_history=history).all_messages()
    assert history is not None and compactions
    assert pairing_problems(history) == []
    uses = [u.id for c in recorder.calls for e in c["dropped"] for u in e.tool_uses]
    assert uses == ["pyd_ai_tool_call_id__read_chunk"]  # TestModel's round, dropped whole
    assert isinstance(history[0].parts[0], SystemPromptPart)


def test_repeated_call_ids_are_paired_per_round(recorder: DroppedRecorder) -> None:
    """A model that gives every call of a tool the same id (as TestModel does in each run):
    each result still pairs with the call of the response right before it."""
    fn = ScriptedFunction(rounds=6, fixed_ids=True)
    compactions: list[PydanticAICompaction] = []
    proc = NormandyHistoryProcessor(
        "window_manager", OPTS, window=WINDOW, on_compact=compactions.append
    )
    agent = _agent(FunctionModel(fn), proc)
    history: list[ModelMessage] | None = None
    for q in range(3):
        history = agent.run_sync(f"question {q}", message_history=history).all_messages()
    assert fn.calls == 3 * 7 and compactions
    for n, request in enumerate(fn.received):
        assert pairing_problems(request) == [], f"request {n}"
    uses = [u.id for c in recorder.calls for e in c["dropped"] for u in e.tool_uses]
    assert "call-read_chunk-0" in uses
    assert any(u.startswith("call-read_chunk-0#") for u in uses)


def test_compactions_are_logged(
    recorder: DroppedRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    fn = ScriptedFunction(rounds=6)
    agent = _agent(
        FunctionModel(fn), NormandyHistoryProcessor("window_manager", OPTS, window=WINDOW)
    )
    with caplog.at_level(logging.INFO, logger="normandy_pydantic_ai"):
        agent.run_sync("go")
    logged = [r for r in caplog.records if r.name == "normandy_pydantic_ai"]
    assert logged and len(logged) == len(recorder.calls)
    assert "NormandyHistoryProcessor() compacted" in logged[0].getMessage()


def test_nothing_happens_while_the_history_fits(recorder: DroppedRecorder) -> None:
    fn = ScriptedFunction(rounds=2)
    compactions: list[PydanticAICompaction] = []
    proc = NormandyHistoryProcessor("window_manager", window=200_000, on_compact=compactions.append)
    run = _agent(FunctionModel(fn), proc).run_sync("short")
    assert compactions == [] and recorder.calls == []
    assert [len(r) for r in fn.received] == [1, 3, 5]
    assert len(run.all_messages()) == 6


def test_options_are_validated_when_the_processor_is_built() -> None:
    with pytest.raises(
        OptionsError, match=r"normandy_pydantic_ai\.NormandyHistoryProcessor\(\)"
    ) as e:
        NormandyHistoryProcessor("window_manager", {"reserved_tokens": -1}, window=WINDOW)
    assert "window_manager" in str(e.value) and "reserved_tokens" in str(e.value)
    with pytest.raises(OptionsError, match=r"(?s)AsyncNormandyHistoryProcessor\(\).*no_such"):
        AsyncNormandyHistoryProcessor("window_manager", {"no_such_option": 1}, window=WINDOW)
    with pytest.raises(UnknownCompactorError, match="no_such_compactor"):
        NormandyHistoryProcessor("no_such_compactor")
    with pytest.raises(OptionsError, match=r"normandy_pydantic_ai\.compact_history\(\)"):
        compact_history([], opts={"keep": -1}, compactor="clear_tool_results")
    with pytest.raises(normandy_core.WindowUnknownError, match="NormandyHistoryProcessor"):
        NormandyHistoryProcessor("window_manager", model="no-such-model-anywhere")


def _session(rounds: int, width: int = 1, prefix: str = "") -> list[ModelMessage]:
    """A finished session of ``rounds`` tool rounds of ``width`` calls each."""
    out: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart("sys"), UserPromptPart("start")])
    ]
    for r in range(rounds):
        calls = [
            ToolCallPart("read_chunk", {"n": r}, tool_call_id=f"{prefix}c{r}-{j}")
            for j in range(width)
        ]
        out.append(
            ModelResponse(
                parts=[
                    ThinkingPart(f"think {r}", signature=f"s{r}"),
                    TextPart(f"round {r}"),
                    *calls,
                ],
                model_name="m",
                provider_response_id=f"{prefix}r{r}",
                metadata={"r": r},
            )
        )
        out.append(
            ModelRequest(
                parts=[
                    ToolReturnPart(
                        "read_chunk", read_chunk(r * 10 + j), tool_call_id=c.tool_call_id
                    )
                    for j, c in enumerate(calls)
                ],
                metadata={"results": r},
            )
        )
    out.append(ModelResponse(parts=[TextPart("done")], provider_response_id=f"{prefix}final"))
    return out


def test_compact_history_keeps_the_very_objects_and_never_orphans(
    recorder: DroppedRecorder,
) -> None:
    messages = _session(12, width=2)
    before = [fingerprint(m) for m in messages]
    out = compact_history(messages, opts=OPTS, window=WINDOW)
    assert len(out) < len(messages)
    assert pairing_problems(out) == [] and thinking_problems(out) == []
    kept = [m for m in out if any(m is o for o in messages)]
    assert kept[0] is messages[0] and kept[-1] is messages[-1]
    assert recorder.calls[0]["dropped"]
    assert [fingerprint(m) for m in messages] == before  # the input is untouched


def test_a_changed_message_keeps_its_other_fields() -> None:
    messages = _session(6)
    done = HistoryCompactor(
        "clear_tool_results", {"trigger_tool_uses": 3, "keep": 1, "clear_tool_inputs": True}
    ).run(messages)
    assert done.compacted
    assert len(done.messages) == len(messages)  # cleared in place
    changed = [(m, o) for m, o in zip(done.messages, messages, strict=True) if m is not o]
    assert changed
    for m, o in changed:
        assert type(m) is type(o)
        assert m.metadata == o.metadata and m.timestamp == o.timestamp
        if isinstance(m, ModelResponse):
            assert isinstance(o, ModelResponse)
            assert m.provider_response_id == o.provider_response_id
            assert [p.tool_call_id for p in m.parts if isinstance(p, ToolCallPart)] == [
                p.tool_call_id for p in o.parts if isinstance(p, ToolCallPart)
            ]
        else:
            new = [p for p in m.parts if isinstance(p, ToolReturnPart)]
            old = [p for p in o.parts if isinstance(p, ToolReturnPart)]
            assert [(p.tool_call_id, p.tool_name) for p in new] == [
                (p.tool_call_id, p.tool_name) for p in old
            ]
            assert [p.content for p in new] != [p.content for p in old]
    assert [id(o) for o in done.removed] == [id(o) for _, o in changed]
    assert pairing_problems(done.messages) == []


def test_an_orphaned_tool_result_is_refused() -> None:
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("hi")]),
        ModelResponse(parts=[TextPart("ok")]),
        ModelRequest(parts=[ToolReturnPart("read_chunk", "stray", tool_call_id="nobody")]),
    ]
    with pytest.raises(TranscriptError, match="nobody"):
        compact_history(messages, window=WINDOW, opts=OPTS)


@given(
    rounds=st.integers(min_value=0, max_value=14),
    width=st.integers(min_value=1, max_value=3),
    window=st.integers(min_value=1200, max_value=6000),
    open_round=st.booleans(),
)
def test_any_history_comes_back_valid_with_kept_objects_unchanged(
    rounds: int, width: int, window: int, open_round: bool
) -> None:
    messages = _session(rounds, width)
    if open_round and rounds:
        messages = messages[:-1]  # the model is about to continue the round
    before = [fingerprint(m) for m in messages]
    done = HistoryCompactor("window_manager", {"reserved_tokens": 200}, window=window).run(messages)
    assert pairing_problems(done.messages) == [] and thinking_problems(done.messages) == []
    assert [fingerprint(m) for m in messages] == before
    originals = {id(m): i for i, m in enumerate(messages)}
    positions = [originals[id(m)] for m in done.messages if id(m) in originals]
    assert positions == sorted(positions)
    assert done.messages[0] is messages[0]  # the system prompt's request is pinned
    if not done.compacted:
        assert done.messages == messages and done.removed == []
    else:
        assert {id(m) for m in done.removed} == set(originals) - {id(m) for m in done.messages}
        assert done.result.tokens_after < done.result.tokens_before

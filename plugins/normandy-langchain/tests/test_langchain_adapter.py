"""normandy-langchain in a real LangChain v1 agent (``create_agent``, LangGraph state and
checkpointer, LangChain's tool node), with a scripted chat model as the only fake."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, strategies as st
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.memory import InMemorySaver
from lc_scripted import ScriptedChatModel, fingerprint, pairing_problems, read_chunk

import normandy_core
from normandy_core import OptionsError, UnknownCompactorError, hookimpl
from normandy_core.transcripts.formats import TranscriptError
from normandy_langchain import (
    EVENT,
    LangChainCompaction,
    MessageCompactor,
    NormandyMiddleware,
    compact_messages,
)

WINDOW = 3000
OPTS = {"reserved_tokens": 500}


class DroppedRecorder:
    """An ``after_compact`` hook plugin registered in code: what each compaction dropped."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @hookimpl
    def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
        self.calls.append(
            {
                "dropped": list(meta["dropped"]),
                "mid_round": ctx.mid_round,
                "kept": [e.id for e in acc.memory],
            }
        )


@pytest.fixture
def recorder() -> Iterator[DroppedRecorder]:
    rec = DroppedRecorder()
    qname = normandy_core.register_hook(rec, "langchain-test-recorder")
    yield rec
    normandy_core.unregister_hook(qname)


def _agent(model: ScriptedChatModel, middleware: NormandyMiddleware) -> Any:
    return create_agent(
        model,
        [read_chunk],
        system_prompt="You read logs and answer.",
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )


def _check_session(
    model: ScriptedChatModel,
    compactions: list[LangChainCompaction],
    recorder: DroppedRecorder,
    final_state: list[BaseMessage],
) -> None:
    """What every long session must show, whatever the compactor."""
    # Every request the model received is one a provider accepts.
    for n, request in enumerate(model.received):
        assert pairing_problems(request) == [], f"request {n}"
    # Kept messages: ids, content and metadata as when the model first saw them.
    first_seen: dict[str, dict[str, Any]] = {}
    for request in model.received:
        assert isinstance(request[0], SystemMessage)  # create_agent's, not the state's
        for m in request[1:]:
            assert m.id, "every message of the state has an id"
            seen = first_seen.setdefault(m.id, fingerprint(m))
            assert fingerprint(m) == seen, f"message {m.id} changed"
    # Something was dropped, and exactly that reached the hook.
    assert compactions
    hook_dropped = [e for call in recorder.calls for e in call["dropped"]]
    adapter_dropped = [e for c in compactions for e in c.result.dropped]
    assert [e.id for e in hook_dropped] == [e.id for e in adapter_dropped]
    dropped_calls = {u.id for e in hook_dropped for u in e.tool_uses}
    removed_calls = {
        c["id"]
        for c in compactions
        for m in c.removed
        if isinstance(m, AIMessage)
        for c in m.tool_calls
    }
    assert dropped_calls == removed_calls
    assert dropped_calls, "tool rounds were dropped"
    # The state holds what the last compaction kept, and nothing it removed.
    removed_ids = {m.id for c in compactions for m in c.removed}
    assert not removed_ids & {m.id for m in final_state}
    kept_last = [m.id for m in compactions[-1].messages]
    assert [m.id for m in final_state][: len(kept_last)] == kept_last


def test_a_long_agent_session_is_compacted_with_valid_requests(recorder: DroppedRecorder) -> None:
    model = ScriptedChatModel(rounds=6)
    compactions: list[LangChainCompaction] = []
    mw = NormandyMiddleware("window_manager", OPTS, window=WINDOW, on_compact=compactions.append)
    agent = _agent(model, mw)
    config = {"configurable": {"thread_id": "long"}}
    for q in range(4):
        out = agent.invoke({"messages": [HumanMessage(f"question {q}", id=f"q{q}")]}, config)
        assert out["messages"][-1].content == f"answer {model.calls - 1}"
    assert model.calls == 4 * 7
    state = agent.get_state(config).values["messages"]
    _check_session(model, compactions, recorder, state)
    # Without the middleware the last request would have held every message: 4 turns of
    # 6 rounds (8 parallel pairs) is 4 * (1 + 6 + 8 + 1) messages; with it, far fewer.
    assert len(model.received[-1]) < 16
    assert len(compactions) >= 4
    for c in compactions:
        assert c.result.tokens_before > WINDOW - OPTS["reserved_tokens"]
        assert c.result.tokens_after <= WINDOW - OPTS["reserved_tokens"]
    # Compactions at an open tool round are reported as mid-round to the hooks.
    assert any(call["mid_round"] for call in recorder.calls)


def test_the_async_agent_compacts_the_same_way(recorder: DroppedRecorder) -> None:
    model = ScriptedChatModel(rounds=6)
    compactions: list[LangChainCompaction] = []
    mw = NormandyMiddleware("window_manager", OPTS, window=WINDOW, on_compact=compactions.append)
    agent = _agent(model, mw)
    config = {"configurable": {"thread_id": "async"}}

    async def run() -> list[BaseMessage]:
        for q in range(3):
            await agent.ainvoke({"messages": [HumanMessage(f"q {q}", id=f"aq{q}")]}, config)
        return (await agent.aget_state(config)).values["messages"]

    state = asyncio.run(run())
    assert model.calls == 3 * 7
    _check_session(model, compactions, recorder, state)


class EventCatcher(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


def test_compactions_are_reported_as_custom_events_and_logged(
    recorder: DroppedRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedChatModel(rounds=6)
    agent = _agent(model, NormandyMiddleware("window_manager", OPTS, window=WINDOW))
    catcher = EventCatcher()
    config: Any = {"configurable": {"thread_id": "events"}, "callbacks": [catcher]}
    with caplog.at_level(logging.INFO, logger="normandy_langchain"):
        agent.invoke({"messages": [HumanMessage("go")]}, config)
        agent.invoke({"messages": [HumanMessage("again")]}, config)
    assert catcher.events, "no normandy_compaction event"
    for name, data in catcher.events:
        assert name == EVENT
        assert data["strategy"] == "oldest_first"
        assert data["tokens_after"] < data["tokens_before"]
        assert data["dropped"] and data["removed_message_ids"]
        assert "window_manager" in data["compactor"]
    assert len(recorder.calls) == len(catcher.events)
    logged = [r for r in caplog.records if r.name == "normandy_langchain"]
    assert len(logged) == len(catcher.events)
    assert "NormandyMiddleware() compacted" in logged[0].getMessage()


def test_nothing_happens_while_the_conversation_fits(recorder: DroppedRecorder) -> None:
    model = ScriptedChatModel(rounds=2)
    compactions: list[LangChainCompaction] = []
    mw = NormandyMiddleware("window_manager", window=200_000, on_compact=compactions.append)
    out = _agent(model, mw).invoke(
        {"messages": [HumanMessage("short")]}, {"configurable": {"thread_id": "fits"}}
    )
    assert compactions == [] and recorder.calls == []
    assert len(out["messages"]) == 1 + 2 * 2 + 1
    assert [len(r) for r in model.received] == [2, 4, 6]  # with the system prompt


def test_options_are_validated_when_the_middleware_is_built() -> None:
    with pytest.raises(OptionsError, match=r"normandy_langchain\.NormandyMiddleware\(\)") as e:
        NormandyMiddleware("window_manager", {"reserved_tokens": -1}, window=WINDOW)
    assert "window_manager" in str(e.value) and "reserved_tokens" in str(e.value)
    with pytest.raises(OptionsError, match=r"(?s)NormandyMiddleware\(\).*no_such_option"):
        NormandyMiddleware("window_manager", {"no_such_option": 1}, window=WINDOW)
    with pytest.raises(UnknownCompactorError, match="no_such_compactor"):
        NormandyMiddleware("no_such_compactor")
    with pytest.raises(OptionsError, match=r"normandy_langchain\.compact_messages\(\)"):
        compact_messages([HumanMessage("x")], opts={"keep": -1}, compactor="clear_tool_results")


def test_a_compactor_that_needs_a_window_without_one_is_refused_at_build_time() -> None:
    with pytest.raises(normandy_core.WindowUnknownError, match="NormandyMiddleware"):
        NormandyMiddleware("window_manager", model="no-such-model-anywhere")


def _session(rounds: int, width: int = 1, prefix: str = "") -> list[BaseMessage]:
    """A finished session of ``rounds`` tool rounds of ``width`` calls each, every message
    with an id and metadata of its own."""
    out: list[BaseMessage] = [HumanMessage("start", id=f"{prefix}h0")]
    for r in range(rounds):
        calls = [
            {"name": "read_chunk", "args": {"n": r}, "id": f"{prefix}c{r}-{j}"}
            for j in range(width)
        ]
        out.append(
            AIMessage(
                f"round {r}",
                id=f"{prefix}a{r}",
                tool_calls=calls,
                additional_kwargs={"k": r},
                response_metadata={"model_name": "m", "r": r},
            )
        )
        out.extend(
            ToolMessage(read_chunk.invoke({"n": r}), tool_call_id=c["id"], id=f"{prefix}t{r}-{j}")
            for j, c in enumerate(calls)
        )
    out.append(AIMessage("done", id=f"{prefix}final"))
    return out


def test_compact_messages_keeps_the_very_objects_and_never_orphans(
    recorder: DroppedRecorder,
) -> None:
    messages = _session(12, width=2)
    out = compact_messages(messages, opts=OPTS, window=WINDOW)
    assert len(out) < len(messages)
    assert pairing_problems(out) == []
    originals = {id(m) for m in messages}
    kept = [m for m in out if id(m) in originals]
    assert kept, "the newest messages are kept"
    # Kept messages are the caller's own objects, in their order.
    assert [messages.index(m) for m in kept] == sorted(messages.index(m) for m in kept)
    assert [e.id for e in recorder.calls[0]["dropped"]]
    # The input list is untouched.
    assert [m.id for m in messages] == [m.id for m in _session(12, width=2)]


def test_a_changed_message_keeps_its_id_and_metadata() -> None:
    messages = _session(6)
    done = MessageCompactor(
        "clear_tool_results", {"trigger_tool_uses": 3, "keep": 1, "clear_tool_inputs": True}
    ).run(messages)
    assert done.compacted
    assert [m.id for m in done.messages] == [m.id for m in messages]  # cleared in place
    changed = [m for m, o in zip(done.messages, messages, strict=True) if m is not o]
    assert changed
    for m in changed:
        o = next(x for x in messages if x.id == m.id)
        assert type(m) is type(o)
        assert m.additional_kwargs == o.additional_kwargs
        assert m.response_metadata == o.response_metadata
        if isinstance(m, ToolMessage):
            assert isinstance(o, ToolMessage) and m.tool_call_id == o.tool_call_id
            assert m.content != o.content
        if isinstance(m, AIMessage):
            assert [c["id"] for c in m.tool_calls] == [c["id"] for c in o.tool_calls]
    changed_ids = {m.id for m in changed}
    assert [id(o) for o in done.removed] == [id(o) for o in messages if o.id in changed_ids]
    assert pairing_problems(done.messages) == []


def _claude_session(rounds: int) -> list[BaseMessage]:
    """A Claude conversation as ChatAnthropic leaves it: thinking, text and tool_use
    blocks in each AIMessage's content, the calls in ``tool_calls`` too."""
    messages: list[BaseMessage] = [HumanMessage("Fix the parser.", id="task")]
    for k in range(rounds):
        think = {"type": "thinking", "thinking": f"plan {k} " * 30, "signature": f"sig{k}"}
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": "read", "input": {"p": k}}
        messages.append(
            AIMessage(
                content=[think, {"type": "text", "text": f"reading {k}"}, use],
                tool_calls=[{"id": f"toolu_{k}", "name": "read", "args": {"p": k}}],
                id=f"a{k}",
                response_metadata={"model_name": "claude-sonnet-4-5", "stop_reason": "tool_use"},
            )
        )
        messages.append(ToolMessage("x " * 200, tool_call_id=f"toolu_{k}", id=f"r{k}"))
    return messages


def test_a_claude_conversation_with_thinking_blocks_compacts_valid() -> None:
    messages = _claude_session(20)
    done = MessageCompactor(window=WINDOW, opts=OPTS).run(messages)
    assert done.compacted and pairing_problems(done.messages) == []
    by_id = {m.id: m for m in messages}
    kept_ai = [m for m in done.messages if isinstance(m, AIMessage)]
    assert kept_ai
    for m in kept_ai:
        o = by_id[m.id]
        assert isinstance(o, AIMessage)
        # window_manager strips replayed thinking when it cuts (the contract); the rest
        # of the content, the calls (in content and tool_calls) and metadata are as given
        assert isinstance(m.content, list)
        assert [b["type"] for b in m.content] == ["text", "tool_use"]
        assert m.content[1] == o.content[2] and m.content[0] == o.content[1]
        assert m.tool_calls == o.tool_calls and m.response_metadata == o.response_metadata
    # nothing changed while it fits: the very objects, thinking included
    small = _claude_session(2)
    same = MessageCompactor(window=100_000, opts=OPTS).run(small)
    assert not same.compacted and all(a is b for a, b in zip(same.messages, small, strict=True))


def test_repeated_calls_continue_the_last_compaction_and_see_changes_in_place() -> None:
    """As the middleware calls it before every model call: the list it returned plus new
    messages is compacted as a continuation (only the new messages read and counted)."""
    compactor = MessageCompactor(window=WINDOW, opts=OPTS)
    history = _session(12)
    first = compactor.run(history)
    assert first.compacted and not first.result.continued
    state = list(first.messages)
    continued = 0
    for r in range(12, 20):
        state += _session(r + 1, prefix="n")[-2 - 1 : -1][:2]  # an AIMessage and its result
        done = compactor.run(state)
        continued += done.result.continued
        assert pairing_problems(done.messages) == []
        # what was kept is the very objects handed over
        given = {id(m) for m in state}
        assert all(id(m) in given for m in done.messages if not str(m.id).startswith("normandy-"))
        state = list(done.messages)
    assert continued >= 6
    # a message changed in place since is read again, not taken from the last call
    last_tool = next(m for m in reversed(state) if isinstance(m, ToolMessage))
    last_tool.content = "CHANGED IN PLACE"
    again = compactor.run(state)
    assert any(
        isinstance(m, ToolMessage) and m.content == "CHANGED IN PLACE" for m in again.messages
    )
    assert "CHANGED IN PLACE" in str(again.result.memory.entries()[-1].content) or any(
        "CHANGED IN PLACE" in str(e.content) for e in again.result.memory.entries()
    )


def test_an_orphaned_tool_result_is_refused_naming_the_message() -> None:
    messages = [
        HumanMessage("hi", id="h"),
        ToolMessage("stray", tool_call_id="nobody", id="t"),
    ]
    with pytest.raises(TranscriptError, match="message 1"):
        compact_messages(messages, window=WINDOW, opts=OPTS)


@given(
    rounds=st.integers(min_value=0, max_value=14),
    width=st.integers(min_value=1, max_value=3),
    window=st.integers(min_value=1200, max_value=6000),
    open_round=st.booleans(),
)
def test_any_session_comes_back_valid_with_kept_objects_unchanged(
    rounds: int, width: int, window: int, open_round: bool
) -> None:
    messages = _session(rounds, width)
    if open_round and rounds:
        messages = messages[:-1]  # the model is about to continue the round
    done = MessageCompactor("window_manager", {"reserved_tokens": 200}, window=window).run(messages)
    assert pairing_problems(done.messages) == []
    originals = {id(m): i for i, m in enumerate(messages)}
    positions = [originals[id(m)] for m in done.messages if id(m) in originals]
    assert positions == sorted(positions)
    if not done.compacted:
        assert done.messages == messages and done.removed == []
    else:
        assert {id(m) for m in done.removed} == set(originals) - {id(m) for m in done.messages}
        assert done.result.tokens_after < done.result.tokens_before

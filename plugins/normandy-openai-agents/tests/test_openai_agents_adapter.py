"""normandy-openai-agents in real OpenAI Agents SDK runs (``Runner``, ``SQLiteSession``, the
SDK's tool execution and tracing), with a scripted ``Model`` as the only fake."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, SQLiteSession, set_trace_processors
from agents.memory import SessionSettings
from agents.tracing import TracingProcessor
from agents.tracing.processors import default_processor
from hypothesis import given, strategies as st
from oa_scripted import (
    ScriptedModel,
    chunk_text,
    key,
    pairing_problems,
    read_chunk,
    reasoning_problems,
)

import normandy_core
from normandy_core import OptionsError, UnknownCompactorError, hookimpl
from normandy_core.transcripts.formats import TranscriptError
from normandy_openai_agents import (
    SPAN,
    AgentsCompaction,
    ItemCompactor,
    NormandyInputFilter,
    NormandySession,
)

WINDOW = 3000
OPTS = {"reserved_tokens": 500}
NO_TRACE = RunConfig(tracing_disabled=True)


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
    qname = normandy_core.register_hook(rec, "openai-agents-test-recorder")
    yield rec
    normandy_core.unregister_hook(qname)


def _agent(model: ScriptedModel) -> Agent[Any]:
    return Agent(name="reader", instructions="You read logs.", model=model, tools=[read_chunk])


def _check_requests(model: ScriptedModel) -> None:
    """Every request the model received is one the Responses API accepts, and every item
    it saw twice is the same both times."""
    first_seen: dict[str, Any] = {}
    for n, request in enumerate(model.received):
        assert pairing_problems(request) == [], f"request {n}"
        assert reasoning_problems(request) == [], f"request {n}"
        for item in request:
            seen = first_seen.setdefault(key(item), item)
            assert item == seen, f"item {key(item)} changed"


def _check_dropped(compactions: list[AgentsCompaction], recorder: DroppedRecorder) -> None:
    """What was dropped reached the hook, each entry once, tool rounds among it."""
    assert compactions
    hook = [e.id for call in recorder.calls for e in call["dropped"]]
    assert hook == [e.id for c in compactions for e in c.result.dropped]
    assert len(hook) == len(set(hook)), "an entry reached the hooks twice"
    uses = [u.id for call in recorder.calls for e in call["dropped"] for u in e.tool_uses]
    assert uses and all(u.startswith("call_") for u in uses)


def test_a_long_run_without_a_session_is_compacted_by_the_input_filter(
    recorder: DroppedRecorder,
) -> None:
    model = ScriptedModel(rounds=16)
    compactions: list[AgentsCompaction] = []
    filt = NormandyInputFilter("window_manager", OPTS, window=WINDOW, on_compact=compactions.append)
    config = RunConfig(call_model_input_filter=filt, tracing_disabled=True)
    result = Runner.run_sync(_agent(model), "read the whole log", run_config=config, max_turns=40)
    assert result.final_output == "answer 16"
    assert model.calls == 17
    _check_requests(model)
    _check_dropped(compactions, recorder)
    # Unfiltered, the last request would hold 1 + 16 rounds of 3 or 4 items; every
    # request stays inside the window.
    assert len(model.received[-1]) < 20
    for c in compactions:
        assert c.result.tokens_after <= WINDOW - OPTS["reserved_tokens"]
    assert all(call["mid_round"] for call in recorder.calls)  # always inside a tool round
    # after the first, calls continue the last one (only the new items read and counted)
    assert any(c.result.continued for c in compactions[1:])
    # the user's question is kept (the task) in every request
    assert all(r[0] == {"content": "read the whole log", "role": "user"} for r in model.received)


def test_a_session_keeps_its_items_within_the_window(
    recorder: DroppedRecorder, tmp_path: Path
) -> None:
    model = ScriptedModel(rounds=2)
    compactions: list[AgentsCompaction] = []
    store = SQLiteSession("long", tmp_path / "sessions.sqlite3")
    session = NormandySession(
        store, "window_manager", OPTS, window=WINDOW, on_compact=compactions.append
    )
    for q in range(8):
        result = Runner.run_sync(
            _agent(model), f"question {q}", session=session, run_config=NO_TRACE
        )
        assert result.final_output == f"answer {model.calls - 1}"
    assert model.calls == 8 * 3
    _check_requests(model)
    _check_dropped(compactions, recorder)
    # the store holds the compacted history plus the last run: far fewer than 8 runs' items
    stored = asyncio.run(store.get_items())
    assert len(stored) < 8 * 9
    assert pairing_problems(stored) == []
    assert not any(call["mid_round"] for call in recorder.calls)
    # a session read again with nothing new compacts nothing more
    before = len(recorder.calls)
    asyncio.run(session.get_items())
    asyncio.run(session.get_items())
    assert len(recorder.calls) <= before + 1


def test_a_session_and_the_filter_together_in_memory(recorder: DroppedRecorder) -> None:
    model = ScriptedModel(rounds=6)
    compactions: list[AgentsCompaction] = []
    session = NormandySession(
        SQLiteSession("mem"), "window_manager", OPTS, window=WINDOW, on_compact=compactions.append
    )
    filt = NormandyInputFilter("window_manager", OPTS, window=WINDOW, on_compact=compactions.append)
    config = RunConfig(call_model_input_filter=filt, tracing_disabled=True)

    async def run() -> None:
        for q in range(3):
            await Runner.run(_agent(model), f"q {q}", session=session, run_config=config)

    asyncio.run(run())
    assert model.calls == 3 * 7
    _check_requests(model)
    assert compactions
    for n, request in enumerate(model.received):
        assert len(request) < 20, f"request {n}"


class SpanCollector(TracingProcessor):
    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_trace_start(self, trace: Any) -> None:
        pass

    def on_trace_end(self, trace: Any) -> None:
        pass

    def on_span_start(self, span: Any) -> None:
        pass

    def on_span_end(self, span: Any) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


@pytest.fixture
def spans() -> Iterator[SpanCollector]:
    collector = SpanCollector()
    set_trace_processors([collector])
    yield collector
    set_trace_processors([default_processor()])


def test_compactions_are_traced_and_logged(
    recorder: DroppedRecorder, spans: SpanCollector, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(rounds=10)
    filt = NormandyInputFilter("window_manager", OPTS, window=WINDOW)
    with caplog.at_level(logging.INFO, logger="normandy_openai_agents"):
        Runner.run_sync(
            _agent(model), "go", run_config=RunConfig(call_model_input_filter=filt), max_turns=20
        )
    ours = [s for s in spans.spans if getattr(s.span_data, "name", None) == SPAN]
    assert ours and len(ours) == len(recorder.calls)
    for s in ours:
        data = s.span_data.data
        assert data["strategy"] == "oldest_first" and "window_manager" in data["compactor"]
        assert data["tokens_after"] < data["tokens_before"] and data["dropped"]
        assert s.trace_id  # inside the run's trace
    logged = [r for r in caplog.records if r.name == "normandy_openai_agents"]
    assert len(logged) == len(ours)
    assert "NormandyInputFilter() compacted" in logged[0].getMessage()


def test_options_are_validated_when_the_adapters_are_built() -> None:
    with pytest.raises(OptionsError, match=r"normandy_openai_agents\.NormandySession\(\)") as e:
        NormandySession(SQLiteSession("x"), "window_manager", {"reserved_tokens": -1}, window=10)
    assert "window_manager" in str(e.value) and "reserved_tokens" in str(e.value)
    with pytest.raises(OptionsError, match=r"(?s)NormandyInputFilter\(\).*no_such_option"):
        NormandyInputFilter("window_manager", {"no_such_option": 1}, window=WINDOW)
    with pytest.raises(UnknownCompactorError, match="no_such_compactor"):
        NormandyInputFilter("no_such_compactor")
    with pytest.raises(normandy_core.WindowUnknownError, match="NormandySession"):
        NormandySession(SQLiteSession("x"), "window_manager", model="no-such-model-anywhere")
    limited = SQLiteSession("x", session_settings=SessionSettings(limit=5))
    with pytest.raises(ValueError, match=r"NormandySession\(\).*limit=5"):
        NormandySession(limited, window=WINDOW)


def _items(rounds: int, width: int = 1) -> list[dict[str, Any]]:
    """A finished Responses history of ``rounds`` tool rounds of ``width`` calls each."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for r in range(rounds):
        out.append({"type": "reasoning", "id": f"rs_{r}", "summary": []})
        calls = [
            {
                "type": "function_call",
                "id": f"fc_{r}_{j}",
                "call_id": f"call_{r}_{j}",
                "name": "read_chunk",
                "arguments": json.dumps({"n": r}),
            }
            for j in range(width)
        ]
        out.extend(calls)
        out.extend(
            {"type": "function_call_output", "call_id": c["call_id"], "output": chunk_text(r)}
            for c in calls
        )
    out.append(
        {
            "type": "message",
            "id": "msg_final",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        }
    )
    return out


def test_get_items_with_a_limit_never_starts_with_an_output() -> None:
    async def run() -> list[list[Any]]:
        store = SQLiteSession("limits")
        await store.add_items(_items(6, width=2))  # type: ignore[arg-type]
        session = NormandySession(store, window=200_000)
        return [await session.get_items(limit=n) for n in range(1, 12)]

    for n, got in enumerate(asyncio.run(run()), start=1):
        assert len(got) <= n
        assert pairing_problems(got) == [] and reasoning_problems(got) == [], n
        assert got == _items(6, width=2)[-len(got) :] if got else True


def test_a_provider_compaction_item_is_kept() -> None:
    items = [
        {"role": "user", "content": "start"},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque summary"},
        *_items(10)[1:],
    ]
    done = ItemCompactor("window_manager", OPTS, window=WINDOW, entry="test").run(items)
    assert done.compacted
    assert items[1] in done.items and done.items[done.items.index(items[1])] is items[1]
    assert pairing_problems(done.items) == [] and reasoning_problems(done.items) == []


def test_an_orphaned_output_is_refused_naming_the_item() -> None:
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call_output", "call_id": "nobody", "output": "stray"},
    ]
    with pytest.raises(TranscriptError, match=r"message 1"):
        ItemCompactor(opts=OPTS, window=WINDOW, entry="test").run(items)


@given(
    rounds=st.integers(min_value=0, max_value=14),
    width=st.integers(min_value=1, max_value=3),
    window=st.integers(min_value=1200, max_value=6000),
    open_round=st.booleans(),
)
def test_any_history_comes_back_valid_with_kept_items_unchanged(
    rounds: int, width: int, window: int, open_round: bool
) -> None:
    items = _items(rounds, width)
    if open_round and rounds:
        items = items[:-1]  # the model is about to continue the round
    snapshot = json.loads(json.dumps(items))
    done = ItemCompactor("window_manager", {"reserved_tokens": 200}, window=window, entry="t").run(
        items
    )
    assert items == snapshot
    assert pairing_problems(done.items) == [] and reasoning_problems(done.items) == []
    originals = {id(m): i for i, m in enumerate(items)}
    positions = [originals[id(m)] for m in done.items if id(m) in originals]
    assert positions == sorted(positions)
    if not done.compacted:
        assert done.items == items and done.removed == []
    else:
        assert {id(m) for m in done.removed} == set(originals) - {id(m) for m in done.items}
        assert done.result.tokens_after < done.result.tokens_before


def test_a_sqlite_session_is_rewritten_in_one_transaction(tmp_path: Path) -> None:
    """A failure while the compacted items are written leaves the stored history as it
    was (the SDK's SQLiteSession replaces its rows in one transaction), where clearing
    then adding would have left the session empty."""
    store = SQLiteSession("atomic", tmp_path / "sessions.sqlite3")
    asyncio.run(store.add_items(_items(8, width=2)))  # type: ignore[arg-type]
    before = asyncio.run(store.get_items())
    session = NormandySession(store, "window_manager", OPTS, window=WINDOW)
    real = store._insert_items
    calls = []

    def failing(conn: Any, items: list[Any]) -> None:
        calls.append(len(items))
        raise sqlite3.OperationalError("disk I/O error")

    store._insert_items = failing  # type: ignore[method-assign]
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        asyncio.run(session.get_items())
    assert calls, "the compacted items were being written"
    assert asyncio.run(store.get_items()) == before  # nothing lost
    store._insert_items = real  # type: ignore[method-assign]
    compacted = asyncio.run(session.get_items())
    assert len(compacted) < len(before)
    assert asyncio.run(store.get_items()) == compacted

"""normandy-llamaindex in real LlamaIndex agents (``FunctionAgent`` with its workflow, tool
execution and scratchpad), with LlamaIndex's own ``MockFunctionCallingLLM`` driven by a
script as the only fake."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from li_scripted import (
    ScriptedTurns,
    agent,
    finished_session,
    pairing_problems,
    request_problems,
    request_tokens,
    run_session,
)
from llama_index.core.agent.workflow import AgentWorkflow
from llama_index.core.base.llms.types import (
    ChatMessage,
    MessageRole,
    ToolCallBlock,
)

import normandy_core
from normandy_core import hookimpl
from normandy_llamaindex import LlamaIndexCompaction, NormandyMemory

# LlamaIndex's workflows inspect its pydantic models (inspect.getmembers), touching
# attributes pydantic deprecates: thousands of warnings that are not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:inspect")

WINDOW = 4000
# What one run of the agent adds outside the memory (its scratchpad: five responses and
# six results of about 300 tokens), plus the system prompt and the tool's definition.
OPTS = {"reserved_tokens": 2600}
TASK = "Task: read the whole project log and report every error."
PROMPTS = [TASK, *(f"Question {q}: what comes next in the log?" for q in range(1, 9))]
ROUNDS = 5  # per run: 5 model calls with tools (6 tool calls), then the answer


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
    qname = normandy_core.register_hook(rec, "llamaindex-test-recorder")
    yield rec
    normandy_core.unregister_hook(qname)


def _memory(done: list[LlamaIndexCompaction], **kwargs: Any) -> NormandyMemory:
    return NormandyMemory.from_compactor(
        "window_manager", OPTS, window=WINDOW, on_compact=done.append, **kwargs
    )


def _calls(messages: list[ChatMessage]) -> set[str]:
    return {
        b.tool_call_id or "" for m in messages for b in m.blocks if isinstance(b, ToolCallBlock)
    }


def test_a_long_agent_session_sends_only_valid_requests_within_the_window(
    recorder: DroppedRecorder,
) -> None:
    script = ScriptedTurns(rounds=ROUNDS)
    done: list[LlamaIndexCompaction] = []
    run_session(script, _memory(done), PROMPTS)
    assert script.tool_calls() >= 40 and script.calls == len(PROMPTS) * (ROUNDS + 1)
    assert done, "the window is small: the memory compacted"
    for n, request in enumerate(script.received):
        current = PROMPTS[n // (ROUNDS + 1)]
        assert request_problems(request, task=TASK, current=current, window=WINDOW) == [], n
    # Without the memory the last request would hold every message of nine runs.
    assert len(script.received[-1]) < 3 * (ROUNDS + 8)


def test_kept_messages_are_the_stored_objects_unchanged(recorder: DroppedRecorder) -> None:
    script = ScriptedTurns(rounds=ROUNDS)
    done: list[LlamaIndexCompaction] = []
    memory = _memory(done)
    run_session(script, memory, PROMPTS[:5])
    first_seen: dict[int, ChatMessage] = {}
    for request, snapshot in zip(script.received, script.snapshots, strict=True):
        for m, snap in zip(request, snapshot, strict=True):
            assert first_seen.setdefault(id(m), snap) == snap, f"message {m} changed"
    # What a compaction returns is the input's own objects, or a changed copy that
    # keeps the role, the extra fields and the very call blocks of the message it replaces.
    assert done
    for c in done:
        assert not {id(m) for m in c.removed} & {id(m) for m in c.messages}
        by_calls = {frozenset(_calls([o])): o for o in c.removed if _calls([o])}
        for m in c.messages:
            source = by_calls.get(frozenset(_calls([m])))
            if source is None:
                continue
            # a changed copy (its thinking stripped, say): the same role and extra fields,
            # the very call blocks of the message it replaces
            old = [b for b in source.blocks if isinstance(b, ToolCallBlock)]
            new = [b for b in m.blocks if isinstance(b, ToolCallBlock)]
            assert m.role == source.role and m.additional_kwargs == source.additional_kwargs
            assert all(any(n is o for o in old) for n in new)
    stored = {id(m) for m in memory.get_all()}
    sent = {id(m) for request in script.received for m in request}
    assert len(stored & sent) >= 3  # the task, the last question, results kept as they were


def test_dropped_entries_reach_the_hooks_once_across_runs(recorder: DroppedRecorder) -> None:
    script = ScriptedTurns(rounds=ROUNDS)
    done: list[LlamaIndexCompaction] = []
    memory = _memory(done)
    run_session(script, memory, PROMPTS)
    hook_ids = [e.id for call in recorder.calls for e in call["dropped"]]
    assert hook_ids == [e.id for c in done for e in c.result.dropped]
    assert len(hook_ids) == len(set(hook_ids)), "an entry reached the hooks twice"
    assert len(recorder.calls) >= len(PROMPTS) - 1  # every run dropped something
    # The calls the hooks received are exactly those gone from the memory, each once.
    hook_calls = [u.id for call in recorder.calls for e in call["dropped"] for u in e.tool_uses]
    assert len(hook_calls) == len(set(hook_calls))
    made = _calls([m for r in script.received for m in r]) | _calls(memory.get_all())
    assert set(hook_calls) == made - _calls(memory.get_all())


def test_the_sync_get_compacts_and_keeps_the_compacted_history(
    recorder: DroppedRecorder,
) -> None:
    messages = finished_session(TASK, 10, width=2)
    done: list[LlamaIndexCompaction] = []
    memory = _memory(done, chat_history=messages)
    got = memory.get()
    assert len(got) < len(messages) and len(done) == 1
    assert pairing_problems(got) == []
    assert got[0] is messages[0] and got[-1] is messages[-1]
    assert all(any(m is o for o in messages) for m in got if m.role == MessageRole.TOOL)
    assert memory.get_all() == got  # the memory keeps the compacted list
    assert memory.get() == got and len(done) == 1  # nothing more to drop
    memory.put(ChatMessage(role=MessageRole.USER, content="and now?"))
    assert memory.get()[-1].content == "and now?"


def test_an_agent_workflow_reads_the_same_memory(recorder: DroppedRecorder) -> None:
    """``AgentWorkflow`` (the multi-agent form) takes the memory the same way."""
    script = ScriptedTurns(rounds=ROUNDS)
    done: list[LlamaIndexCompaction] = []
    memory = _memory(done)
    workflow = AgentWorkflow(agents=[agent(script)])

    async def session() -> None:
        for prompt in PROMPTS[:5]:
            await workflow.run(user_msg=prompt, memory=memory)

    asyncio.run(session())
    assert script.calls == 5 * (ROUNDS + 1) and done
    for n, request in enumerate(script.received):
        current = PROMPTS[n // (ROUNDS + 1)]
        assert request_problems(request, task=TASK, current=current, window=WINDOW) == [], n


def test_within_one_run_the_scratchpad_grows_outside_the_memory(
    recorder: DroppedRecorder,
) -> None:
    """The limit of a memory: ``FunctionAgent`` sends ``memory.aget()`` followed by the
    run's scratchpad (its calls and results so far), and writes the scratchpad to the
    memory only when the run ends. What the memory returns fits its budget at every
    step; a run long enough to outgrow ``reserved_tokens`` on its own is not compacted."""
    script = ScriptedTurns(rounds=14)
    done: list[LlamaIndexCompaction] = []
    memory = _memory(done)
    run_session(script, memory, [TASK, "Question 1: read on."])
    budget = WINDOW - OPTS["reserved_tokens"]
    for request in script.received:
        current = max(i for i, m in enumerate(request) if m.role == MessageRole.USER)
        assert request_tokens(request[: current + 1]) <= budget  # the memory's part
    assert request_tokens(script.received[-1]) > WINDOW  # the scratchpad's growth
    assert done  # the first run's messages were compacted before the second began

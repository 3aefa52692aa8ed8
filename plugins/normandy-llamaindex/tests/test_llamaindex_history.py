"""normandy-llamaindex on its own: bad input refused, the async path, OpenAI-style calls in
``additional_kwargs``, and any history coming back valid (Hypothesis)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given, strategies as st
from li_scripted import (
    ScriptedTurns,
    arun_session,
    finished_session,
    pairing_problems,
    read_chunk,
    request_problems,
)
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms import MockLLM

import normandy_core
from normandy_core import OptionsError, UnknownCompactorError
from normandy_core.transcripts.formats import TranscriptError
from normandy_llamaindex import (
    ChatCompactor,
    LlamaIndexCompaction,
    NormandyMemory,
    compact_chat_history,
)

# LlamaIndex's workflows inspect its pydantic models (inspect.getmembers), touching
# attributes pydantic deprecates: thousands of warnings that are not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:inspect")

WINDOW = 4000
TASK = "Task: read the log."


def test_a_bad_option_or_name_is_refused_when_the_memory_is_built() -> None:
    with pytest.raises(
        OptionsError, match=r"normandy_llamaindex\.NormandyMemory\.from_compactor\(\)"
    ) as e:
        NormandyMemory.from_compactor("window_manager", {"reserved_tokens": -1}, window=WINDOW)
    assert "window_manager" in str(e.value) and "reserved_tokens" in str(e.value)
    with pytest.raises(
        OptionsError, match=r"(?s)from_compactor\(\).*'clear_tool_results'.*no_such_option"
    ):
        NormandyMemory.from_compactor("clear_tool_results", {"no_such_option": 1})
    with pytest.raises(UnknownCompactorError, match="no_such_compactor"):
        NormandyMemory.from_compactor("no_such_compactor")
    with pytest.raises(OptionsError, match=r"normandy_llamaindex\.compact_chat_history\(\)"):
        compact_chat_history([], compactor="clear_tool_results", opts={"keep": -1})
    with pytest.raises(normandy_core.WindowUnknownError, match=r"NormandyMemory"):
        NormandyMemory.from_compactor("window_manager", model="no-such-model-anywhere")


def test_from_defaults_takes_the_window_from_the_llm() -> None:
    memory = NormandyMemory.from_defaults(llm=MockLLM(), opts={"reserved_tokens": 100})
    window = memory.compactor.config.compactor_opts["context_window"]
    assert window == MockLLM().metadata.context_window
    assert memory.compactor.compactor == "window_manager"


def test_a_broken_tool_pairing_is_refused_naming_the_message() -> None:
    orphan = [
        ChatMessage(role=MessageRole.USER, content="hi"),
        ChatMessage(
            role=MessageRole.TOOL, content="stray", additional_kwargs={"tool_call_id": "nobody"}
        ),
    ]
    with pytest.raises(TranscriptError, match="nobody"):
        compact_chat_history(orphan, window=20_000)
    no_id = [ChatMessage(role=MessageRole.TOOL, content="result")]
    with pytest.raises(TranscriptError, match=r"message 0.*tool_call_id"):
        compact_chat_history(no_id, window=20_000)


def test_openai_style_calls_in_additional_kwargs_are_paired() -> None:
    """Integrations that list calls in ``additional_kwargs["tool_calls"]`` (OpenAI's
    shape) are read the same way as ``ToolCallBlock`` blocks."""
    messages = [ChatMessage(role=MessageRole.USER, content=TASK)]
    for r in range(12):
        call = {
            "id": f"oa-{r}",
            "type": "function",
            "function": {"name": "read_chunk", "arguments": f'{{"n": {r}}}'},
        }
        messages.append(
            ChatMessage(
                role=MessageRole.ASSISTANT, content="", additional_kwargs={"tool_calls": [call]}
            )
        )
        messages.append(
            ChatMessage(
                role=MessageRole.TOOL,
                content=read_chunk(r),
                additional_kwargs={"tool_call_id": f"oa-{r}"},
            )
        )
    done = ChatCompactor("window_manager", {"reserved_tokens": 200}, window=2000).run(messages)
    assert done.compacted and done.messages[0] is messages[0]
    kept_calls = {c["id"] for m in done.messages for c in m.additional_kwargs.get("tool_calls", [])}
    kept_results = {
        m.additional_kwargs["tool_call_id"] for m in done.messages if m.role == MessageRole.TOOL
    }
    assert kept_calls == kept_results and kept_calls
    assert {e.id for e in done.result.dropped}


def test_the_async_path_serves_two_sessions_on_one_loop() -> None:
    """``aget`` runs the compactor off the loop: two agents with a memory each run
    interleaved on one loop, and every request of both is valid."""
    scripts = [ScriptedTurns(rounds=5), ScriptedTurns(rounds=5)]
    done: list[list[LlamaIndexCompaction]] = [[], []]
    memories = [
        NormandyMemory.from_compactor(
            "window_manager", {"reserved_tokens": 2600}, window=WINDOW, on_compact=d.append
        )
        for d in done
    ]
    prompts = [[f"{TASK} ({s})", *(f"{s}: question {q}" for q in range(1, 6))] for s in "ab"]

    async def both() -> None:
        await asyncio.gather(
            *(arun_session(s, m, p) for s, m, p in zip(scripts, memories, prompts, strict=True))
        )

    asyncio.run(both())
    for script, made, said in zip(scripts, done, prompts, strict=True):
        assert script.calls == 6 * 6 and made
        dropped = [e.id for c in made for e in c.result.dropped]
        assert len(dropped) == len(set(dropped))  # each dropped once, though interleaved
        for n, request in enumerate(script.received):
            current = said[n // 6]
            assert request_problems(request, task=said[0], current=current, window=WINDOW) == []


def test_aget_gives_what_get_gives(caplog: pytest.LogCaptureFixture) -> None:
    memory = NormandyMemory.from_compactor("window_manager", {"reserved_tokens": 200}, window=2000)
    memory.set(finished_session(TASK, 8))
    with caplog.at_level(logging.INFO, logger="normandy_llamaindex"):
        got = asyncio.run(memory.aget())
    assert got == memory.get() == memory.get_all()
    assert pairing_problems(got) == []
    assert any(
        "NormandyMemory.from_compactor() compacted" in r.getMessage() for r in caplog.records
    )


@given(
    rounds=st.integers(min_value=0, max_value=12),
    width=st.integers(min_value=1, max_value=3),
    window=st.integers(min_value=1500, max_value=6000),
    open_round=st.booleans(),
)
def test_any_history_comes_back_valid_with_kept_objects_unchanged(
    rounds: int, width: int, window: int, open_round: bool
) -> None:
    messages = finished_session(TASK, rounds, width)
    if open_round and rounds:
        messages = messages[:-1]  # the last results are in: the model is about to continue
    before = [m.model_copy(deep=True) for m in messages]
    done = ChatCompactor("window_manager", {"reserved_tokens": 200}, window=window).run(messages)
    assert pairing_problems(done.messages) == []
    assert messages == before  # the input is untouched
    originals = {id(m): i for i, m in enumerate(messages)}
    positions = [originals[id(m)] for m in done.messages if id(m) in originals]
    assert positions == sorted(positions)
    assert done.messages[0] is messages[0]  # the task survives
    if done.compacted:
        assert {id(m) for m in done.removed} == set(originals) - {id(m) for m in done.messages}
        assert done.result.tokens_after < done.result.tokens_before
    else:
        assert done.messages == messages and done.removed == []

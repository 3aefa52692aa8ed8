"""``normandy_core.compact()``: both formats, the odd-input rules, options, errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import normandy_core
from normandy_core import OptionsError, TranscriptError, UnknownCompactorError, compact
from normandy_core.conversation.structure import pairing_problems
from normandy_core.transcripts.anthropic import from_anthropic
from normandy_core.transcripts.chat import from_openai


def test_openai_list(openai_messages: Any) -> None:
    original = copy.deepcopy(openai_messages)
    result = compact(openai_messages, window=20_000)
    assert openai_messages == original  # never mutated
    assert result.compacted and result.format == "openai"
    assert result.meta["tokens_after"] < result.meta["tokens_before"]
    assert result.dropped and result.error is None
    assert isinstance(result.messages, list)
    assert pairing_problems(from_openai(result.messages).entries(), allow_pending=False) == []


def test_anthropic_dict_keeps_shape(anthropic_payload: Any) -> None:
    payload = {**anthropic_payload, "model": "claude-sonnet-4-5", "max_tokens": 1024}
    result = compact(payload, model="claude-sonnet-4-5", opts={"context_window": 20_000})
    assert result.format == "anthropic"
    out = result.messages
    assert out["model"] == "claude-sonnet-4-5" and out["max_tokens"] == 1024
    assert out["system"] == anthropic_payload["system"]
    memory = from_anthropic(out["messages"], out["system"])
    assert pairing_problems(memory.entries(), allow_pending=False) == []
    assert len(out["messages"]) < len(anthropic_payload["messages"])


def test_not_compacted_returns_input_unchanged(openai_messages: Any) -> None:
    result = compact(openai_messages, compactor="noop")
    assert not result.compacted
    assert result.messages == openai_messages and result.messages is not openai_messages
    small = openai_messages[:3]
    assert compact(small, window=200_000).messages == small


def test_lazy_export() -> None:
    assert "compact" in normandy_core.__all__
    assert normandy_core.compact is compact


def test_options_validated_with_entry(openai_messages: Any) -> None:
    with pytest.raises(OptionsError, match=r"(?s)^normandy_core\.compact\(\): .*'trigger'"):
        compact(openai_messages, window=9000, opts={"trigger": 3})
    with pytest.raises(OptionsError, match="contradicts"):
        compact(openai_messages, window=9000, opts={"context_window": 8000})
    with pytest.raises(UnknownCompactorError, match="window_manager"):
        compact(openai_messages, compactor="nope")


def test_orphan_result_and_unknown_role() -> None:
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "x", "content": "out"},
    ]
    with pytest.raises(TranscriptError) as info:
        compact(msgs, window=9000)
    assert (info.value.index, info.value.field) == (1, "tool_call_id")  # OpenAI vocabulary
    with pytest.raises(TranscriptError, match="message 0, field 'role'"):
        compact([{"role": "bot", "content": "x"}], window=9000, format="anthropic")
    block = {"hologram": True}  # a block needs a type; an unknown type is carried as given
    with pytest.raises(TranscriptError, match=r"content\[0\]\.type"):
        compact([{"role": "user", "content": [block]}], window=9000, format="anthropic")


def test_duplicate_tool_use_ids_anthropic() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    res = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [res]},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [res]},
    ]
    with pytest.raises(TranscriptError, match="already used by message 1") as info:
        compact(msgs, window=9000)
    assert info.value.index == 3


def test_pending_tool_use_only_at_the_end() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [use]}]
    assert compact(msgs, window=9000, mid_round=True).messages == msgs
    with pytest.raises(TranscriptError, match="has no result"):
        compact([*msgs, {"role": "user", "content": "and?"}], window=9000)


def test_bad_format_name() -> None:
    with pytest.raises(ValueError, match="format must be one of"):
        compact([], window=9000, format="xml")  # type: ignore[arg-type]


def test_normandy_memory_in_and_out() -> None:
    from normandy_core.app.workload import generate_session

    memory = generate_session(2, messages=60)
    result = compact(memory, window=12_000, model="claude-sonnet-4-5")
    assert result.format == "normandy" and result.compacted
    assert result.messages is result.memory and len(result.memory) < len(memory)
    assert len(memory) >= 60  # the caller's memory is unchanged
    dumped = compact(memory.dump(), window=12_000).messages
    assert dumped["format"] == "normandy.memory"


def test_compactor_error_returns_input(openai_messages: Any) -> None:
    huge = [{"role": "user", "content": "word " * 4000}]
    result = compact(huge, window=3000, opts={"reserved_tokens": 500})
    assert not result.compacted and result.error and "cannot fit" in result.error
    assert result.messages == huge


def parallel_openai_session(rounds: int, calls: int = 3) -> list[dict[str, Any]]:
    """A user request, then ``rounds`` assistant messages each calling ``calls`` tools."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read every module and find the bug."},
    ]
    for r in range(rounds):
        ids = [f"call_{r}_{k}" for k in range(calls)]
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": f'{{"path": "m{i}.py"}}'},
                    }
                    for i in ids
                ],
            }
        )
        msgs.extend(
            {"role": "tool", "tool_call_id": i, "content": f"def {i}(x):\n    return x\n" * 20}
            for i in ids
        )
    return msgs


@pytest.mark.parametrize("strategy", ["oldest_first", "summarize"])
def test_the_marker_text_is_true_in_the_callers_format(strategy: str) -> None:
    """Issue 12: "[69 earlier messages removed]" when 80 OpenAI messages were removed: the
    marker (and the summary's header) counted internal entries (one per batch of tool
    results), not the caller's messages."""
    import re

    msgs = parallel_openai_session(30)
    opts = {"reserved_tokens": 1_000, "strategy": strategy}
    result = compact(msgs, window=9_000, opts=opts)
    assert result.compacted
    assert ("summary_id" if strategy == "summarize" else "marker_id") in result.meta
    out = result.messages
    assert out[1] is msgs[1] and msgs[1]["role"] == "user"  # the task survives by default
    inserted = [m for m in out[2:] if m["role"] == "user"]
    assert len(inserted) == 1
    removed = len(msgs) - (len(out) - 1)
    head = inserted[0]["content"].splitlines()[0]
    assert "earlier" in head.lower()
    assert re.findall(r"\d+", head) in ([], [str(removed)]), (head, removed)


def test_a_normandy_dump_keeps_its_other_branches() -> None:
    """Found by the fuzz campaign: compact() of a dump returned only the active branch,
    so entries of abandoned branches vanished unreported."""
    from normandy_core import AgentMemory

    mem = AgentMemory()
    for i in range(12):
        mem.add_message("user" if i % 2 == 0 else "assistant", f"m{i} " + "w" * 300, id=f"m{i}")
    side = mem.fork("m3")
    side.add_message("user", "a question on the side", id="side1")
    graph = AgentMemory.from_graph([*mem.all_entries(), side["side1"]], mem.head)
    result = compact(graph.dump(), window=600, opts={"reserved_tokens": 0}, model="gpt-4o")
    assert result.compacted and "m3" in {e.id for e in result.dropped}
    out = AgentMemory.load(result.messages)
    assert out["side1"].parent_id == "m3" and out["m3"].content == mem["m3"].content
    assert [e.id for e in out] == [e.id for e in result.memory]
    assert "m3" not in {e.id for e in out}  # still gone from the active branch

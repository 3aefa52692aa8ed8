"""Conversions between the memory and the Anthropic / OpenAI message formats."""

from __future__ import annotations

import pytest

from normandy_core import (
    AgentMemory,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    pairing_problems,
)
from normandy_core.transcripts.anthropic import from_anthropic, to_anthropic
from normandy_core.transcripts.chat import from_openai, to_openai
from normandy_core.transcripts.detection import detect_format
from normandy_core.transcripts.formats import TranscriptError

PNG = "iVBORw0KGgo="


def session() -> AgentMemory:
    mem = AgentMemory()
    mem.add_message("system", "You are careful.")
    mem.add_message("user", "List the files and read two.", turn_id="t1")
    mem.add_message(
        "assistant",
        (
            ThinkingBlock(thinking="I should list first.", signature="sig-1"),
            TextBlock(text="Listing."),
            ToolUseBlock(id="a", name="ls", input={"path": "."}),
        ),
        turn_id="t1",
    )
    mem.add_message("user", (ToolResultBlock(tool_use_id="a", content="x.py\ny.py"),), turn_id="t1")
    mem.add_message(
        "assistant",
        (
            ToolUseBlock(id="b", name="read", input={"path": "x.py"}),
            ToolUseBlock(id="c", name="read", input={"path": "y.py"}),
        ),
        turn_id="t1",
    )
    mem.add_message(
        "user",
        (
            ToolResultBlock(tool_use_id="b", content="print(1)"),
            ToolResultBlock(tool_use_id="c", content="boom", is_error=True),
        ),
        turn_id="t1",
    )
    mem.add_message("assistant", "x prints 1; y could not be read.", turn_id="t1")
    mem.add_message(
        "user",
        (
            TextBlock(text="What is in this picture?"),
            ImageBlock(source={"type": "base64", "media_type": "image/png", "data": PNG}),
        ),
        turn_id="t2",
    )
    return mem


def test_anthropic_round_trip_keeps_blocks_and_pairs():
    mem = session()
    system, messages = to_anthropic(mem)
    assert system == "You are careful."
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant"] * 3 + ["user"]
    assert messages[1]["content"][0] == {
        "type": "thinking",
        "thinking": "I should list first.",
        "signature": "sig-1",
    }
    assert messages[4]["content"][1]["is_error"] is True
    back = from_anthropic(messages, system=system)
    assert [e.content for e in back] == [e.content for e in mem]
    assert [e.role for e in back] == [e.role for e in mem]
    assert pairing_problems(back.entries()) == []
    # turn ids: a new turn at each user message that is not only tool results
    assert [e.turn_id for e in back][1:] == ["turn-1"] * 6 + ["turn-2"]


def test_to_anthropic_strip_thinking_and_merges_same_role():
    mem = session()
    _, messages = to_anthropic(mem, strip_thinking=True)
    assert all(
        b.get("type") != "thinking" for m in messages for b in m["content"] if type(b) is dict
    )
    m2 = AgentMemory()
    m2.add_message("user", "hi")
    m2.add_message("user", "again")
    _, msgs = to_anthropic(m2)
    assert msgs == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}],
        }
    ]


def test_openai_round_trip_keeps_tool_pairs():
    mem = session()
    messages = to_openai(mem)
    roles = [m["role"] for m in messages]
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
    ]
    assert messages[2]["tool_calls"][0]["function"] == {"name": "ls", "arguments": '{"path": "."}'}
    assert messages[2]["content"] == "Listing."
    assert messages[4]["content"] is None
    assert messages[8]["content"][1]["image_url"]["url"] == f"data:image/png;base64,{PNG}"
    back = from_openai(messages)
    assert pairing_problems(back.entries()) == []
    results = back.entries()[5].tool_results
    assert [r.tool_use_id for r in results] == ["b", "c"]  # one entry, tool-use order
    assert back.entries()[7].content[1].source == {
        "type": "base64",
        "media_type": "image/png",
        "data": PNG,
    }
    assert to_openai(back) == messages  # stable from here on


@pytest.mark.parametrize(
    ("messages", "index", "field"),
    [
        ([{"role": "user", "content": 3}], 0, "content"),
        ([{"role": "robot", "content": "x"}], 0, "role"),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz"}]},
            ],
            1,
            "content[0].tool_use_id",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "q", "name": "f"}]},
                {"role": "user", "content": "no results"},
            ],
            1,
            "content[0].id",
        ),
        ([{"role": "user", "content": [{"kind": "weird"}]}], 0, "content[0].type"),
        ([{"role": "assistant", "content": [{"type": "text"}]}], 0, "content[0].text"),
    ],
)
def test_from_anthropic_errors_name_index_and_field(messages, index, field):
    with pytest.raises(TranscriptError) as info:
        from_anthropic(messages)
    assert info.value.index == index
    assert info.value.field == field
    assert f"message {index}" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("messages", "index", "field"),
    [
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{"}}
                    ],
                }
            ],
            0,
            "tool_calls[0].function.arguments",
        ),
        (
            [{"role": "tool", "tool_call_id": "nope", "content": "r"}],
            0,
            "tool_call_id",
        ),
        ([{"role": "tool", "content": "r"}], 0, "tool_call_id"),
        ([{"role": "user", "content": [{"type": "audio"}]}], 0, "content[0].type"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}],
            0,
            "content[0].image_url.url",
        ),
    ],
)
def test_from_openai_errors_name_index_and_field(messages, index, field):
    with pytest.raises(TranscriptError) as info:
        from_openai(messages)
    assert (info.value.index, info.value.field) == (index, field)


def test_pending_tool_use_allowed_only_when_asked():
    msgs = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "q", "name": "f", "input": {}}],
        },
    ]
    assert len(from_anthropic(msgs)) == 2
    with pytest.raises(TranscriptError, match="no result"):
        from_anthropic(msgs, allow_pending=False)


def test_detect_format():
    mem = session()
    assert detect_format(to_openai(mem)) == "openai"
    assert detect_format(to_anthropic(mem)[1]) == "anthropic"
    assert detect_format(mem.dump()) == "normandy"
    assert detect_format([{"role": "user", "content": "hi"}]) == "openai"
    with pytest.raises(TranscriptError):
        detect_format(3)


def test_images_of_a_batch_split_over_entries_follow_all_its_tool_messages():
    # found by tests/test_bad_input.py: the image of the first result used to sit between
    # the two tool messages, cutting the second from its assistant message
    from normandy_core import ImageBlock

    image = ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "iVBO"})
    mem = AgentMemory()
    mem.add_message("user", "look")
    mem.add_message(
        "assistant",
        (
            ToolUseBlock(id="a", name="shot", input={}),
            ToolUseBlock(id="b", name="shot", input={}),
        ),
    )
    for tid in ("a", "b"):
        mem.add_message(
            "tool", (ToolResultBlock(tool_use_id=tid, content=(TextBlock(text=tid), image)),)
        )
    out = to_openai(mem)
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "tool", "user"]
    assert len(out[-1]["content"]) == 2
    assert pairing_problems(from_openai(out).entries()) == []


def test_openai_messages_given_as_parts_come_back_as_the_same_parts():
    """Found by the fuzz campaign: user (and assistant) content given as several text
    parts came back joined into one string, which counts a token more or less, so a
    second compact() of the output compacted again."""
    from normandy_core.transcripts.chat import from_openai, to_openai

    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}],
        },
        {"role": "user", "content": "plain"},
    ]
    once = to_openai(from_openai(messages))
    assert once[0] == messages[0] and once[2] == messages[2]
    assert to_openai(from_openai(once)) == once  # a second round trip changes nothing

"""Every provider shape through ``compact()``: kept messages come back as the objects given.

The transcripts are written by hand after the shapes the providers publish in their API
references (Chat Completions, Anthropic Messages with server tools, MCP, search results
and compaction, the Responses API item list). Outputs are validated with the official
SDKs' typed request params.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from anthropic.types.beta import BetaMessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from normandy_core import compact
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.transcripts.detection import detect
from normandy_core.transcripts.formats import TranscriptError
from normandy_core.transcripts.transcript import read

CHAT = TypeAdapter(list[ChatCompletionMessageParam])
ANTHROPIC = TypeAdapter(list[BetaMessageParam])
RESPONSES = TypeAdapter(list[ResponseInputItemParam])
SDK_CHECK = {"openai": CHAT, "anthropic": ANTHROPIC, "responses": RESPONSES}

LONG = "the build log says the test suite failed in module parser at line 88. " * 40


def _chat_round(n: int) -> list[dict[str, Any]]:
    call = f"call_{n}"
    return [
        {"role": "user", "content": f"step {n}: read the file", "name": "dev_alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"path":"src/m{n}.py"}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": LONG},
    ]


def chat_transcript() -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "developer", "content": "You are a careful coding agent."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Here is the failing screenshot and the spec."},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://example.com/shot.png", "detail": "low"},
                },
                {"type": "file", "file": {"file_id": "file-abc123"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            ],
        },
        {
            "role": "assistant",
            "content": "I cannot open that link.",
            "refusal": None,
            "annotations": [
                {
                    "type": "url_citation",
                    "url_citation": {
                        "url": "https://example.com",
                        "title": "Example",
                        "start_index": 0,
                        "end_index": 5,
                    },
                }
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_c", "type": "custom", "custom": {"name": "patch", "input": "*** x"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_c", "content": "applied"},
        {"role": "assistant", "content": None, "audio": {"id": "audio_1"}},
    ]
    for n in range(12):
        msgs.extend(_chat_round(n))
    msgs.append({"role": "assistant", "content": "All read.", "name": "agent"})
    return msgs


def anthropic_request() -> dict[str, Any]:
    cached = {"type": "ephemeral"}
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Find the release date.", "cache_control": cached},
                {
                    "type": "search_result",
                    "source": "https://docs.example.com/r",
                    "title": "Releases",
                    "content": [{"type": "text", "text": "1.2 shipped in May."}],
                    "citations": {"enabled": True},
                },
                {"type": "container_upload", "file_id": "file_011"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "compaction", "content": "Earlier: the user asked about releases."},
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_01",
                    "name": "web_search",
                    "input": {"query": "release 1.2 date"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srvtoolu_01",
                    "content": [
                        {
                            "type": "web_search_result",
                            "url": "https://example.com/news",
                            "title": "News",
                            "encrypted_content": "EqgfCioIARgBIiQ3",
                            "page_age": "May 2",
                        }
                    ],
                },
                {
                    "type": "mcp_tool_use",
                    "id": "mcptoolu_01",
                    "name": "lookup",
                    "server_name": "docs",
                    "input": {"q": "1.2"},
                },
                {
                    "type": "mcp_tool_result",
                    "tool_use_id": "mcptoolu_01",
                    "is_error": False,
                    "content": [{"type": "text", "text": "May 2"}],
                },
                {
                    "type": "text",
                    "text": "It shipped on May 2.",
                    "citations": [
                        {
                            "type": "search_result_location",
                            "source": "https://docs.example.com/r",
                            "title": "Releases",
                            "cited_text": "1.2 shipped in May.",
                            "search_result_index": 0,
                            "start_block_index": 0,
                            "end_block_index": 0,
                        }
                    ],
                },
            ],
        },
    ]
    for n in range(12):
        messages.append({"role": "user", "content": f"now check module {n}"})
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": f"I should read m{n}.",
                        "signature": "EuYBCkQYAiJA",
                    },
                    {"type": "tool_use", "id": f"toolu_{n}", "name": "read", "input": {"n": n}},
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{n}",
                        "content": LONG,
                        "cache_control": cached,
                    }
                ],
            }
        )
    messages.append({"role": "assistant", "content": "Done."})
    return {
        "system": [{"type": "text", "text": "You are terse.", "cache_control": cached}],
        "messages": messages,
    }


def responses_items() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "Answer briefly."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What changed?"},
                {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"},
                {"type": "input_file", "file_id": "file-9"},
            ],
        },
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABo-opaque"},
    ]
    for n in range(12):
        items += [
            {"role": "user", "content": f"look at part {n}"},
            {
                "type": "reasoning",
                "id": f"rs_{n}",
                "summary": [{"type": "summary_text", "text": "Plan the read."}],
                "encrypted_content": "gAAAA" + "x" * 40,
            },
            {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": "read",
                "arguments": json.dumps({"part": n}),
            },
            {
                "type": "custom_tool_call",
                "id": f"ctc_{n}",
                "call_id": f"cc_{n}",
                "name": "grep",
                "input": "TODO",
            },
            {"type": "function_call_output", "call_id": f"call_{n}", "output": LONG},
            {"type": "custom_tool_call_output", "call_id": f"cc_{n}", "output": "3 hits"},
        ]
    items.append(
        {
            "type": "message",
            "id": "msg_9",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Finished.", "annotations": []}],
        }
    )
    return items


def _kept_are_given(given: list[Any], out: list[Any]) -> tuple[int, int]:
    """Kept messages are the given objects, in order; returns (kept, new)."""
    positions = {id(m): k for k, m in enumerate(given)}
    last = -1
    kept = new = 0
    for m in out:
        k = positions.get(id(m))
        if k is None:
            new += 1
            continue
        assert k > last, "a kept message moved"
        last = k
        kept += 1
    return kept, new


#: The first user message of these shapes holds an image, a file and audio, more than the
#: usable window: these tests are about shapes, so the task may go (its survival rule off).
_LET_GO = {"keep_first_user": False, "keep_current_request": False}


@pytest.mark.parametrize(
    ("make", "fmt"),
    [(chat_transcript, "openai"), (responses_items, "responses")],
)
def test_a_task_larger_than_the_window_is_named_in_the_irreducible_error(
    make: Any, fmt: str
) -> None:
    """By default the first user message survives; when it alone overflows the window the
    error says so, with its tokens, and the transcript comes back unchanged."""
    data = make()
    result = compact(data, window=8_000, opts={"counter": "cl100k_base"}, model="gpt-4o")
    assert result.format == fmt and not result.compacted
    assert result.messages == data
    error = result.error or ""
    found = re.search(r"keep_first_user \(the first user message\) ([\d,]+);", error)
    assert found, error
    assert int(found.group(1).replace(",", "")) > 3_904  # the usable window, alone
    assert "cannot fit the context window" in error


@pytest.mark.parametrize(
    ("make", "fmt"),
    [(chat_transcript, "openai"), (anthropic_request, "anthropic"), (responses_items, "responses")],
)
@pytest.mark.parametrize("compactor", ["window_manager", "clear_tool_results", "pipeline"])
def test_every_shape_compacts_losslessly(make: Any, fmt: str, compactor: str) -> None:
    data = make()
    pristine = copy.deepcopy(data)
    opts: dict[str, Any] = {"counter": "cl100k_base"}
    if compactor == "clear_tool_results":
        opts = {"trigger_tokens": 2_000, "keep": 2}
    elif compactor == "pipeline":
        opts = {
            "steps": [
                {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 2_000, "keep": 2}},
                {"compactor": "window_manager", "opts": {"counter": "cl100k_base"}},
            ]
        }
    window = 8_000 if compactor != "clear_tool_results" else None
    result = compact(
        data, compactor=compactor, opts=opts, window=window, model="gpt-4o", survival=_LET_GO
    )
    assert result.format == fmt
    assert result.compacted, result.meta
    assert data == pristine  # the input is never mutated
    given = data["messages"] if isinstance(data, dict) else data
    out = result.messages["messages"] if isinstance(data, dict) else result.messages
    kept, _new = _kept_are_given(given, out)
    assert kept > 0
    SDK_CHECK[fmt].validate_python(out)
    if fmt == "anthropic":
        assert result.messages["system"] is data["system"]  # cache_control kept
    # every message of the input is kept as given, changed, or reported dropped
    dropped = len(result.dropped)
    assert dropped or compactor == "clear_tool_results"
    if compactor == "clear_tool_results":
        changed = [m for m in out if all(m is not g for g in given)]
        # same messages, results shortened; stripped thinking takes reasoning items away
        reasoning = sum(1 for g in given if g.get("type") == "reasoning")
        assert changed and len(out) == len(given) - reasoning
        twins = {_key(g): g for g in given}
        for m in changed:  # a shortened message keeps every other field it had
            twin = twins[_key(m)]
            assert set(twin) == set(m)
            if fmt == "anthropic":  # cache_control stays on a shortened result
                kept_blocks = [b for b in twin["content"] if b["type"] != "thinking"]
                for a, b in zip(kept_blocks, m["content"], strict=True):
                    assert set(a) == set(b)


def _key(m: dict[str, Any]) -> Any:
    if "call_id" in m:
        return (m.get("type"), m["call_id"])
    if "tool_call_id" in m:
        return m["tool_call_id"]
    for b in m.get("content") or []:
        if isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result"):
            return (m.get("role"), b.get("id") or b.get("tool_use_id"))
    return json.dumps(m, sort_keys=True)


def test_chat_fields_survive_and_developer_stays_developer() -> None:
    data = chat_transcript()
    result = compact(
        data, window=8_000, opts={"counter": "cl100k_base"}, model="gpt-4o", survival=_LET_GO
    )
    assert result.compacted
    out = result.messages
    assert out[0] is data[0] and out[0]["role"] == "developer"
    named = [m for m in out if m.get("name") == "dev_alice"]
    assert named and all(any(m is g for g in data) for m in named)
    assert out[-1] is data[-1] and out[-1]["name"] == "agent"


def test_anthropic_compaction_block_is_pinned_and_kept() -> None:
    req = anthropic_request()
    result = compact(req, window=7_000, opts={"counter": "cl100k_base"}, model="claude-sonnet-4")
    assert result.compacted
    out = result.messages["messages"]
    assert req["messages"][1] in out  # the assistant message with the compaction block
    assert any(m is req["messages"][1] for m in out)
    entry = next(e for e in result.memory if e.metadata.get(PROVIDER_COMPACTION_KEY))
    assert entry.pinned


def test_responses_reasoning_stays_with_its_calls_and_compaction_item_is_kept() -> None:
    items = responses_items()
    result = compact(
        items, window=7_000, opts={"counter": "cl100k_base"}, model="gpt-4o", survival=_LET_GO
    )
    assert result.format == "responses" and result.compacted
    out = result.messages
    assert any(m is items[2] for m in out)  # the compaction item
    for k, m in enumerate(out):
        if m.get("type") == "reasoning":
            assert out[k + 1].get("type") == "function_call"
        if m.get("type") == "function_call_output":
            call = m["call_id"]
            assert any(x.get("call_id") == call and x.get("type") == "function_call" for x in out)
    RESPONSES.validate_python(out)


def test_sdk_objects_mixed_with_dicts_are_detected_and_returned_as_given() -> None:
    from openai.types.chat import ChatCompletionMessage

    reply = ChatCompletionMessage(role="assistant", content="Hello back.")
    msgs: list[Any] = [{"role": "user", "content": "hello"}, reply]
    for n in range(15):
        msgs += _chat_round(n)
    msgs.append(ChatCompletionMessage(role="assistant", content="done"))
    result = compact(msgs, window=7_000, opts={"counter": "cl100k_base"}, model="gpt-4o")
    assert result.format == "openai" and result.compacted
    assert result.messages[-1] is msgs[-1]


def test_anthropic_sdk_message_objects_in_a_list() -> None:
    from anthropic.types import Message, TextBlock, Usage

    reply = Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-sonnet-4",
        content=[TextBlock(type="text", text="Hi there.")],
        stop_reason="end_turn",
        stop_sequence=None,
        usage=Usage(input_tokens=3, output_tokens=3),
    )
    msgs: list[Any] = [{"role": "user", "content": "hi"}, reply, {"role": "user", "content": "x"}]
    assert detect(msgs) == "openai"  # text only: reads the same in both
    result = compact(msgs, format="anthropic", window=9_000)
    assert result.messages[1] is reply


def test_tuples_and_generators_are_read() -> None:
    msgs = tuple(_chat_round(1))
    result = compact(msgs, window=9_000)
    assert list(result.messages) == list(msgs)
    gen = (m for m in _chat_round(2))
    result = compact(gen, window=9_000)
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool"]


def test_a_partially_answered_batch_is_refused_naming_the_unanswered_call() -> None:
    msgs = [
        {"role": "user", "content": "read three files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{k}", "type": "function", "function": {"name": "r", "arguments": "{}"}}
                for k in range(3)
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "a"},
        {"role": "tool", "tool_call_id": "c1", "content": "b"},
    ]
    with pytest.raises(TranscriptError) as info:
        compact(msgs, window=9_000, mid_round=True)
    err = info.value
    assert (err.index, err.field) == (1, "tool_calls[2].id")
    assert "'c2'" in str(err) and "2 of its batch's 3 calls" in str(err)


@pytest.mark.parametrize(
    ("messages", "index", "field", "needle"),
    [
        (
            [{"type": "function_call_output", "call_id": "zz", "output": "x"}],
            0,
            "call_id",
            "answers no call",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
            ],
            1,
            "content[0].type",
            "a user message cannot hold",
        ),
        (
            [
                {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s1"}]},
            ],
            0,
            "content[0].id",
            "server tool use 's1' has no result block",
        ),
        (
            [
                {"role": "tool", "tool_call_id": "x", "content": "r"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "u1", "name": "f", "input": {}}],
                },
            ],
            1,
            "content[0].type",
            "reads as Anthropic Messages, but message 0",
        ),
    ],
)
def test_errors_name_the_place_in_the_inputs_vocabulary(
    messages: list[Any], index: int, field: str, needle: str
) -> None:
    with pytest.raises(TranscriptError) as info:
        compact(messages, window=9_000)
    assert (info.value.index, info.value.field) == (index, field)
    assert needle in str(info.value)


# -- the round-trip property over generated transcripts of every shape ------------------


def _generated(fmt: str, rnd: Any, rounds: int) -> Any:
    """A transcript of ``rounds`` tool rounds in ``fmt``, decorated at random."""
    from hypothesis import strategies as st  # noqa: F401  (hypothesis is a test dependency)

    text = lambda k: ("word " * rnd.randint(1, 300)) + str(k)  # noqa: E731
    msgs: list[dict[str, Any]] = []
    for n in range(rounds):
        calls = rnd.randint(0, 3)
        if fmt == "openai":
            user: dict[str, Any] = {"role": "user", "content": text(n)}
            if rnd.random() < 0.3:
                user["name"] = f"u{n}"
            msgs.append(user)
            if calls:
                ids = [f"c{n}_{k}" for k in range(calls)]
                msgs.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": i,
                                "type": "function",
                                "function": {"name": "f", "arguments": json.dumps({"k": i})},
                            }
                            for i in ids
                        ],
                    }
                )
                msgs += [{"role": "tool", "tool_call_id": i, "content": text(i)} for i in ids]
            msgs.append({"role": "assistant", "content": text(n), "refusal": None})
        elif fmt == "anthropic":
            block: dict[str, Any] = {"type": "text", "text": text(n)}
            if rnd.random() < 0.3:
                block["cache_control"] = {"type": "ephemeral"}
            msgs.append({"role": "user", "content": [block]})
            content: list[dict[str, Any]] = []
            if rnd.random() < 0.5:
                content.append({"type": "thinking", "thinking": text(n), "signature": "sig"})
            if rnd.random() < 0.3:
                sid = f"srvtoolu_{n}"
                content += [
                    {"type": "server_tool_use", "id": sid, "name": "web_search", "input": {}},
                    {"type": "web_search_tool_result", "tool_use_id": sid, "content": []},
                ]
            ids = [f"toolu_{n}_{k}" for k in range(calls)]
            content += [{"type": "tool_use", "id": i, "name": "f", "input": {"k": i}} for i in ids]
            if not content:
                content.append({"type": "text", "text": text(n)})
            msgs.append({"role": "assistant", "content": content})
            if ids:
                msgs.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": i, "content": text(i)}
                            for i in ids
                        ],
                    }
                )
        else:
            msgs.append({"role": "user", "content": text(n)})
            if rnd.random() < 0.5:
                msgs.append({"type": "reasoning", "id": f"rs_{n}", "summary": []})
            ids = [f"call_{n}_{k}" for k in range(calls)]
            msgs += [
                {"type": "function_call", "call_id": i, "name": "f", "arguments": "{}"} for i in ids
            ]
            msgs += [{"type": "function_call_output", "call_id": i, "output": text(i)} for i in ids]
            msgs.append(
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text(n), "annotations": []}],
                }
            )
    return msgs


def test_round_trip_property_every_shape() -> None:
    import random

    from hypothesis import given, strategies as st

    @given(
        fmt=st.sampled_from(["openai", "anthropic", "responses"]),
        seed=st.integers(0, 10_000),
        rounds=st.integers(1, 14),
        window=st.integers(4_300, 12_000),
        compactor=st.sampled_from(["window_manager", "clear_tool_results"]),
        mid_round=st.booleans(),
    )
    def check(
        fmt: str, seed: int, rounds: int, window: int, compactor: str, mid_round: bool
    ) -> None:
        data = _generated(fmt, random.Random(seed), rounds)
        pristine = copy.deepcopy(data)
        opts: dict[str, Any] = (
            {"counter": "cl100k_base"}
            if compactor == "window_manager"
            else {"trigger_tokens": 1_000, "keep": 1}
        )
        result = compact(
            data,
            compactor=compactor,
            opts=opts,
            window=window if compactor == "window_manager" else None,
            mid_round=mid_round and fmt != "anthropic",
            format=fmt,  # type: ignore[arg-type]
        )
        assert data == pristine
        out = result.messages
        _kept_are_given(data, out)
        SDK_CHECK[fmt].validate_python(out)
        if not result.compacted:
            assert out == data and all(a is b for a, b in zip(out, data, strict=True))
            return
        # every entry of the input is kept (as given or changed) or reported dropped
        entries = len(read(data, fmt).memory)  # type: ignore[arg-type]
        inserted = {"normandy.compaction_marker", "normandy.summary"}
        kept = [e for e in result.memory if not inserted & set(e.metadata)]
        if compactor == "window_manager":
            shortened = len(result.meta.get("shortened", ()))  # kept shortened, reported too
            assert len(kept) + len(result.dropped) - shortened == entries
        else:  # cleared in place: the originals of the changed entries are reported
            assert len(kept) == entries
            assert {e.id for e in result.dropped} <= {e.id for e in kept}
        # and what was dropped is not in the output
        out_ids = {id(m) for m in out}
        assert len(out_ids) == len(out)

    check()


def test_a_chat_message_name_is_counted() -> None:
    from normandy_core import get_counter

    plain = compact([{"role": "user", "content": "hi"}], window=9_000, format="openai")
    named = compact(
        [{"role": "user", "content": "hi", "name": "alice_in_accounting"}],
        window=9_000,
        format="openai",
    )
    counter = get_counter("cl100k_base")
    a = counter.count_entry(plain.memory.entries()[0])
    b = counter.count_entry(named.memory.entries()[0])
    assert b == a + counter.count_text("alice_in_accounting") + 1


def test_a_callers_own_arguments_string_is_what_is_counted() -> None:
    import tiktoken  # noqa: F401  (the counter's tokenizer; never mocked)

    from normandy_core import get_counter

    pretty = json.dumps({"path": "src/a.py", "lines": [1, 2, 3]}, indent=4)
    msgs = [
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": pretty}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    counter = get_counter("cl100k_base")
    result = compact(msgs, window=9_000, format="openai")
    entry = result.memory.entries()[1]
    compact_form = compact(
        [
            msgs[0],
            {
                **msgs[1],
                "tool_calls": [
                    {
                        **msgs[1]["tool_calls"][0],
                        "function": {"name": "read", "arguments": json.dumps(json.loads(pretty))},
                    }
                ],
            },
            msgs[2],
        ],
        window=9_000,
        format="openai",
    ).memory.entries()[1]
    extra = counter.count_text(pretty) - counter.count_text(json.dumps(json.loads(pretty)))
    assert extra > 0
    assert counter.count_entry(entry) == counter.count_entry(compact_form) + extra
    assert result.messages[1] is msgs[1]  # and it is sent as given


def test_a_responses_compaction_item_is_an_entry_of_its_own() -> None:
    """Calls after a compaction item are not pinned with it (campaign seed 23, case 56379:
    window_manager called the calls and their outputs irreducible)."""
    items = [
        {"role": "user", "content": "go"},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA"},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
    ]
    memory = read(items, "responses").memory
    entries = memory.entries()
    assert [e.pinned for e in entries] == [False, True, False, False]
    assert len(entries[1].content) == 1  # the compaction item alone

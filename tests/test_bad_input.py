"""Bad input for ``compact()`` and the command's reader: refused by name, or handled by rule.

Never a traceback, never a silently wrong output: when ``compact()`` succeeds the tool
pairs are intact and every message given is either kept or reported in ``dropped``.
The command line is exercised through the installed script in tests/cli/.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
from anthropic.types import TextBlock
from hypothesis import given, settings, strategies as st
from reliability_counts import FACADE_BAD_CASES, FUZZ_ARBITRARY, FUZZ_BYTES, FUZZ_VALID

from normandy_core import AgentMemory, compact, get_counter, pairing_problems
from normandy_core.app.cli import CliError, main, read_source
from normandy_core.conversation.entries import RedactedThinkingBlock, ThinkingBlock
from normandy_core.testing.strategies import conversations
from normandy_core.transcripts.anthropic import to_anthropic
from normandy_core.transcripts.chat import to_openai
from normandy_core.transcripts.facade import parse_transcript
from normandy_core.transcripts.formats import MAX_NESTING, TranscriptError
from strategies import json_values


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
#: one character of every Unicode plane (0-16), plus NUL, RTL override, ZWJ emoji
PLANES = "".join(chr(p * 0x10000 + 0x4E2D if p == 0 else p * 0x10000 + 0x41) for p in range(17))
ODD_TEXT = f"a\x00b \u202eevil\u202c \U0001f469\u200d\U0001f4bb {PLANES} \ufeff\uffff"


def _dump_with_duplicate_ids() -> dict[str, Any]:
    mem = AgentMemory()
    mem.add_message("user", "one", id="same")
    data = mem.dump()
    data["entries"].append({**data["entries"][0], "content": "two", "parent_id": "same"})
    return data


#: name -> (transcript, keyword arguments, the error's index and field, or None when handled)
BAD: dict[str, tuple[Any, dict[str, Any], tuple[int | None, str | None] | None]] = {
    "unknown role": ([{"role": "robot", "content": "x"}], {}, (0, "role")),
    "unknown block type": (
        [{"role": "user", "content": [{"hologram": True}]}],
        {"format": "anthropic"},
        (0, "content[0].type"),
    ),
    "tool result whose tool use is missing": (
        [{"role": "user", "content": "go"}, {"role": "user", "content": [RESULT]}],
        {"format": "anthropic"},
        (1, "content[0].tool_use_id"),
    ),
    "duplicate tool-use ids": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [USE]},
            {"role": "user", "content": [RESULT]},
            {"role": "assistant", "content": [USE]},
            {"role": "user", "content": [RESULT]},
        ],
        {},
        (3, "content[0].id"),
    ),
    "duplicate message ids (Normandy dump)": (_dump_with_duplicate_ids(), {}, (None, "entries")),
    "10,000 nested arrays in a tool input": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{**USE, "input": {"a": nested(10_000)}}]},
            {"role": "user", "content": [RESULT]},
        ],
        {},
        (1, "content[0].input"),
    ),
    "10,000 nested arrays in OpenAI arguments": (
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "[" * 10_000 + "]" * 10_000},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "x"},
        ],
        {},
        (1, "tool_calls[0].function.arguments"),
    ),
    "lone surrogate in a text": (
        [{"role": "user", "content": "fine \ud800 not fine"}],
        {},
        (0, "content"),
    ),
    "lone surrogate in a tool-input key": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{**USE, "input": {"k\udc00": 1}}]},
            {"role": "user", "content": [RESULT]},
        ],
        {},
        (1, "content[0].input"),
    ),
    "lone surrogate in an SDK block held by a dict message": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [TextBlock(type="text", text="a \ud800 b")]},
        ],
        {},
        (1, "content[0].text"),
    ),
    "NUL, RTL, emoji and every plane": ([{"role": "user", "content": ODD_TEXT}], {}, None),
    "a 6 MB single message": (
        [{"role": "user", "content": "log line 42: ok\n" * 400_000}],
        {},
        None,
    ),
    "empty transcript": ([], {}, None),
}


def test_hand_written_bad_transcripts():
    assert len(BAD) == FACADE_BAD_CASES
    survived = 0
    for name, (data, kwargs, where) in BAD.items():
        if where is None:
            result = compact(data, window=50_000, opts={"counter": "cl100k_base"}, **kwargs)
            if name.startswith("a 6 MB"):
                # documented rule: a message that cannot fit is the error path, input returned
                assert result.error is not None and "cannot fit" in result.error
            else:
                assert result.error is None and not result.compacted
            assert result.messages == data, name  # unchanged, every character kept
            survived += 1
            continue
        with pytest.raises(TranscriptError) as info:
            compact(data, window=50_000, **kwargs)
        assert (info.value.index, info.value.field) == where, (name, str(info.value))
        survived += 1
    assert survived == FACADE_BAD_CASES
    # the odd text also survives a real compaction and the way back to JSON and UTF-8
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {ODD_TEXT} " * 200}
        for i in range(12)
    ]
    # three of these messages do not fit: only the task survives by rule here
    let_go = {"keep_current_request": False}
    result = compact(history, window=6000, opts={"reserved_tokens": 100}, survival=let_go)
    assert result.compacted
    assert result.messages[-1] == history[-1]
    json.dumps(result.messages, ensure_ascii=False).encode("utf-8")
    assert MAX_NESTING == 200  # documented in docs/compact.md and docs/reliability.md


def _content_without_thinking(e: Any) -> Any:
    if isinstance(e.content, str):
        return e.content
    return tuple(b for b in e.content if not isinstance(b, (ThinkingBlock, RedactedThinkingBlock)))


def test_generated_transcripts_lose_nothing_unreported():
    ran = []

    @settings(max_examples=FUZZ_VALID)
    @given(
        conv=conversations(max_turns=3, max_rounds=3, max_result_chars=1500),
        fmt=st.sampled_from(["openai", "anthropic"]),
        ratio=st.sampled_from([0.3, 0.6]),
    )
    def check(conv: Any, fmt: str, ratio: float) -> None:
        ran.append(1)
        if fmt == "openai":
            data: Any = to_openai(conv.memory)
        else:
            system, messages = to_anthropic(conv.memory)
            data = {"system": system, "messages": messages} if system else messages
        _, memory = parse_transcript(data, fmt)  # type: ignore[arg-type]
        counter = get_counter("cl100k_base")
        window = max(300, int(memory.tokens(counter) * ratio) + 150)
        opts = {"reserved_tokens": 50, "counter": "cl100k_base"}
        result = compact(memory, window=window, opts=opts, mid_round=conv.ends_mid_round)
        if not result.compacted:
            assert result.memory is memory
            return
        kept = result.memory.entries()
        assert pairing_problems(kept, allow_pending=True) == []
        dropped = {e.id: e for e in result.dropped}
        originals = {e.id: e for e in memory.entries()}
        for e in kept:
            if e.id in originals and e.id not in dropped:
                # kept as it was (a compaction may only strip thinking blocks)
                assert _content_without_thinking(e) == _content_without_thinking(originals[e.id])
        for eid, orig in originals.items():
            if eid in dropped:
                assert dropped[eid] == orig  # reported with its original content
            else:
                assert eid in {e.id for e in kept}, "an entry vanished without being reported"
        # and it goes back to the format it came in
        out = result.messages
        parse_transcript(out, fmt)  # type: ignore[arg-type]

    check()
    assert len(ran) >= FUZZ_VALID


def test_arbitrary_json_is_a_result_or_a_transcript_error():
    ran = []
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool", "system", "robot"])},
        optional={
            "content": st.one_of(st.text(max_size=20), st.lists(json_values(4), max_size=3)),
            "tool_calls": st.lists(json_values(4), max_size=2),
            "tool_call_id": st.text(max_size=5),
        },
    )
    value = st.one_of(json_values(8), st.lists(message, max_size=4), st.lists(json_values(3)))

    @settings(max_examples=FUZZ_ARBITRARY)
    @given(data=value)
    def check(data: Any) -> None:
        ran.append(1)
        try:
            result = compact(data, window=50_000)
        except TranscriptError as exc:
            refusal = str(exc)
        else:
            refusal = None
        if refusal is not None:
            assert refusal.startswith(("transcript", "message "))
            return
        assert not result.compacted  # tiny input under a large window: returned as given
        assert result.messages == data

    check()
    assert len(ran) >= FUZZ_ARBITRARY


def _bytes() -> st.SearchStrategy[bytes]:
    message = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "tool"]),
            "content": st.one_of(st.text(max_size=30), st.lists(json_values(3), max_size=2)),
        }
    )
    as_jsonl = st.lists(message, min_size=1, max_size=4).map(
        lambda ms: "".join(json.dumps(m) + "\n" for m in ms).encode()
    )
    as_json = st.lists(message, max_size=4).map(lambda ms: json.dumps(ms).encode())
    cut = st.tuples(st.one_of(as_json, as_jsonl), st.integers(0, 200)).map(lambda t: t[0][: t[1]])
    return st.one_of(st.binary(max_size=80), as_json, as_jsonl, cut)


def test_arbitrary_bytes_are_read_or_refused_with_exit_2(capsys):
    ran = []
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)

    @settings(max_examples=FUZZ_BYTES)
    @given(raw=_bytes())
    def check(raw: bytes) -> None:
        ran.append(1)
        with open(path, "wb") as fh:
            fh.write(raw)
        refusal = None
        try:
            read_source(path)
        except CliError as exc:
            refusal = (exc.status, str(exc))
        if refusal is not None:
            assert refusal[0] == 2 and refusal[1].startswith(path)
        code = main(["compact", path, "--window", "50000"])
        err = capsys.readouterr().err
        assert code in (0, 2), err
        assert "internal error" not in err and "Traceback" not in err
        if code == 2:
            assert path in err

    try:
        check()
    finally:
        os.unlink(path)
    assert len(ran) >= FUZZ_BYTES
